"""Masked-layout benchmark (issue 27): each masked expert set (DeepGEMM's / DeepEP low-latency's
layout) through gg.masked_grouped_mm at max_m 16 to 256, beside torch's bf16 and fp8 grouped
GEMMs on the same valid rows, in one process (bench_models' protocol and helpers).

    PYTHONPATH=. python bench/bench_masked.py --artifacts artifacts [--max-m 16 32 64 128 256]
        [--fill 0.5] [--reps 100] [--json F]

Per case: masked_m[e] uniform in [0, 2 * fill * max_m] capped at max_m (fixed seed), a quarter
of the experts empty; `expected_m` = fill * max_m (the host hint). Timed in CUDA graphs rotated
over >= 4 input sets: ours (a (E, max_m, K/2), masked_m on the device), torch._grouped_mm bf16
and torch._scaled_grouped_mm fp8 row-wise on the valid rows packed back to back (what an engine
without a masked kernel would run, packing not timed). Floors: the fp4 bytes of the experts
with tokens (weights + scales, A and C of the valid rows) at the run's read rate
(bench_models.sm_read_gbs; the copy rate through the SMs until 2026-12-06), and the bf16-MMA
FLOPs of the valid rows. Checked: our valid rows equal torch._grouped_mm's bit for bit
(EXACT_DATA values). Results: bench/RESULTS.md, "Masked layout" (H200, 2026-12-04).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench", ROOT / "scripts"):
    sys.path.insert(0, str(p))

from bench_grouped import capture, measure_ceilings, time_graphs
from bench_models import (
    Layer,
    Weights,
    dequant_rows,
    fmt,
    fp4_bytes,
    fresh_replay,
    input_sets,
    layer_weight_bytes,
    mma_flops,
    sm_copy_gbs,
    sm_read_gbs,
    time_fp8_grouped,
    time_grouped_mm,
    weight_sets,
)
from serving_check import draw_nvfp4

import runtime
from runtime.dispatch import dynamic_groups
from runtime.masked import select_masked
from runtime.nvfp4 import EXACT_DATA, to_blocked

DEFAULT_MAX_M = (16, 32, 64, 128, 256)


def masked_counts(experts: int, max_m: int, fill: float, seed: int) -> list[int]:
    """masked_m per expert: uniform in [0, 2 * fill * max_m], capped at max_m, a quarter of
    the experts (at least one) empty; reproducible from `seed`."""
    rng = random.Random(seed)
    top = max(1, round(2 * fill * max_m))
    counts = [min(max_m, rng.randint(0, top)) for _ in range(experts)]
    for g in rng.sample(range(experts), max(1, experts // 4)):
        counts[g] = 0
    return counts


def masked_layers(entries: Any, arch: str, out_dtype: str) -> list[Layer]:
    """One layer per (E, N, K) of the masked sets (the first set declaring it names it): every
    call goes through masked_grouped_mm, which picks among the layer's kernels itself."""
    out, seen = [], set()
    for e in entries:
        dyn = dynamic_groups(e)
        if e.arch == arch and e.out_dtype == out_dtype and e.takes_masked and dyn is not None:
            layer = Layer(e.name, e.set, len(dyn[0]), *dyn[0][0], dyn[1])
            if (layer.experts, layer.n, layer.k) not in seen:
                seen.add((layer.experts, layer.n, layer.k))
                out.append(layer)
    return out


