"""Can shared-memory-sourced wgmma keep the tensor pipe busy while the CTA also converts weights
into shared memory? The premise of a redesign with the tokens as the wgmma M, measured alone.

This kernel (issue 4) feeds the dequantized weights to wgmma from registers, with the tokens as
the wgmma N; its bound is 1.46x cuBLAS (docs/lab_notebook.md, fourteenth session). A kernel with the
tokens as the wgmma M (64-row blocks, one per warpgroup) would pad fewer rows, but every
warpgroup would read the weights from shared memory (the B operand), after the CTA wrote them
there in bf16 each step. Whether shared memory then keeps up was an estimate (120-150 bytes
per cycle against 128). This measures it: W consumer warpgroups, each with its own 64 x 64 A
tile, all reading one N x 64 B tile, run S steps of 4 wgmma m64nNk16 (both operands in shared
memory, data left as zeros: no TMA), and per step and thread optionally store V 16-byte vectors
to shared memory and load V/2 (the converted weights written, the packed ones read), run a few
integer ops on the loads (the conversion's ALU work) and meet at a named barrier among the
consumers (the step's hand-over of B). Thread 0 stamps %clock64 around the loop; the MMA time of
a step is W * 4 * N / 2 cycles (4096 dense FLOP per cycle per SM).

    python experiments/smem_mma.py build --out .smem_mma              # CPU, with the DSL
    PYTHONPATH=. python experiments/smem_mma.py run --dir .smem_mma   # GPU machine, no cutlass
"""

import os
import statistics
import sys
import tempfile
from pathlib import Path

import click
from probe_cubins import ProbeRunner, read_probes, write_probes  # the script's directory

CTAS = 132
STEPS = 256
STAMPS = 2
# (warpgroups W, N, 16-byte stores per thread per step, integer ops per thread per step, a named
# barrier per step). Stores of the converted weights: N x 64 bf16 per step over W * 128 threads.
VARIANTS = (
    (4, 128, 0, 0, False),   # 4 warpgroups sharing B, nothing else: SS wgmma alone
    (4, 128, 0, 0, True),    # + the per-step barrier
    (4, 128, 2, 48, True),   # + the converted weights stored (16 KiB), 4 KiB read, ALU work
    (4, 128, 6, 48, True),   # + 32 KiB more stores per step (as the TMA's fp16 A tiles)
    (2, 256, 0, 0, False),   # 2 warpgroups at N 256
    (2, 256, 8, 96, True),   # + its converted weights (32 KiB) and ALU work
    (2, 128, 4, 96, True),   # 2 warpgroups at N 128 with their conversion
    (1, 128, 8, 192, True),  # one active warpgroup: a 64-row group's tile
)


def mma_cycles(w: int, n: int) -> int:
    """Tensor-pipe cycles of one step's 4 wgmma m64nNk16 per warpgroup at 4096 FLOP/cycle."""
    return w * 4 * (64 * n * 16 * 2) // 4096


def describe(i: int) -> str:
    w, n, stores, alu, sync = VARIANTS[i]
    return (f"{w} warpgroups, N {n}, {stores * 16 * w * 128 // 1024} KiB stored per step, "
            f"{alu} ALU ops, barrier {sync}")


