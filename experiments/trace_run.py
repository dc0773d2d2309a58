"""Where a CTA's time goes, from the clock stamps of a trace build (sm_90a, H200).

    python experiments/trace_families.py --out .trace    # on a CPU: experiments/trace_ab.yaml
    PYTHONPATH=. python experiments/trace_run.py --artifacts .trace --sets moe_down dense_a
    # the serving (device-offsets) kernels, bench_models' routing of T tokens x top-8:
    python experiments/trace_families.py --spec experiments/trace_serving.yaml --out .trace_serving
    PYTHONPATH=. python experiments/trace_run.py --artifacts .trace_serving \
        --serving qwen3_30b_down_tiny --route 1 64

A trace build stores %clock64 (the SM's cycle counter) at fixed places of a per-CTA record in
the workspace (experiments/trace_families.py, TRACE_*): for every 64-K step of the first consumer
warpgroup, for every weight stage of the producer, and at each tile's start and hand-over. This
script runs each set eagerly on fresh inputs, reads the records back from the runtime's
workspace and prints medians over the CTAs, in cycles:

- the step: conversion and A wait (start -> A ready), wgmma issue (-> issued), the wait for
  the previous step's wgmma (-> retired), and what follows until the next step starts;
- a tile start (second and later tiles): the last step retired -> K loop done -> C tile free ->
  C tile handed over -> next tile's first step starts (its weights ready) -> A ready -> issued;
- the producer's lead: how many cycles before the consumers start a stage its weights were
  issued.

Results of trace builds are correct (the stamps only add stores), but slightly slower; compare
phases within one build, not against the untraced kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_grouped import ALL_SETS, input_sets
from trace_families import (
    TRACE_BYTES,
    TRACE_CONSUMER_BYTES,
    TRACE_CTA_EVENTS,
    TRACE_GLOBAL_EVENTS,
    TRACE_PRODUCER_BYTES,
    TRACE_STAGE_EVENTS,
    TRACE_STAGES,
    TRACE_STEP_EVENTS,
    TRACE_TILE_EVENTS,
    TRACE_TILES,
)

import runtime
from kernels.sm90.config import K_TILE
from kernels.sm90.structure import SUB_STEPS
from runtime.plan import cta_prefix


def split_records(flat: torch.Tensor, grid: int) -> dict:
    """A (grid * TRACE_BYTES // 8,) int64 tensor -> the consumer, producer and tile records."""
    rec = flat.view(grid, TRACE_BYTES // 8)
    c_end = TRACE_CONSUMER_BYTES // 8
    p_end = c_end + TRACE_PRODUCER_BYTES // 8
    return {
        "steps": rec[:, :c_end].reshape(grid, TRACE_TILES, TRACE_STAGES, SUB_STEPS,
                                        TRACE_STEP_EVENTS),
        "stages": rec[:, c_end:p_end].reshape(grid, TRACE_TILES, TRACE_STAGES,
                                              TRACE_STAGE_EVENTS),
        "tiles": rec[:, p_end:p_end + TRACE_TILES * TRACE_TILE_EVENTS].reshape(
            grid, TRACE_TILES, TRACE_TILE_EVENTS),
        "cta": rec[:, p_end + TRACE_TILES * TRACE_TILE_EVENTS:
                   p_end + TRACE_TILES * TRACE_TILE_EVENTS + len(TRACE_CTA_EVENTS)],
        "global": {e: rec[:, p_end + TRACE_TILES * TRACE_TILE_EVENTS + slot]
                   for e, slot in TRACE_GLOBAL_EVENTS.items()},
        "start": rec[:, p_end + TRACE_TILES * TRACE_TILE_EVENTS],
    }


def phases(r: dict, cta: int, tiles: int, stages: int) -> dict[str, list[int]]:
    """Per-phase cycle counts of one CTA's first `tiles` tiles of `stages` weight stages."""
    out: dict[str, list[int]] = {}

    def add(key: str, value: int) -> None:
        out.setdefault(key, []).append(int(value))

    steps, stage_ev, tile_ev = r["steps"][cta], r["stages"][cta], r["tiles"][cta]
    for t in range(tiles):
        seq = [steps[t, kt, s] for kt in range(stages) for s in range(SUB_STEPS)]
        for i, ev in enumerate(seq):
            add("step: start -> A ready (conversion, A wait)", ev[1] - ev[0])
            add("step: A ready -> issued", ev[2] - ev[1])
            add("step: issued -> previous retired", ev[3] - ev[2])
            if i + 1 < len(seq):
                nxt = seq[i + 1]
                key = ("step: retired -> next starts (weights wait)" if (i + 1) % SUB_STEPS == 0
                       else "step: retired -> next starts")
                add(key, nxt[0] - ev[3])
                add("step period (issued -> issued)", nxt[2] - ev[2])
        for kt in range(stages):
            add("producer lead: weights issued -> consumers start the stage",
                steps[t, kt, 0, 0] - stage_ev[t, kt, 1])
        if t == 0:
            # The CTA's own events that were stamped (a build without stream_a has no staging
            # events), each from the CTA's start.
            for e, name in enumerate(TRACE_CTA_EVENTS[1:], start=1):
                if int(r["cta"][cta, e]) != 0:
                    add(f"CTA start -> {name}", r["cta"][cta, e] - r["start"][cta])
            add("first tile: CTA start -> tile start", tile_ev[0, 0] - r["start"][cta])
            add("first tile: tile start -> first step starts", seq[0][0] - tile_ev[0, 0])
            add("first tile: first step starts -> issued", seq[0][2] - seq[0][0])
        else:
            last = steps[t - 1, stages - 1, SUB_STEPS - 1]
            add("tile start: last step retired -> K loop done", tile_ev[t - 1, 1] - last[3])
            add("tile start: K loop done -> C tile free", tile_ev[t - 1, 2] - tile_ev[t - 1, 1])
            add("tile start: C tile free -> handed over", tile_ev[t - 1, 3] - tile_ev[t - 1, 2])
            add("tile start: handed over -> next tile starts", tile_ev[t, 0] - tile_ev[t - 1, 3])
            add("tile start: next tile starts -> first step starts", seq[0][0] - tile_ev[t, 0])
            add("tile start: first step starts -> issued", seq[0][2] - seq[0][0])
            add("tile start: total, last retired -> first issued", seq[0][2] - last[3])
    return out


def across_ctas(r: dict) -> dict[str, float]:
    """From the %globaltimer stamps (ns, one clock for all CTAs): how far apart the CTAs
    start, when the last one counts its first streaming iteration, and how long a CTA waits
    for the first A stage from its own start, which is bounded by the last count (stream_a).
    With the grid barrier (no stream_a): when each CTA has staged its share of phase 1 and
    when it passed the grid barrier, which waits for the last CTA to stage."""
    start, found, counted, staged, passed = (r["global"][e] for e in (0, 4, 5, 9, 10))
    live = start > 0
    if not bool(live.any()):
        return {}
    t0 = int(start[live].min())
    spread = {"CTA starts: last - first (ns)": int(start[live].max()) - t0}
    out: dict[str, float] = {}
    if bool((counted[live] > 0).all()):  # stream_a
        out |= spread | {
            "first A found staged, from the CTA's start: median (ns)":
                statistics.median((found[live] - start[live]).tolist()),
            "stagers' first count, from the CTA's start: median (ns)":
                statistics.median((counted[live] - start[live]).tolist()),
            "stagers' first count of the last CTA, from the first CTA's start (ns)":
                int(counted[live].max()) - t0}
    if bool((staged[live] > 0).all()):  # the grid barrier
        out |= spread | {
            "phase 1 staged, from the CTA's start: median (ns)":
                statistics.median((staged[live] - start[live]).tolist()),
            "phase 1 staged by the last CTA, from the first CTA's start (ns)":
                int(staged[live].max()) - t0,
            "grid barrier passed, from the CTA's start: median (ns)":
                statistics.median((passed[live] - start[live]).tolist()),
            "grid barrier passed by the last CTA, from the first CTA's start (ns)":
                int(passed[live].max()) - t0}
    return out


def summarize(r: dict, grid: int, tiles_per_cta: list[int], stages: int) -> dict[str, float]:
    """Median over CTAs (each CTA's own median first) of every phase."""
    per: dict[str, list[float]] = {}
    for cta in range(grid):
        tiles = min(tiles_per_cta[cta], TRACE_TILES)
        if tiles == 0 or int(r["start"][cta]) == 0:
            continue
        for key, values in phases(r, cta, tiles, stages).items():
            per.setdefault(key, []).append(statistics.median(values))
    return {key: statistics.median(v) for key, v in per.items()}


def traced_call(gg: runtime.GroupedGemm, kernel, grid: int, tables_per_cta: int, call,
                label: str, tiles: int, stages: int) -> dict:
    """Run `call` (warmed up already) once with kernel's trace region zeroed and summarize its
    records: the region sits past the header and every CTA's descriptor sets and
    `tables_per_cta` bytes of derived tables (a device-offsets kernel's), CTAs strided."""
    rt = gg._runtimes[torch.cuda.current_device()]
    workspace = kernel.tables.tensormap_workspace
    header, per_cta = workspace.header_bytes, workspace.bytes_per_cta
    [(ws, _, _)] = [w for (stream, h), w in rt._workspaces.items() if h == header]
    start = header + grid * (per_cta - TRACE_BYTES + tables_per_cta)
    region = ws[start:start + grid * TRACE_BYTES]
    region.zero_()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    call()
    end.record()
    torch.cuda.synchronize()
    r = split_records(region.view(torch.int64).cpu(), grid)
    tiles_per_cta = [len(range(c, tiles, grid)) for c in range(grid)]
    span = int(r["steps"].max()) - int(r["start"][r["start"] > 0].min())
    summary = summarize(r, grid, tiles_per_cta, stages)
    summary.update(across_ctas(r))
    return {"set": label, "grid": grid, "tiles": tiles, "call_us": begin.elapsed_time(end) * 1e3,
            "span_cycles": span, "phases": summary}


def trace_set(gg: runtime.GroupedGemm, name: str, groups: list) -> dict:
    probs = input_sets(groups)[:3]
    outs = [torch.empty(m, n, dtype=torch.float16, device="cuda") for m, n, _ in groups]
    for p in probs[:2]:  # warm-up: the workspace is allocated and the module loaded
        gg.grouped_gemm(p.a, p.b, p.sfa, p.sfb, out=outs)
    torch.cuda.synchronize()
    kernel = next(k for k in gg.kernels if k.name.startswith(name + "."))
    tiles = cta_prefix(groups, kernel.tile.m, kernel.tile.n)[-1]
    grid = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    return traced_call(gg, kernel, grid, 0,
                       lambda: gg.grouped_gemm(probs[2].a, probs[2].b, probs[2].sfa,
                                               probs[2].sfb, out=outs),
                       name, tiles, min(groups[0][2] // K_TILE, TRACE_STAGES))


def trace_serving(gg: runtime.GroupedGemm, name: str, tokens: int) -> dict:
    """As trace_set, for a device-offsets set through scaled_grouped_mm: bench_models' routing
    of `tokens` tokens x top-8 (T = the rows routed). Its records follow every CTA's derived
    tables (experiments/trace_kernels.py); the grid is every SM."""
    from bench_models import Weights, expert_layers, make_inputs, route

    from runtime.formats import offsets_tables_bytes

    [layer] = expert_layers(gg.kernels, "sm_90a", "bfloat16", [name])
    kernel = next(k for k in gg.kernels if k.name == layer.entry)
    if kernel.options.get("blocked_tiles"):
        raise SystemExit(f"--serving {name}: blocked_tiles sets are not read (strided tiles only)")
    topk = min(8, layer.experts)
    counts = route(tokens, layer.experts, topk, 26)
    w = Weights(layer, 11)
    inp = make_inputs(layer, counts, 5)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    out = torch.empty(sum(counts), layer.n, dtype=torch.bfloat16, device="cuda")
    call = (inp["a"], w.b, inp["sfa"], w.sfb, offs)
    for _ in range(2):  # warm-up: the workspace is allocated and the module loaded
        gg.scaled_grouped_mm(*call, out=out)
    torch.cuda.synchronize()
    tiles = sum(-(-c // kernel.tile.m) for c in counts) * -(-layer.n // kernel.tile.n)
    return traced_call(gg, kernel, torch.cuda.get_device_properties(0).multi_processor_count,
                       offsets_tables_bytes(layer.experts),
                       lambda: gg.scaled_grouped_mm(*call, out=out),
                       f"{name} {tokens} x {topk}", tiles,
                       min(-(-layer.k // K_TILE), TRACE_STAGES))


def set_groups(gg: runtime.GroupedGemm, name: str) -> list:
    """The exact (m, n, k) groups the artifacts' set `name` serves (experiments/trace_ab.yaml's
    decode sets, which bench_grouped does not know)."""
    entry = next((k for k in gg.kernels if k.name.startswith(name + ".")), None)
    if entry is None or entry.serves.dynamic_m:
        raise SystemExit(f"--sets: {name!r} is neither a bench_grouped set nor an exact-shape "
                         f"set of the artifacts")
    return [list(g) for g in entry.serves.groups]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default=".trace")
    ap.add_argument("--sets", nargs="+", default=[], metavar="SET",
                    help="bench_grouped sets, or any exact-shape set of the artifacts")
    ap.add_argument("--serving", nargs="+", default=[], metavar="SET",
                    help="device-offsets sets of the artifacts (experiments/trace_serving.yaml),"
                         " traced through scaled_grouped_mm at each --route")
    ap.add_argument("--route", nargs="+", type=int, default=[64], metavar="T",
                    help="tokens (x top-8) of the --serving calls")
    ap.add_argument("--json", help="write the summaries here")
    args = ap.parse_args()
    if not args.sets and not args.serving:
        ap.error("name --sets or --serving")
    gg = runtime.load(args.artifacts)
    results = []
    runs = [lambda n=n: trace_set(gg, n, ALL_SETS.get(n) or set_groups(gg, n)) for n in args.sets]
    runs += [lambda n=n, t=t: trace_serving(gg, n, t) for n in args.serving for t in args.route]
    for run in runs:
        res = run()
        results.append(res)
        name = res["set"]
        print(f"\n{name}: {res['tiles']} tiles on {res['grid']} CTAs; call {res['call_us']:.1f} us "
              f"(eager), first CTA start to last stamp {res['span_cycles']} cycles")
        for key, value in res["phases"].items():
            print(f"  {key:62s} {value:9.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
