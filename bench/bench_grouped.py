"""Benchmark: this project's NVFP4 grouped GEMM against what a user would run instead, one run.

    PYTHONPATH=. python bench/bench_grouped.py --artifacts artifacts [--sets moe_gateup ...]
    PYTHONPATH=. python bench/bench_grouped.py --artifacts 'artifacts#bf16,alpha' \
        --compare 'old_artifacts#f16'          # A/B of call variants, replays interleaved

An artifact directory may carry a call variant after '#': `bf16` or `f16` (the output type,
default f16) and `alpha` (a per-group float32 alpha of powers of two, 0.5 / 1 / 2, so the check
stays bit-exact), comma-separated.

Per benchmark set (shapes.yaml's moe_gateup, moe_down, dense_a, dense_b and the compute-heavy
bench_large; facts.md has their origin), side by side in the same process:
  ours      the artifact kernel through runtime.grouped_gemm (NVFP4 in, fp16 or bf16 out)
  cublas    torch.mm per group in bf16 on pre-dequantized weights and activations
  grouped   torch._grouped_mm in bf16 on the same pre-dequantized tensors
  floor     max(FLOPs at the bf16 MMA rate, NVFP4 bytes at the copy bandwidth), both ceilings
            measured in this run (a large bf16 matmul; a large device-to-device copy)
Protocol: inputs are full-range e2m1 codes with A scales 2^0..2^6 and B scales 2^-6..2^-3 (fp32
sums exact, so our output must equal fp16(float64 reference) bit for bit); each variant is
captured in one CUDA graph per input set; input sets rotate so that they do not sit in L2 (at
least 4 sets and more than 3x L2 bytes); the time is the median over many replays, each timed
with CUDA events. Our output on the timed inputs is checked against
the float64 reference (rtol = atol = 1e-3). Full numbers go to --json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import runtime
from runtime.nvfp4 import (
    EXACT_DATA,
    check_close,
    dequantize_nvfp4,
    make_grouped_problem,
    reference_grouped_gemm,
)

SPEC = ROOT / "shapes.yaml"
BENCH_SETS = ("moe_gateup", "moe_down", "dense_a", "dense_b", "bench_large")
BASE_SETS = BENCH_SETS[:4]  # the geomean's sets (facts.md); bench_large is the compute-heavy one
# Diagnostic twins, timed only when named in --sets: moe_down's groups and FLOPs as one 128-step
# tile per CTA instead of four of 32 steps, so that the difference is what a tile start costs
# (docs/lab_notebook.md, 2026-11-30, tenth session). Their spec builds them too.
DIAG_SPEC = ROOT / "experiments" / "tile_start_ab.yaml"
DIAG_SETS_NAMES = ("moe_down_one_tile",)


def spec_groups(path: Path, names: tuple[str, ...]) -> dict[str, list[tuple[int, int, int]]]:
    """The (m, n, k) groups of the named exact sets of a shapes.yaml-format spec, so the bench
    times exactly the shapes that are built."""
    raw = yaml.safe_load(path.read_text())
    by_name = {s["name"]: s for s in raw["sets"]}
    missing = [n for n in names if n not in by_name or by_name[n].get("m") == "dynamic"]
    if missing:
        raise SystemExit(f"{path} must hold the exact sets {list(names)}, but lacks {missing}")
    return {n: [tuple(int(v) for v in g) for g in by_name[n]["groups"]] for n in names}


SETS = spec_groups(SPEC, BENCH_SETS)
DIAG_SETS = spec_groups(DIAG_SPEC, DIAG_SETS_NAMES)
ALL_SETS = {**SETS, **DIAG_SETS}
L2_BYTES = 50 * 2**20
# GPU spin before every HOLD_BLOCK timed iterations: ~100 us per replay to enqueue, at ~2 GHz.
HOLD_BLOCK, HOLD_CYCLES_PER_REPLAY = 16, 200_000


def time_graphs(graphs: list[torch.cuda.CUDAGraph], reps: int) -> float:
    """Median microseconds of one replay, rotating over the graphs (one per input set)."""
    return time_interleaved([graphs], reps)[0]


def time_interleaved(variants: list[list[torch.cuda.CUDAGraph]], reps: int) -> list[float]:
    """Median microseconds of one replay per variant (each a list of graphs, one per input
    set), the variants' replays alternating: A/B comparisons then share the process, its
    allocations and the GPU's clock and thermal state, which differ between processes by up
    to 10% (docs/lab_notebook.md, 2026-11-30)."""
    for graphs in variants:
        for g in graphs:
            g.replay()
    torch.cuda.synchronize()
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(reps)] for _ in variants]
    for i in range(reps):
        if i % HOLD_BLOCK == 0:
            # Keep the GPU busy while the next block is enqueued: a graph shorter than the
            # CPU's ~10 us per replay would otherwise time the CPU (measured: a one-element
            # torch kernel "took" 9 us, docs/lab_notebook.md 2026-11-30).
            torch.cuda._sleep(HOLD_CYCLES_PER_REPLAY * HOLD_BLOCK * len(variants))
        # Each variant leads in turn, so none always takes the first replay after a hold. Every
        # replay takes the next input set of the rotation (replay r reads set r), so no
        # variant reads the set the replay before it has just pulled into L2 (when all read
        # set i, the second variant's weights were L2-warm wherever a set fits in L2).
        for j in range(len(variants)):
            graphs, marks = variants[(i + j) % len(variants)], events[(i + j) % len(variants)]
            marks[i][0].record()
            graphs[(i * len(variants) + j) % len(graphs)].replay()
            marks[i][1].record()
    torch.cuda.synchronize()
    return [statistics.median(s.elapsed_time(e) for s, e in marks) * 1e3 for marks in events]


def capture(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside capture: loads, caches, allocations
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def measure_ceilings() -> tuple[float, float]:
    """(bf16 matmul TFLOP/s, device copy GB/s counting read + write), measured now."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
    g = capture(lambda: torch.mm(a, b, out=c))
    us = time_graphs([g], 50)
    tflops = 2 * 8192**3 / us / 1e6
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    g = capture(lambda: dst.copy_(src))
    us = time_graphs([g], 30)
    gbs = 2 * src.numel() / us / 1e3
    return tflops, gbs


