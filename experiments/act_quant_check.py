"""On the H200: the artifacts' activation quantizers (kernels/sm90/act_quant.py, launched by
runtime/quantize.py as gg.quantize_experts / gg.quantize_masked) against runtime.activations'
torch path, bit for bit, then the experts path timed in CUDA graphs. No cutlass here: build the
artifacts on the CPU machine and carry them.

    PYTHONPATH=. python experiments/act_quant_check.py --artifacts artifacts  # H200

Cases: bf16 tokens of several magnitudes, the edge blocks of tests/test_act_quant_kernel.py
(ties, near-ties, saturation, zeros, subnormals, NaN and inf; one expert per block), skewed
routings with empty experts and rows past offs[-1], E = 1..1024, K = 16..7168, bad offs. Prints
one line per case and a table of us per call last (the kernel alone; the kernel's path: the
allocations, sfa's memset and the kernel; the torch path: runtime.activations).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench", ROOT / "tests"):
    sys.path.insert(0, str(p))

import runtime
from runtime.activations import quantize_experts, quantize_masked
from runtime.quantize import _launch, quantizer_for


class ActQuantKernels:
    """The artifacts' quantizers, through the runtime; each call must take the kernel."""

    def __init__(self, artifacts: Path) -> None:
        self.gg = runtime.load(artifacts)

    def _require(self, layout: str, x: torch.Tensor, experts: int):
        q = quantizer_for(self.gg, layout, x, experts)
        if q is None:
            raise SystemExit(f"error: no {layout} quantizer serves x {tuple(x.shape)} with "
                             f"{experts} experts in these artifacts")
        return q

    def experts(self, x: torch.Tensor, offs: torch.Tensor,
                scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._require("experts", x, offs.numel())
        return self.gg.quantize_experts(x, offs, scales)

    def launch_experts(self, x: torch.Tensor, offs: torch.Tensor, scales: torch.Tensor,
                       a: torch.Tensor, sfa: torch.Tensor) -> None:
        """The experts kernel alone, into a and sfa (no allocation)."""
        t, k = x.shape
        q = self._require("experts", x, offs.numel())
        _launch(self.gg, q, x, {"x": x, "offs": offs, "scales": scales, "a": a, "sfa": sfa,
                                "rows": t, "k": k, "experts": offs.numel()})

    def masked(self, x: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._require("masked", x, x.shape[0])
        return self.gg.quantize_masked(x, scales)


def cases():
    """(name, x bf16 (T, K), offs int32 (E,), decode scales float32 (E,)) on the GPU."""
    from test_act_quant_kernel import edge_blocks

    gen = torch.Generator().manual_seed(5)
    for experts, k, tokens, skew in ((1, 16, 37, 0), (8, 48, 300, 0), (128, 2048, 512, 1),
                                     (256, 7168, 64, 1), (32, 2048, 4096, 0), (128, 768, 1, 0),
                                     (1000, 64, 3000, 1), (1024, 32, 20000, 0)):
        t = tokens
        counts = torch.multinomial(torch.ones(experts) if not skew else
                                   torch.arange(experts, 0, -1).float() ** 3, t,
                                   replacement=True, generator=gen).bincount(minlength=experts)
        counts[::7] = 0
        offs = counts.cumsum(0).to(torch.int32)
        t = int(offs[-1]) + 5  # rows past offs[-1]
        scales = (torch.rand(experts, generator=gen) * 0.05 + 1e-4).float()
        for mag in (1e-3, 1.0, 1e3):
            x = (torch.randn(t, k, generator=gen) * mag).to(torch.bfloat16)
            yield f"E{experts} K{k} T{t} x~{mag:g}", x, offs, scales
    for seed in range(3):
        # The CPU test's edge blocks (ties, near-ties, NaN, inf, ...) with each block's own
        # decode scale: K = 16, one row and one expert per block.
        # At most MAX_EXPERTS (1024) experts per call: 1024 rows at a time.
        blocks, gs = edge_blocks(seed)
        for i in range(0, len(blocks), 1024):
            part = blocks[i:i + 1024]
            offs = torch.arange(1, len(part) + 1, dtype=torch.int32)
            yield f"edge blocks, seed {seed}, rows {i}+", part, offs, gs[i:i + 1024]
    yield "decreasing offs past T", torch.randn(64, 32).bfloat16(), torch.tensor(
        [10, 5, 900, 3], dtype=torch.int32), torch.full((4,), 0.01)
    # Bad offs across the table scan's thread boundaries (4 experts per thread): negative,
    # decreasing and past-T ends, clamped and made non-decreasing as runtime.activations does.
    bad = torch.randint(-50, 700, (777,), generator=gen, dtype=torch.int32)
    yield "random offs (E 777, T 600)", torch.randn(600, 48).bfloat16(), bad, torch.full(
        (777,), 0.02)


def masked_cases():
    """(name, x bf16 (E, max_m, K), decode scales (E,)) on the CPU."""
    from test_act_quant_kernel import edge_blocks

    gen = torch.Generator().manual_seed(6)
    for experts, max_m, k in ((1, 1, 16), (8, 48, 2048), (32, 129, 7168), (256, 16, 768)):
        scales = (torch.rand(experts, generator=gen) * 0.05 + 1e-4).float()
        x = (torch.randn(experts, max_m, k, generator=gen) * 3).to(torch.bfloat16)
        yield f"masked E{experts} max_m {max_m} K{k}", x, scales
    blocks, gs = edge_blocks(3)  # one expert of one row per block
    yield "masked edge blocks", blocks.view(-1, 1, 16), gs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    kernels = ActQuantKernels(args.artifacts)
    failed = 0

    def compare(name: str, got: tuple, want: tuple) -> int:
        torch.cuda.synchronize()
        bad = [int((g.view(torch.uint8) != w.view(torch.uint8)).sum()) for g, w in zip(got, want)]
        print(f"{'ok ' if not any(bad) else 'BAD'} {name}: differing code bytes {bad[0]}, "
              f"scale bytes {bad[1]}")
        return int(any(bad))

    for name, x, offs, sc in cases():
        x, offs, sc = x.cuda(), offs.cuda(), sc.cuda()
        failed += compare(name, kernels.experts(x, offs, sc), quantize_experts(x, offs, sc))
    for name, x, sc in masked_cases():
        x, sc = x.cuda(), sc.cuda()
        failed += compare(name, kernels.masked(x, sc), quantize_masked(x, sc))
    from bench_grouped import capture, measure_ceilings, time_graphs

    _, copy_gbs = measure_ceilings()

    rows = []
    for experts, k, t in ((128, 2048, 512), (128, 768, 512), (256, 7168, 512),
                          (128, 2048, 4096), (256, 7168, 32768)):
        x = torch.randn(t, k, device="cuda").to(torch.bfloat16)
        offs = torch.linspace(t / experts, t, experts, device="cuda").to(torch.int32)
        scales = torch.full((experts,), 0.01, device="cuda")
        ours = time_graphs([capture(lambda: kernels.experts(x, offs, scales))], args.reps)
        torch_path = time_graphs([capture(lambda: quantize_experts(x, offs, scales))], args.reps)
        # The kernel alone, its outputs made beforehand: the path adds their allocation.
        a, sfa = kernels.experts(x, offs, scales)
        alone = time_graphs([capture(lambda: kernels.launch_experts(x, offs, scales, a, sfa))],
                            args.reps)
        moved = t * k * 2 + t * k // 2 + sfa.numel()
        rows.append(f"| {experts} | {k} | {t} | {alone:.1f} | {ours:.1f} | {torch_path:.1f} | "
                    f"{moved / copy_gbs / 1e3:.2f} |")
    print("| E | K | T | kernel alone us | kernel path us | torch path us | bytes floor us |\n"
          "|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"== act_quant: {'all exact' if not failed else f'{failed} cases differ'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