def _compile(i: int) -> tuple[bytes, str, int]:
    """Cubin, kernel symbol and dynamic shared memory (the operands' and scratch struct) of
    variant i."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import cutlass
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass import Float16, Float32, Int64, Uint8, Uint32, cute, pipeline
    from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
    from cutlass.tensor_utils import LayoutEnum

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels.sm90.ptx import (
        ld_shared_v4,
        mad_lo_imm,
        st_relaxed_gpu_u32,
        st_shared_v4,
        stamp_clock,
    )

    w, n, stores, alu, sync = VARIANTS[i]
    threads = w * 128
    loads = stores // 2
    scratch = max(stores, 1) * threads * 16

    def layouts() -> tuple:
        """The operands' 128B-swizzled K-major tiles: A (W * 64, 64), B (N, 64); in a jit."""
        return (sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (w * 64, n, 64), Float16, 1),
                sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (w * 64, n, 64), Float16, 1))

    class SmemMma:
        @cute.jit
        def __call__(self, out: cute.Pointer, sink: cute.Pointer) -> None:
            layout_a, layout_b = layouts()
            fields = {
                "a": cute.struct.Align[cute.struct.MemRange[Float16, cute.cosize(layout_a)],
                                       1024],
                "b": cute.struct.Align[cute.struct.MemRange[Float16, cute.cosize(layout_b)],
                                       1024],
                "scratch": cute.struct.Align[cute.struct.MemRange[Uint8, scratch], 1024],
            }
            self.storage_type = cute.struct(
                type("SmemMmaStorage", (), {"__annotations__": fields}))
            self.kernel(out, sink).launch(grid=(CTAS, 1, 1), block=(threads, 1, 1),
                                          smem=self.storage_type.size_in_bytes())

        @cute.kernel
        def kernel(self, out: cute.Pointer, sink: cute.Pointer) -> None:
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            storage = cutlass.utils.SmemAllocator().allocate(self.storage_type)
            layout_a, layout_b = layouts()
            s_a = storage.a.get_tensor(layout_a.outer, swizzle=layout_a.inner)
            s_b = storage.b.get_tensor(layout_b.outer, swizzle=layout_b.inner)
            # Zeros in both operands (finite values; the timing does not depend on them).
            base_a = storage.a.data_ptr().toint()
            base_b = storage.b.data_ptr().toint()
            for j in cutlass.range_constexpr(w * 64 * 64 * 2 // (threads * 16)):
                st_shared_v4(base_a + (j * threads + tidx) * 16, 0, 0, 0, 0)
            for j in cutlass.range_constexpr(n * 64 * 2 // (threads * 16)):
                st_shared_v4(base_b + (j * threads + tidx) * 16, 0, 0, 0, 0)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier()
            tiled_mma = sm90_utils.make_trivial_tiled_mma(
                Float16, Float16, OperandMajorMode.K, OperandMajorMode.K, Float32, (w, 1, 1),
                tiler_mn=(64, n))
            thr_mma = tiled_mma.get_slice(tidx)
            frag_a = tiled_mma.make_fragment_A(thr_mma.partition_A(s_a))
            frag_b = tiled_mma.make_fragment_B(thr_mma.partition_B(s_b))
            acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((w * 64, n)), Float32)
            acc.fill(0.0)
            kblocks = cute.size(frag_a, mode=[2])
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            scratch_base = storage.scratch.data_ptr().toint() + tidx * 16
            step_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=threads)
            x = Uint32(tidx) * Uint32(2654435761) + Uint32(bidx)
            record = out.toint() + Int64(bidx) * (STAMPS * 8)
            first = Uint32(tidx == 0)
            stamp_clock(record, first)
            for _ in cutlass.range(STEPS, unroll=1):
                if cutlass.const_expr(stores > 0):
                    # Four independent chains, as the conversion's four words per 32 K.
                    c0, c1, c2, c3 = x, x + Uint32(1), x + Uint32(2), x + Uint32(3)
                    for j in cutlass.range_constexpr(loads):
                        v = ld_shared_v4(scratch_base + j * threads * 16)
                        c0, c1, c2, c3 = c0 ^ v[0], c1 ^ v[1], c2 ^ v[2], c3 ^ v[3]
                    for j in cutlass.range_constexpr(alu // 4):
                        c0 = mad_lo_imm(c0, x, 1000003 + 4 * j)
                        c1 = mad_lo_imm(c1, x, 1000004 + 4 * j)
                        c2 = mad_lo_imm(c2, x, 1000005 + 4 * j)
                        c3 = mad_lo_imm(c3, x, 1000006 + 4 * j)
                    for j in cutlass.range_constexpr(stores):
                        st_shared_v4(scratch_base + j * threads * 16, c0, c1, c2, c3)
                    x = c0 ^ c1 ^ c2 ^ c3
                if cutlass.const_expr(sync):
                    cute.arch.fence_proxy("async.shared", space="cta")
                    step_barrier.arrive_and_wait()
                warpgroup.fence()
                for kb in cutlass.range_constexpr(kblocks):
                    cute.gemm(tiled_mma, acc, frag_a[None, None, kb, 0], frag_b[None, None, kb, 0],
                              acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
            warpgroup.wait_group(0)
            stamp_clock(record + 8, first)
            # Keep the accumulator and the ALU chain alive.
            st_relaxed_gpu_u32(sink.toint() + Int64(bidx * threads + tidx) * 4,
                               x ^ Uint32(cutlass.Int32(acc[0] != acc[1])))

    ptr = cute.runtime.make_ptr(cutlass.Int64, 16, cute.AddressSpace.gmem, assumed_align=16)
    probe = SmemMma()
    with tempfile.TemporaryDirectory() as dump:
        compiled = cute.compile(probe, ptr, ptr,
                                options=f"--gpu-arch sm_90a --keep-cubin --dump-dir {dump}")
        # The struct __call__ launched with, laid out while compiling.
        return (compiled.__cubin__, next(iter(compiled.kernel_info)),
                probe.storage_type.size_in_bytes())


@click.group()
def cli() -> None:
    """Build (CPU) or run (GPU) the shared-memory wgmma measurement."""


@cli.command()
@click.option("--out", type=click.Path(file_okay=False), default=".smem_mma", show_default=True)
def build(out: str) -> None:
    """Compile one kernel per variant into OUT, with an index of their symbols."""
    write_probes(out, "smem_mma", range(len(VARIANTS)), _compile, describe)


@cli.command()
@click.option("--dir", "src_dir", type=click.Path(exists=True, file_okay=False),
              default=".smem_mma", show_default=True)
@click.option("--launches", default=20, show_default=True)
def run(src_dir: str, launches: int) -> None:
    """Launch each variant (synchronized) and print cycles per step against the MMA's."""
    runner = ProbeRunner(CTAS, STAMPS, sink_words=CTAS * 512)
    pointers = (runner.out.data_ptr(), runner.sink.data_ptr())
    print(f"{runner.device_name}, {CTAS} CTAs, {STEPS} steps, medians over "
          f"{launches} launches (cycles per step, median CTA)")
    print(f"{'variant':72s} {'step':>6s} {'MMA':>5s} {'MMA/step':>8s}")
    for i, image, symbol, smem in read_probes(src_dir):
        w, n = VARIANTS[i][:2]
        function = runner.function(image, symbol, smem)
        per_step = []
        for launch in range(launches + 2):
            stamps = runner.launch(function, w * 128, smem, pointers)
            if launch >= 2:  # the first launches also pay the module's load
                per_step.append(sorted(s[1] - s[0] for s in stamps)[CTAS // 2] / STEPS)
        step = statistics.median(per_step)
        mma = mma_cycles(w, n)
        print(f"{describe(i):72s} {step:6.0f} {mma:5d} {mma / step:8.2f}")
    runner.close()


if __name__ == "__main__":
    cli()
