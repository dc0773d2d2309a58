"""A serving step's expert block, end to end (issue 27's question: do FP4 weights pay where
serving spends its time?): for each model declared in the artifacts (a gate-up set and its down
set, `<model>_gateup*` / `<model>_down*` with the same E), T decode tokens routed to their top-k
experts and sorted by expert, the whole block in one CUDA graph per path:

  ours   gg.quantize_experts(x) -> gg.scaled_grouped_mm(gate-up, alpha) -> silu(g) * u (torch)
         -> gg.quantize_experts -> gg.scaled_grouped_mm(down, alpha): what an engine runs
  gemms  our two scaled_grouped_mm calls alone, on operands quantized beforehand
  bf16   torch._grouped_mm(gate-up) -> silu(g) * u -> torch._grouped_mm(down), bf16 weights
  fp8    torch._scaled_grouped_mm row-wise (e4m3 copies of the same weights) for both GEMMs,
         silu(g) * u between; its activations quantized OUTSIDE the timed step (free to it:
         the comparison leans toward fp8), the down GEMM fed an e4m3 copy of the bf16 path's
         SwiGLU output made beforehand

    PYTHONPATH=. python bench/bench_layer.py --artifacts artifacts [--tokens 1 8 32 64 128]
        [--only MODEL ...] [--topk K] [--reps 30] [--json F]

Top-k is the model's own (MODEL_TOPK: Qwen3 and DeepSeek-V3 8, gpt-oss 4, Mixtral 2) unless
--topk is given. The gather of tokens into expert order and the weighted combine after are the
same for every path and are not in the step. Protocol as bench_models (bench/RESULTS.md): every
path's graphs replayed interleaved in rotation over input sets and weight copies (the hit
experts' bytes of one copy rotation > 3x L2), CUDA-event medians. The floor is the fp4 bytes of
both GEMMs' weights (experts with tokens) at the read bandwidth measured in the same run.

Check: ours against the bf16 path, per expert with rows, relative Frobenius error; `err` is the
worst expert's over every input set. NVFP4 activations are a lossy format (two quantizations
here), so this catches gross faults (an expert's wrong weights give about 1.4, zeros 1.0, NaN is
not finite), not rounding; the GEMMs and quantizers are proven exact on their own (bench_models,
tests/). A row whose err is above ERR_LIMIT or not finite says FAULT and the script exits 1.
(Until 2026-12-07, thirty-second session's review, err was one norm over all rows and a NaN
in any set but the first could pass.) Models named ep* are the test-sized layers of shapes.yaml
and run only when --only names them. A row whose weight rotation stays under 3x L2 (the
budget, or a small layer) says "L2-warm".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench", ROOT / "scripts"):
    sys.path.insert(0, str(p))

from bench_grouped import L2_BYTES, capture, time_interleaved
from bench_models import (
    Layer,
    Weights,
    expert_layers,
    expert_weight_bytes,
    route,
    sm_read_gbs,
    weight_sets,
)

import runtime

DEFAULT_TOKENS = (1, 8, 32, 64, 128)
# Each model's own routing top-k, by the set name's prefix (the first match wins).
MODEL_TOPK = (("qwen3", 8), ("dsv3", 8), ("gptoss", 4), ("mixtral", 2), ("ep_e", 2))
ERR_LIMIT = 0.35  # two NVFP4 quantizations of N(0, 1) activations: about 0.1-0.2
WEIGHT_BUDGET = 40 * 2**30  # device bytes for one model's weight copies (all three forms)

# ------------------------------------------------------------------ planning (CPU-tested)


@dataclass(frozen=True)
class Model:
    name: str
    gateup: Layer  # (E, 2F, H)
    down: Layer  # (E, H, F)
    topk: int


def model_topk(name: str, default: int = 8) -> int:
    return next((k for prefix, k in MODEL_TOPK if name.startswith(prefix)), default)


def pair_models(layers: list[Layer], topk: int | None = None) -> list[Model]:
    """The models among expert layers: a set whose name holds `gateup` and the set named the
    same with `down`, same E, gate-up N = 2 x down K and down N = gate-up K (a SwiGLU block).
    Tier sets (max_m given) are skipped: scaled_grouped_mm picks them by T itself."""
    base = {lay.set: lay for lay in layers if lay.max_m is None}
    models = []
    for name, up in base.items():
        if "gateup" not in name:
            continue
        down = base.get(name.replace("gateup", "down"))
        if (down is None or down.experts != up.experts or up.n != 2 * down.k
                or down.n != up.k):
            continue
        model = name.replace("_gateup", "")
        models.append(Model(model, up, down, topk if topk else model_topk(model)))
    return models


def select_models(models: list[Model], only: list[str] | None) -> list[Model]:
    """The models named in `only`, else all but the test-sized layers of shapes.yaml (ep4,
    ep8, ep_e4, ep_e8: a few MB of weights, under L2 whatever the rotation)."""
    if only:
        return [m for m in models if m.name in only]
    return [m for m in models if not m.name.startswith("ep")]


def hit_bytes(counts: list[int], model: Model) -> int:
    """fp4 weight bytes (packed + blocked scales) of both GEMMs' experts with tokens."""
    hit = sum(1 for c in counts if c)
    return hit * (expert_weight_bytes(model.gateup.n, model.gateup.k)
                  + expert_weight_bytes(model.down.n, model.down.k))