def packed_bytes(groups: list) -> int:
    """Bytes of one input set's packed A and B (scales aside)."""
    return sum(n * k // 2 + m * k // 2 for m, n, k in groups)


def input_sets(groups: list) -> list:
    """Input sets for one benchmark set: enough (4..16) that the rotation does not sit in L2
    (3x its bytes), with scales as in scripts/gpu_checks.py (fp32 sums exact, so the check can
    be bit-exact)."""
    n_sets = min(16, max(4, math.ceil(3 * L2_BYTES / packed_bytes(groups))))
    return [make_grouped_problem(groups, seed=7 + i, device="cuda", **EXACT_DATA)
            for i in range(n_sets)]


class Variant:
    """How one column calls the runtime: its artifacts, output type and alpha (see the module
    docstring: 'DIR#bf16,alpha')."""

    OUT = {"f16": torch.float16, "bf16": torch.bfloat16}

    def __init__(self, text: str) -> None:
        self.text = text
        path, _, opts = text.partition("#")
        self.dir, self.out_dtype, self.alpha = path, torch.float16, False
        for opt in filter(None, opts.split(",")):
            if opt in self.OUT:
                self.out_dtype = self.OUT[opt]
            elif opt == "alpha":
                self.alpha = True
            else:
                raise SystemExit(f"variant option must be one of f16, bf16, alpha, but got "
                                 f"{opt!r} in {text!r}")
        self.gg = runtime.load(self.dir)

    def alpha_for(self, groups: list) -> torch.Tensor | None:
        """Powers of two: the product stays exact, so the check stays bit for bit."""
        if not self.alpha:
            return None
        return torch.tensor([2.0 ** (g % 3 - 1) for g in range(len(groups))],
                            dtype=torch.float32, device="cuda")

    def reference(self, prob: Any, groups: list) -> list:
        alpha = self.alpha_for(groups)
        return reference_grouped_gemm(prob.a, prob.b, prob.sfa, prob.sfb, groups,
                                      alpha=None if alpha is None else alpha.tolist(),
                                      out_dtype=self.out_dtype)


def capture_ours(v: Variant, probs: list, groups: list) -> tuple[list, list]:
    """One graph per input set of our kernel called as `v` says, and the outputs each one
    writes."""
    outs = [[torch.empty(m, n, dtype=v.out_dtype, device="cuda") for m, n, _ in groups]
            for _ in probs]
    alpha = v.alpha_for(groups)
    graphs = [capture(lambda p=p, o=o: v.gg.grouped_gemm(p.a, p.b, p.sfa, p.sfb, out=o,
                                                         alpha=alpha))
              for p, o in zip(probs, outs)]
    return graphs, outs


def replayed_exact(graph: torch.cuda.CUDAGraph, outs: list, ref: list) -> bool:
    """Replay `graph` and compare its outputs with the reference rounded to the output type
    (Variant.reference), bit for bit. The outputs are NaN first: capture()'s eager warm-up
    already wrote the right values into them."""
    for o in outs:
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return all(torch.equal(o, r) for o, r in zip(outs, ref))


def bench_set(v: Variant, name: str, groups: list, reps: int, ceilings,
              baselines: bool = True) -> dict:
    tflops_peak, gbs = ceilings
    flops = sum(2 * m * n * k for m, n, k in groups)
    nvfp4_bytes = sum(m * k // 2 + n * k // 2 + (m + n) * k // 16 + 2 * m * n
                      for m, n, k in groups)
    probs = input_sets(groups)
    n_sets = len(probs)
    ours, outs = capture_ours(v, probs, groups)
    t_ours = time_graphs(ours, reps)
    # correctness on the timed inputs: the last replayed graph's buffers
    ref = v.reference(probs[-1], groups)
    exact = replayed_exact(ours[-1], outs[-1], ref)
    ok, report = check_close(outs[-1], [r.double() for r in ref])
    ok = ok and exact
    del ours, ref

    floor_mma = flops / (tflops_peak * 1e6)
    floor_mem = nvfp4_bytes / (gbs * 1e3)
    row = {"set": name, "groups": groups, "ok": ok, "check": report, "input_sets": n_sets,
           "ours_us": t_ours, "cublas_us": float("nan"), "grouped_mm_us": float("nan"),
           "floor_us": max(floor_mma, floor_mem), "floor_mma_us": floor_mma,
           "floor_mem_us": floor_mem, "tflops": flops / t_ours / 1e6, "gflop": flops / 1e9}
    if not baselines:
        return row
    # Baselines on pre-dequantized bf16 tensors (dequantization itself is not timed).
    deq = []
    for p in probs[: min(n_sets, 4 if packed_bytes(groups) * 3.5 > L2_BYTES else n_sets)]:
        xs = [dequantize_nvfp4(a, s).to(torch.bfloat16) for a, s in zip(p.a, p.sfa_plain)]
        ws = [dequantize_nvfp4(b, s).to(torch.bfloat16) for b, s in zip(p.b, p.sfb_plain)]
        deq.append((xs, ws))
    del probs, outs
    cub_out = [[torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for m, n, _ in groups]
               for _ in deq]

    def cublas(xs, ws, out):
        for x, w, o in zip(xs, ws, out):
            torch.mm(x, w.t(), out=o)

    t_cublas = time_graphs([capture(lambda d=d, o=o: cublas(*d, o)) for d, o in
                            zip(deq, cub_out)], reps)
    t_grouped = float("nan")
    same_nk = len({(n, k) for _, n, k in groups}) == 1
    if same_nk and hasattr(torch, "_grouped_mm"):
        try:
            packs = []
            for xs, ws in deq:
                x = torch.cat(xs)
                w = torch.stack(ws).transpose(1, 2)  # (G, k, n), K-major storage
                offs = torch.tensor([sum(g[0] for g in groups[: i + 1]) for i in
                                     range(len(groups))], dtype=torch.int32, device="cuda")
                packs.append((x, w, offs))
            t_grouped = time_graphs([capture(lambda q=q: torch._grouped_mm(q[0], q[1],
                                                                           offs=q[2]))
                                     for q in packs], reps)
        except Exception as exc:
            print(f"  {name}: torch._grouped_mm unavailable: {exc}".splitlines()[0])
    row.update(cublas_us=t_cublas, grouped_mm_us=t_grouped)
    return row


def compare_set(variants: list[Variant], name: str, groups: list, reps: int) -> dict:
    """Our kernel called as each variant says on the same inputs, timed interleaved; each
    checked bit-exact on the last input set."""
    probs = input_sets(groups)
    captured = [capture_ours(v, probs, groups) for v in variants]
    times = time_interleaved([graphs for graphs, _ in captured], reps)
    oks = [replayed_exact(graphs[-1], outs[-1], v.reference(probs[-1], groups))
           for v, (graphs, outs) in zip(variants, captured)]
    return {"set": name, "us": times, "ok": oks}


def compare(dirs: list[str], sets: list[str], reps: int, json_path: str | None) -> int:
    """--compare: one row per set, one column per artifact directory (and call variant), and
    each time relative to the first's."""
    variants = [Variant(d) for d in dirs]
    rows = []
    for name in sets:
        try:
            rows.append(compare_set(variants, name, ALL_SETS[name], reps))
        except runtime.NoKernelError as exc:
            print(f"  {name}: skipped, a directory has no kernel for it "
                  f"({str(exc).splitlines()[0]})")
    for i, d in enumerate(dirs):
        print(f"[{i}] {d}")
    print(f"{'set':12s} " + " ".join(f"{f'[{i}] us':>9s} {'x':>5s}" for i in range(len(dirs))))
    for r in rows:
        cells = [f"{t:9.1f} {r['us'][0] / t:5.2f}{'' if ok else ' WRONG'}"
                 for t, ok in zip(r["us"], r["ok"])]
        print(f"{r['set']:12s} " + " ".join(cells))
    if json_path:
        Path(json_path).write_text(json.dumps({"dirs": dirs, "rows": rows}, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default=str(ROOT / "artifacts"))
    ap.add_argument("--sets", nargs="*", default=list(SETS),
                    choices=list(ALL_SETS), metavar="SET")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--no-baselines", action="store_true", help="time only this project's kernel")
    ap.add_argument("--label", default="", help="printed with the table (e.g. a variant name)")
    ap.add_argument("--compare", nargs="+", metavar="DIR",
                    help="time our kernel from --artifacts and from each DIR on the same inputs, "
                         "replays interleaved, instead of the baseline table")
    args = ap.parse_args()
    if args.compare:
        return compare([args.artifacts, *args.compare], args.sets, args.reps, args.json)

    ours = Variant(args.artifacts)
    ceilings = measure_ceilings()
    print(f"{torch.cuda.get_device_name()}: bf16 matmul {ceilings[0]:.0f} TFLOP/s, "
          f"copy {ceilings[1]:.0f} GB/s (read+write)")
    rows = []
    for name in args.sets:
        try:
            rows.append(bench_set(ours, name, ALL_SETS[name], args.reps, ceilings,
                                  not args.no_baselines))
        except runtime.NoKernelError as exc:
            print(f"  {name}: skipped, no kernel built ({str(exc).splitlines()[0]})")
    hdr = (f"{'set':12s} {'ours us':>8s} {'TFLOP/s':>8s} {'%floor':>7s} {'cuBLAS':>8s} "
           f"{'x':>5s} {'grp_mm':>8s} {'x':>5s} {'floor':>7s}  check")
    print(f"\n{args.label}\n{hdr}" if args.label else "\n" + hdr)
    for r in rows:
        print(f"{r['set']:12s} {r['ours_us']:8.1f} {r['tflops']:8.0f} "
              f"{100 * r['floor_us'] / r['ours_us']:6.0f}% {r['cublas_us']:8.1f} "
              f"{r['cublas_us'] / r['ours_us']:5.2f} {r['grouped_mm_us']:8.1f} "
              f"{r['grouped_mm_us'] / r['ours_us']:5.2f} {r['floor_us']:7.1f}  "
              f"{'ok' if r['ok'] else 'WRONG'}")
    base = [r for r in rows if r["set"] in BASE_SETS]
    if base:
        geo = lambda key: math.exp(statistics.mean(math.log(r[key]) for r in base))
        print(f"{'geomean(4)':12s} {geo('ours_us'):8.1f} {'':8s} {'':7s} {geo('cublas_us'):8.1f} "
              f"{geo('cublas_us') / geo('ours_us'):5.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"ceilings": ceilings, "rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
