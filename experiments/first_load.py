"""How long the memory system takes to serve a kernel's first loads, with nothing else running.

Every CTA of the GEMM waits 5-8K cycles for its first data at the kernel's start
(docs/lab_notebook.md, "Where the first tile goes"). This measures that floor on its own: a
kernel of 132 CTAs x 128 threads whose threads each issue all their 16-byte cp.async copies
into shared memory at once (4, 50 or 200 KiB per CTA, from inputs rotated so they do not sit
in L2, or from one L2-warm buffer), wait for all of them, and after a CTA barrier thread 0
stamps %clock64 and %globaltimer. It prints, per size and mode, medians over launches of the median
and the slowest CTA's start-to-data time.

    python experiments/first_load.py build --out .first_load        # CPU, with the DSL
    PYTHONPATH=. python experiments/first_load.py run --dir .first_load   # GPU machine, no cutlass
"""


import os
import statistics
import sys
import tempfile
from pathlib import Path

import click
from probe_cubins import ProbeRunner, read_probes, write_probes  # the script's directory

CTAS, THREADS = 132, 128
# 16-byte loads per thread: 4 KiB, 50 KiB (about one weight stage plus one A slot per CTA, as
# the GEMM's first step needs) and 200 KiB (about what the GEMM's CTAs request at once).
VECS = (2, 25, 100)
STAMPS = 4  # per CTA: clock at start, clock after the loads, globaltimer at both


def cta_bytes(vecs: int) -> int:
    """Bytes one CTA loads (and holds in shared memory) with `vecs` copies per thread."""
    return vecs * THREADS * 16


def _compile(vecs: int) -> tuple[bytes, str, int]:
    """Cubin, kernel symbol and dynamic shared memory of the first-load kernel for `vecs`
    loads per thread."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import cutlass
    from cutlass import Int64, Uint8, Uint32, cute

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels.sm90.ptx import cp_async_cg_16, stamp_clock, stamp_globaltimer

    class FirstLoad:
        @cute.jit
        def __call__(self, src: cute.Pointer, out: cute.Pointer) -> None:
            self.kernel(src, out).launch(grid=(CTAS, 1, 1), block=(THREADS, 1, 1),
                                         smem=cta_bytes(vecs))

        @cute.kernel
        def kernel(self, src: cute.Pointer, out: cute.Pointer) -> None:
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            record = out.toint() + Int64(bidx) * (STAMPS * 8)
            first = Uint32(tidx == 0)
            stamp_clock(record, first)
            stamp_globaltimer(record + 16, first)
            base = src.toint() + Int64(bidx) * cta_bytes(vecs) + Int64(tidx) * 16
            # Every copy issued before one wait for all of them: one round trip, not several
            # (register loads let ptxas consume, and so wait for, the first ones between later
            # issues). cp.async into shared memory, as the GEMM's TMA loads land there.
            smem = cute.arch.get_dyn_smem(Uint8, alignment=128).toint() + tidx * 16
            for i in range(vecs):
                cp_async_cg_16(smem + i * THREADS * 16, base + i * THREADS * 16)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            stamp_clock(record + 8, first)
            stamp_globaltimer(record + 24, first)

    ptr = cute.runtime.make_ptr(cutlass.Int64, 16, cute.AddressSpace.gmem, assumed_align=16)
    with tempfile.TemporaryDirectory() as dump:
        compiled = cute.compile(FirstLoad(), ptr, ptr,
                                options=f"--gpu-arch sm_90a --keep-cubin --dump-dir {dump}")
        symbols = list(compiled.kernel_info)
        return compiled.__cubin__, symbols[0], cta_bytes(vecs)


@click.group()
def cli() -> None:
    """Build (CPU) or run (GPU) the first-load measurement."""


@cli.command()
@click.option("--out", type=click.Path(file_okay=False), default=".first_load", show_default=True)
def build(out: str) -> None:
    """Compile one kernel per load count into OUT, with an index of their symbols."""
    write_probes(out, "first_load", VECS, _compile, lambda vecs: f"{cta_bytes(vecs)} bytes per CTA")


@cli.command()
@click.option("--dir", "src_dir", type=click.Path(exists=True, file_okay=False),
              default=".first_load", show_default=True)
@click.option("--launches", default=40, show_default=True)
@click.option("--rotate-mib", default=512, show_default=True,
              help="bytes of input buffers cycled through in the cold mode (L2 is 50 MiB)")
def run(src_dir: str, launches: int, rotate_mib: int) -> None:
    """Launch each kernel alone (synchronized), cold and L2-warm, and print the table."""
    import torch

    runner = ProbeRunner(CTAS, STAMPS)
    rows = []
    for _, image, symbol, smem in read_probes(src_dir):
        function = runner.function(image, symbol, smem)
        per_call = CTAS * smem
        rotate = max(2, -(-rotate_mib * 2**20 // per_call))
        buffers = [torch.zeros(per_call, dtype=torch.uint8, device="cuda")
                   for _ in range(rotate)]
        for mode in ("cold", "warm"):
            medians, slowest, ns_medians, rates = [], [], [], []
            for i in range(launches + 2):
                src = buffers[i % rotate] if mode == "cold" else buffers[0]
                stamps = runner.launch(function, THREADS, smem,
                                       (src.data_ptr(), runner.out.data_ptr()))
                if i < 2:
                    continue  # the first launches also pay the module's load
                cycles = sorted(s[1] - s[0] for s in stamps)
                ns = sorted(s[3] - s[2] for s in stamps)
                medians.append(cycles[CTAS // 2])
                slowest.append(cycles[-1])
                ns_medians.append(ns[CTAS // 2])
                rates.append(sum(s[1] - s[0] for s in stamps) / max(1, sum(ns)))
            rows.append((smem, mode, statistics.median(medians),
                         statistics.median(slowest), statistics.median(ns_medians),
                         statistics.median(rates)))
        del buffers
    runner.close()
    print(f"{runner.device_name}, {CTAS} CTAs x {THREADS} threads, medians over "
          f"{launches} launches")
    print(f"{'bytes/CTA':>9} {'mode':>5} {'median CTA cyc':>14} {'slowest CTA cyc':>15} "
          f"{'median CTA ns':>13} {'GHz':>5}")
    for b, mode, med, slow, ns, rate in rows:
        print(f"{b:>9} {mode:>5} {med:>14.0f} {slow:>15.0f} {ns:>13.0f} {rate:>5.2f}")


if __name__ == "__main__":
    cli()
