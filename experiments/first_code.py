"""What running cold code costs at a kernel's start (instruction fetch), with nothing else running.

The GEMM's first steps run 60 KB of SASS that no SM has fetched yet, and every link of its
first tile took longer than the same work measured alone (docs/lab_notebook.md, "Where the first
tile goes"). This measures the instruction side on its own: a kernel of 132 CTAs x 128 threads
runs one straight-line block of N independent IMADs (8 accumulators, 16 bytes of SASS each)
twice; thread 0 stamps %clock64 before the first pass and after each pass. The first pass
fetches the block cold, the second runs it from the SM's instruction cache, so their
difference is the fetch cost of N * 16 bytes of fresh code.

Three modes per size: `fresh` loads a new copy of the module before each launch (new code
addresses: nothing cached anywhere) and flushes L2 with a 256 MiB fill; `flush` relaunches the
same module after the fill; `repeat` relaunches it back to back.

    python experiments/first_code.py build --out .first_code             # CPU, with the DSL
    PYTHONPATH=. python experiments/first_code.py run --dir .first_code  # GPU, no cutlass
"""


import os
import statistics
import sys
import tempfile
from pathlib import Path

import click
from probe_cubins import ProbeRunner, read_probes, write_probes  # the script's directory

CTAS, THREADS = 132, 128
ACCUMULATORS = 8
# IMADs per pass: 8, 32 and 64 KiB of SASS (the GEMM's whole kernel is about 60 KB).
SIZES = (512, 2048, 4096)
STAMPS = 3  # per CTA: clock before pass 1, after pass 1, after pass 2
FLUSH_MIB = 256  # L2 is 50 MiB


def _compile(n: int) -> tuple[bytes, str, int]:
    """Cubin, kernel symbol and dynamic shared memory (none) of the cold-code kernel with `n`
    IMADs per pass."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import cutlass
    from cutlass import Int64, Uint32, cute

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels.sm90.ptx import mad_lo_imm as mad
    from kernels.sm90.ptx import st_relaxed_gpu_u32, stamp_clock

    class FirstCode:
        @cute.jit
        def __call__(self, out: cute.Pointer, sink: cute.Pointer) -> None:
            self.kernel(out, sink).launch(grid=(CTAS, 1, 1), block=(THREADS, 1, 1))

        @cute.kernel
        def kernel(self, out: cute.Pointer, sink: cute.Pointer) -> None:
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            record = out.toint() + Int64(bidx) * (STAMPS * 8)
            first = Uint32(tidx == 0)
            x = Uint32(tidx) * Uint32(2654435761) + Uint32(bidx)
            a0, a1, a2, a3 = x + Uint32(0), x + Uint32(1), x + Uint32(2), x + Uint32(3)
            a4, a5, a6, a7 = x + Uint32(4), x + Uint32(5), x + Uint32(6), x + Uint32(7)
            stamp_clock(record, first)
            for it in cutlass.range(2, unroll=1):  # one block of code, run twice
                for i in cutlass.range_constexpr(n // ACCUMULATORS):
                    imm = 1000003 + ACCUMULATORS * i
                    a0 = mad(a0, x, imm)
                    a1 = mad(a1, x, imm + 1)
                    a2 = mad(a2, x, imm + 2)
                    a3 = mad(a3, x, imm + 3)
                    a4 = mad(a4, x, imm + 4)
                    a5 = mad(a5, x, imm + 5)
                    a6 = mad(a6, x, imm + 6)
                    a7 = mad(a7, x, imm + 7)
                stamp_clock(record + 8 + Int64(it) * 8, first)
            # Every thread keeps its result, so no IMAD is dead code.
            st_relaxed_gpu_u32(sink.toint() + Int64(bidx * THREADS + tidx) * 4,
                               a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7)

    ptr = cute.runtime.make_ptr(cutlass.Int64, 16, cute.AddressSpace.gmem, assumed_align=16)
    with tempfile.TemporaryDirectory() as dump:
        compiled = cute.compile(FirstCode(), ptr, ptr,
                                options=f"--gpu-arch sm_90a --keep-cubin --dump-dir {dump}")
        return compiled.__cubin__, next(iter(compiled.kernel_info)), 0


@click.group()
def cli() -> None:
    """Build (CPU) or run (GPU) the cold-code measurement."""


@cli.command()
@click.option("--out", type=click.Path(file_okay=False), default=".first_code", show_default=True)
def build(out: str) -> None:
    """Compile one kernel per block size into OUT, with an index of their symbols."""
    write_probes(out, "first_code", SIZES, _compile, lambda n: f"{n} IMADs per pass")


@cli.command()
@click.option("--dir", "src_dir", type=click.Path(exists=True, file_okay=False),
              default=".first_code", show_default=True)
@click.option("--launches", default=30, show_default=True)
def run(src_dir: str, launches: int) -> None:
    """Launch each kernel alone (synchronized) in the three modes and print the table."""
    import torch

    runner = ProbeRunner(CTAS, STAMPS, sink_words=CTAS * THREADS)
    flush = torch.empty(FLUSH_MIB * 2**20, dtype=torch.uint8, device="cuda")
    pointers = (runner.out.data_ptr(), runner.sink.data_ptr())
    rows = []
    for n, image, symbol, _ in read_probes(src_dir):
        function = runner.function(image, symbol)
        for mode in ("fresh", "flush", "repeat"):
            first, second, slowest = [], [], []
            for i in range(launches + 2):
                if mode == "fresh":  # a new copy of the module: new code addresses
                    function = runner.function(image, symbol)
                if mode != "repeat":
                    flush.fill_(i & 255)
                stamps = runner.launch(function, THREADS, 0, pointers)
                if i < 2:
                    continue  # the first launches also pay the module's load
                p1 = sorted(s[1] - s[0] for s in stamps)
                p2 = sorted(s[2] - s[1] for s in stamps)
                first.append(p1[CTAS // 2])
                second.append(p2[CTAS // 2])
                slowest.append(p1[-1])
            rows.append((n, mode, statistics.median(first), statistics.median(second),
                         statistics.median(slowest)))
        runner.close()
    print(f"{runner.device_name}, {CTAS} CTAs x {THREADS} threads, medians over "
          f"{launches} launches (cycles)")
    print(f"{'IMADs':>6} {'KiB':>4} {'mode':>6} {'pass 1':>7} {'pass 2':>7} {'1 - 2':>6} "
          f"{'slowest pass 1':>14}")
    for n, mode, p1, p2, slow in rows:
        print(f"{n:>6} {n * 16 // 1024:>4} {mode:>6} {p1:>7.0f} {p2:>7.0f} {p1 - p2:>6.0f} "
              f"{slow:>14.0f}")


if __name__ == "__main__":
    cli()