def copies_for(counts: list[int], model: Model) -> int:
    """Weight copies so that the hit experts rotate through > 3x L2, within WEIGHT_BUDGET
    (fp4 + bf16 + fp8 forms: 3.5 bytes a weight; at least one copy)."""
    per_copy = model.gateup.experts * (model.gateup.n * model.gateup.k
                                       + model.down.n * model.down.k) * 7 // 2
    return max(1, min(weight_sets(max(1, hit_bytes(counts, model))),
                      WEIGHT_BUDGET // max(1, per_copy)))


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.float(), ref.float()
    return float(torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))


def expert_errs(x: torch.Tensor, ref: torch.Tensor, counts: list[int]) -> list[float]:
    """rel_err of each expert with rows (rows grouped by expert as counts say)."""
    errs, row = [], 0
    for c in counts:
        if c:
            errs.append(rel_err(x[row:row + c], ref[row:row + c]))
            row += c
    return errs


def worst(errs: list[float]) -> float:
    """The largest error, NaN as soon as one is not finite (max() would drop a NaN that is not
    first), 0 for none."""
    if not all(math.isfinite(e) for e in errs):
        return float("nan")
    return max(errs, default=0.0)


def is_fault(err: float) -> bool:
    return not err <= ERR_LIMIT  # NaN too


# ------------------------------------------------------------------ GPU work


class Copy:
    """One copy of a model's weights: our fp4 (Weights), bf16 and e4m3 forms of both GEMMs."""

    def __init__(self, model: Model, seed: int) -> None:
        self.up, self.down = Weights(model.gateup, seed), Weights(model.down, seed + 1000)
        for w in (self.up, self.down):
            w.fp8 = w.bf16.to(torch.float8_e4m3fn)  # exact: the drawn values fit e4m3


def swiglu(h: torch.Tensor) -> torch.Tensor:
    f = h.shape[1] // 2
    return torch.nn.functional.silu(h[:, :f]) * h[:, f:]


def step_case(gg: Any, model: Model, tokens: int, copies: list[Copy], reps: int,
              gbs: float) -> dict:
    e, hidden = model.gateup.experts, model.gateup.k
    counts = route(tokens, e, model.topk, 26)
    rows = sum(counts)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    # A multiple of the copies, so that no two consecutive replays read the same copy.
    n_sets = len(copies) * -(-4 // len(copies))
    gen = torch.Generator(device="cuda").manual_seed(7)
    xs = [torch.randn(rows, hidden, generator=gen, device="cuda").to(torch.bfloat16)
          for _ in range(n_sets)]
    cps = [copies[j % len(copies)] for j in range(n_sets)]
    ones_rows = torch.ones(rows, dtype=torch.float32, device="cuda")
    ones_up = torch.ones(e, model.gateup.n, dtype=torch.float32, device="cuda")
    ones_down = torch.ones(e, model.down.n, dtype=torch.float32, device="cuda")

    def bf16_step(x: torch.Tensor, c: Copy) -> torch.Tensor:
        h = torch._grouped_mm(x, c.up.bf16.transpose(1, 2), offs=offs)
        return torch._grouped_mm(swiglu(h), c.down.bf16.transpose(1, 2), offs=offs)

    # From the bf16 path's SwiGLU output of each set, computed once: the reference output, the
    # static (calibrated) decode scales, as checkpoints ship them, and fp8's down-GEMM input
    # in e4m3 (scaled into its range: values only change the power drawn; fp8's activation
    # quantization is not timed).
    refs, scales, act8s = [], [], []
    for x, c in zip(xs, cps):
        act = swiglu(torch._grouped_mm(x, c.up.bf16.transpose(1, 2), offs=offs))
        refs.append(torch._grouped_mm(act, c.down.bf16.transpose(1, 2), offs=offs))
        amax = act.float().abs().amax().clamp_min(1e-30)
        s1 = float(x.float().abs().max()) / (6 * 448)
        s2 = float(amax) / (6 * 448)
        scales.append((torch.full((e,), s1, device="cuda"), torch.full((e,), s2, device="cuda")))
        act8s.append((act.float() * (400 / amax)).to(torch.float8_e4m3fn))

    def operands(j: int) -> tuple[torch.Tensor, ...]:
        """Both GEMMs' quantized inputs: quantize, gate-up, SwiGLU, quantize."""
        x, c, (s1, s2) = xs[j], cps[j], scales[j]
        a1, sfa1 = gg.quantize_experts(x, offs, s1)
        h = gg.scaled_grouped_mm(a1, c.up.b, sfa1, c.up.sfb, offs, alpha=s1)
        return (a1, sfa1, *gg.quantize_experts(swiglu(h), offs, s2))

    def ours(j: int) -> torch.Tensor:
        _, _, a2, sfa2 = operands(j)
        c, (_, s2) = cps[j], scales[j]
        return gg.scaled_grouped_mm(a2, c.down.b, sfa2, c.down.sfb, offs, alpha=s2)

    # The operands our GEMMs get in the step, quantized beforehand (the `gemms` column).
    pre = [operands(j) for j in range(n_sets)]

    def gemms(j: int) -> None:
        c, (s1, s2), (a1, sfa1, a2, sfa2) = cps[j], scales[j], pre[j]
        gg.scaled_grouped_mm(a1, c.up.b, sfa1, c.up.sfb, offs, alpha=s1)
        gg.scaled_grouped_mm(a2, c.down.b, sfa2, c.down.sfb, offs, alpha=s2)

    x8s = [x.to(torch.float8_e4m3fn) for x in xs]

    def fp8(j: int) -> None:
        c = cps[j]
        h = torch._scaled_grouped_mm(x8s[j], c.up.fp8.transpose(-2, -1), ones_rows, ones_up,
                                     offs=offs, out_dtype=torch.bfloat16)
        swiglu(h)  # the activation's cost; its e4m3 quantization is not timed (act8s)
        torch._scaled_grouped_mm(act8s[j], c.down.fp8.transpose(-2, -1), ones_rows, ones_down,
                                 offs=offs, out_dtype=torch.bfloat16)

    outs: list[Any] = [None] * n_sets

    def ours_into(j: int) -> None:
        outs[j] = ours(j)

    paths = {"ours": ours_into, "gemms": gemms,
             "bf16": lambda j: bf16_step(xs[j], cps[j]), "fp8": fp8}
    graphs = {name: [capture(lambda j=j, f=f: f(j)) for j in range(n_sets)]
              for name, f in paths.items()}
    times = dict(zip(graphs, time_interleaved(list(graphs.values()), reps)))
    for o in outs:
        o.fill_(float("nan"))
    for g in graphs["ours"]:
        g.replay()
    torch.cuda.synchronize()
    err = worst([x for o, r in zip(outs, refs) for x in expert_errs(o, r, counts)])
    floor_us = hit_bytes(counts, model) / gbs / 1e3
    return {"model": model.name, "experts": e, "tokens": tokens, "topk": model.topk,
            "rows": rows, "hit": sum(1 for c in counts if c), "copies": len(copies),
            **{f"{k}_us": v for k, v in times.items()}, "floor_us": floor_us,
            "err": err, "fault": is_fault(err),
            "l2_warm": len(copies) * hit_bytes(counts, model) <= 3 * L2_BYTES}


def table(rows: list[dict]) -> str:
    head = ("| model (E) | tokens x k | ours us | gemms us | bf16 us | fp8 us | x bf16 | x fp8 "
            "| floor us | % floor | err |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['model']} ({r['experts']}) | {r['tokens']} x {r['topk']} | {r['ours_us']:.1f} "
            f"| {r['gemms_us']:.1f} | {r['bf16_us']:.1f} | {r['fp8_us']:.1f} "
            f"| {r['bf16_us'] / r['ours_us']:.2f} | {r['fp8_us'] / r['ours_us']:.2f} "
            f"| {r['floor_us']:.1f} | {100 * r['floor_us'] / r['ours_us']:.0f} "
            f"| {r['err']:.3f}{' FAULT' if r['fault'] else ''}"
            f"{' L2-warm' if r.get('l2_warm') else ''} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS))
    ap.add_argument("--only", nargs="+", help="model names (e.g. qwen3_30b dsv3_e32)")
    ap.add_argument("--topk", type=int, help="instead of each model's own top-k")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    gg = runtime.load(args.artifacts)
    rt = gg.device_runtime()
    models = pair_models(expert_layers(gg.kernels, rt.arch, "bfloat16"), args.topk)
    models = select_models(models, args.only)
    if not models:
        print("no gate-up / down set pair in the artifacts for this GPU", file=sys.stderr)
        return 2
    gbs = sm_read_gbs()
    print(f"{torch.cuda.get_device_name()}: read {gbs:.0f} GB/s", flush=True)
    rows = []
    for model in models:
        need = max(copies_for(route(t, model.gateup.experts, model.topk, 26), model)
                   for t in args.tokens)
        copies = [Copy(model, 40 + 2 * j) for j in range(need)]
        for t in args.tokens:
            r = step_case(gg, model, t, copies, args.reps, gbs)
            rows.append(r)
            print(table([r]).splitlines()[-1], flush=True)
            if args.json:  # after each row: a run cut short keeps what it measured
                args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                 "read_gbs": gbs, "rows": rows}, indent=1))
            torch.cuda.empty_cache()
        del copies
        torch.cuda.empty_cache()
    print("\n" + table(rows))
    return 1 if any(r["fault"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