def make_masked_inputs(layer: Layer, max_m: int, counts: list[int], seed: int) -> dict:
    e, k = layer.experts, layer.k
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x, s = draw_nvfp4(e * max_m, k, gen, EXACT_DATA["scale_exp"])
    a = x.view(e, max_m, k // 2)
    plain = s.view(torch.uint8).view(e, max_m, k // 16)
    sfa = torch.stack([to_blocked(plain[g]) for g in range(e)])
    valid = torch.cat([dequant_rows(a[g, :m], s.view(e, max_m, -1)[g, :m])
                       for g, m in enumerate(counts)])
    return {"a": a, "sfa": sfa, "bf16": valid}


def bench_case(gg: Any, layer: Layer, max_m: int, fill: float, wsets: list, ceilings: tuple,
               reps: int, seed: int) -> dict:
    (tflops, gbs), n, k, e = ceilings[:2], layer.n, layer.k, layer.experts
    counts = masked_counts(e, max_m, fill, seed)
    rows = sum(counts)
    n_sets = input_sets(layer_weight_bytes(layer), e * max_m * (k // 2 + k // 16))
    inputs = [make_masked_inputs(layer, max_m, counts, seed * 100 + i) for i in range(n_sets)]
    w_of = [wsets[i % len(wsets)] for i in range(n_sets)]
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    expected = max(1, round(fill * max_m))
    row: dict[str, Any] = {"set": layer.set, "experts": e, "n": n, "k": k, "max_m": max_m,
                           "expected_m": expected, "rows": rows, "counts": counts,
                           "experts_hit": sum(map(bool, counts)),
                           "fp4_floor_us": fp4_bytes(counts, n, k) / (gbs * 1e3),
                           "mma_floor_us": mma_flops(counts, n, k) / (tflops * 1e6)}
    outs = [torch.empty(e, max_m, n, dtype=torch.bfloat16, device="cuda") for _ in inputs]
    graphs = [capture(lambda i=i, w=w, o=o: gg.masked_grouped_mm(
        i["a"], w.b, i["sfa"], w.sfb, masked_m, expected_m=expected, out=o))
        for i, w, o in zip(inputs, w_of, outs)]
    row["ours_us"] = time_graphs(graphs, reps)
    row["kernel"] = select_masked(gg.kernels, gg.device_runtime().arch, e, n, k, expected,
                                  "bfloat16").name
    fresh_replay(graphs[-1], outs[-1])  # NaN first: capture's warm-up wrote the right values
    ours = torch.cat([outs[-1][g, :m] for g, m in enumerate(counts)])
    del graphs, outs
    row["grouped_mm_us"], theirs = time_grouped_mm(inputs, w_of, offs, reps)
    row["check"] = "exact" if torch.equal(ours, theirs) else "MISMATCH"
    row.update(time_fp8_grouped(inputs, wsets, w_of, offs, rows, e, n, reps))
    return row


def table(rows: list[dict]) -> str:
    head = ("| layer | E | N | K | max_m | valid rows | experts hit | ours us | grp_mm bf16 us | "
            "x | fp8 us | x | fp4 floor us | % | check |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        o = r["ours_us"]
        run_by = r.get("kernel", r["set"]).split(".")[0]
        name = r["set"] if run_by == r["set"] else f"{r['set']} (run by {run_by})"
        cells = [name, r["experts"], r["n"], r["k"], r["max_m"], r["rows"], r["experts_hit"],
                 fmt(o)]
        for key in ("grouped_mm_us", "fp8_us"):
            cells += [fmt(r[key]), fmt(r[key] / o, 2)]
        cells += [fmt(r["fp4_floor_us"]), fmt(100 * r["fp4_floor_us"] / o, 0), r["check"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default=str(ROOT / "artifacts"))
    ap.add_argument("--max-m", type=int, nargs="+", default=list(DEFAULT_MAX_M))
    ap.add_argument("--fill", type=float, default=0.5, help="mean masked_m / max_m")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--json", help="write all numbers here")
    args = ap.parse_args()
    if not 0 < args.fill <= 1 or any(m < 1 for m in args.max_m):
        ap.error("--fill must be in (0, 1] and --max-m positive")
    gg = runtime.load(args.artifacts)
    arch = gg.device_runtime().arch
    layers = masked_layers(gg.kernels, arch, "bfloat16")
    if not layers:
        print(f"no masked-layout set entry for {arch} (bf16) in {args.artifacts}")
        return 1
    ceilings = (measure_ceilings()[0], sm_read_gbs(), sm_copy_gbs())
    rows = []
    for layer in layers:
        wsets = [Weights(layer, args.seed + j)
                 for j in range(weight_sets(layer_weight_bytes(layer)))]
        for max_m in args.max_m:
            r = bench_case(gg, layer, max_m, args.fill, wsets, ceilings, args.reps, args.seed)
            print(f"  {layer.set} max_m={max_m}: ours {r['ours_us']:.1f} us, grouped_mm "
                  f"{r['grouped_mm_us']:.1f}, fp8 {fmt(r['fp8_us'])} ({r['check']})", flush=True)
            rows.append(r)
        del wsets
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, {arch}, bf16 out, fill {args.fill}, reps "
          f"{args.reps}; read {ceilings[1]:.0f} GB/s (the fp4 floor's), copy "
          f"{ceilings[2]:.0f} GB/s, bf16 {ceilings[0]:.0f} TFLOP/s\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"ceilings": ceilings, "rows": rows}, indent=1))
    return 0 if all(r["check"] == "exact" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
