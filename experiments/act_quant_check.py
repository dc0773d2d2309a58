"""On the H200: experiments/act_quant.py's kernels against runtime.activations' quantize_experts
and quantize_masked, bit for bit, then the experts path timed in CUDA graphs. No cutlass here:
the cubins are loaded with cuda.bindings (build them on the CPU machine first and carry the
directory).

    CUTE_DSL_ARCH=sm_90a python experiments/act_quant.py --out .act_quant      # CPU machine
    PYTHONPATH=. python experiments/act_quant_check.py --cubin-dir .act_quant  # H200

Cases: bf16 tokens of several magnitudes, the edge blocks of tests/test_act_quant_experiment.py
(ties, near-ties, saturation, zeros, subnormals, NaN and inf; one expert per block), skewed
routings with empty experts and rows past offs[-1], E = 1..256, K = 16..7168. Prints one line per
case and a table of us per call last (the kernel's path: four E-sized torch ops for its tables,
a memset of sfa and the kernel; the torch path: quantize_experts).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench", ROOT / "tests"):
    sys.path.insert(0, str(p))

from cuda.bindings import driver

from runtime.activations import quantize_experts, quantize_masked
from runtime.cuda import check
from runtime.formats import blocked_scale_numel, scale_cols
from runtime.serving import sfa_rows_needed


class ActQuantKernels:
    """Both kernels of act_quant.json, loaded with cuda.bindings, launched on torch's stream."""

    def __init__(self, cubin_dir: Path) -> None:
        record = json.loads((cubin_dir / "act_quant.json").read_text())
        self.block = record["block"][0]
        self.max_experts = record["max_experts"]
        self.smem = {name: k["smem"] for name, k in record["kernels"].items()}
        torch.zeros(1, device="cuda")  # the primary context, current on this thread
        self.functions = {}
        for name, k in record["kernels"].items():
            module = check(driver.cuModuleLoadData((cubin_dir / k["cubin"]).read_bytes()),
                           "cuModuleLoadData")
            self.functions[name] = check(driver.cuModuleGetFunction(module, k["symbol"].encode()),
                                         "cuModuleGetFunction")

    def _launch(self, name: str, pointers: tuple, ints: tuple, blocks: int) -> None:
        if not blocks:
            return
        # The kernels index blocks, and the experts layout its scale bytes, in Int32; they
        # load x in 16-byte and store a in 8-byte vectors (review of 2026-12-05).
        sfa = pointers[-1]
        if blocks + 256 >= 2 ** 31 or sfa.numel() >= 2 ** 31:
            raise ValueError(f"{blocks} blocks / {sfa.numel()} scale bytes: past Int32")
        x, a = pointers[0], pointers[-2]
        if not (x.is_contiguous() and x.data_ptr() % 16 == 0 and a.data_ptr() % 8 == 0):
            raise ValueError("x must be contiguous and 16-byte aligned, a 8-byte aligned")
        values = [ctypes.c_uint64(p.data_ptr()) for p in pointers]
        values += [ctypes.c_int32(v) for v in ints]
        params = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        check(driver.cuLaunchKernel(self.functions[name], -(-blocks // self.block), 1, 1,
                                    self.block, 1, 1, self.smem[name],
                                    torch.cuda.current_stream().cuda_stream,
                                    ctypes.addressof(params), 0), "cuLaunchKernel")

    def experts(self, x: torch.Tensor, offs: torch.Tensor,
                scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """quantize_experts through the kernel (it derives its expert tables from offs): the
        outputs allocated (sfa zeroed), then launch_experts."""
        t, k = x.shape
        a = torch.empty(t, k // 2, dtype=torch.uint8, device=x.device)
        sfa = torch.zeros(sfa_rows_needed(t, offs.numel()) * scale_cols(k), dtype=torch.uint8,
                          device=x.device)
        self.launch_experts(x, offs, scales, a, sfa)
        return a, sfa.view(torch.float8_e4m3fn)

    def launch_experts(self, x: torch.Tensor, offs: torch.Tensor, scales: torch.Tensor,
                       a: torch.Tensor, sfa: torch.Tensor) -> None:
        """The experts kernel alone, into a and a zeroed sfa."""
        t, k = x.shape
        experts = offs.numel()
        if experts > self.max_experts:
            raise ValueError(f"{experts} experts: the kernel's tables hold {self.max_experts}")
        blocks = t * k // 16
        self._launch("experts", (x, offs, scales, a, sfa), (t, k, experts, blocks), blocks)

    def masked(self, x: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """quantize_masked through the kernel."""
        experts, max_m, k = x.shape
        a = torch.empty(experts, max_m, k // 2, dtype=torch.uint8, device=x.device)
        sfa = torch.zeros(experts, blocked_scale_numel(max_m, k), dtype=torch.uint8,
                          device=x.device)
        blocks = experts * max_m * k // 16
        self._launch("masked", (x, scales, a, sfa), (max_m, k, experts, blocks), blocks)
        return a, sfa.view(torch.float8_e4m3fn)


def cases():
    """(name, x bf16 (T, K), offs int32 (E,), decode scales float32 (E,)) on the GPU."""
    from test_act_quant_experiment import edge_blocks

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
    from test_act_quant_experiment import edge_blocks

    gen = torch.Generator().manual_seed(6)
    for experts, max_m, k in ((1, 1, 16), (8, 48, 2048), (32, 129, 7168), (256, 16, 768)):
        scales = (torch.rand(experts, generator=gen) * 0.05 + 1e-4).float()
        x = (torch.randn(experts, max_m, k, generator=gen) * 3).to(torch.bfloat16)
        yield f"masked E{experts} max_m {max_m} K{k}", x, scales
    blocks, gs = edge_blocks(3)  # one expert of one row per block
    yield "masked edge blocks", blocks.view(-1, 1, 16), gs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cubin-dir", type=Path, default=ROOT / ".act_quant")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    kernels = ActQuantKernels(args.cubin_dir)
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
        # The kernel alone, its outputs made beforehand: the path is it and sfa's memset.
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
