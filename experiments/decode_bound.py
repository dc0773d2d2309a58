"""What bounds a decode-sized serving call (issue 27): one device-offsets kernel timed over
routings that change one thing at a time, so that time = fixed + tiles x per-tile cost can be
read off.

    PYTHONPATH=. python experiments/decode_bound.py --artifacts artifacts \
        [--only qwen3_30b_down_decode ...] [--reps 50]

Per layer (a decode set's bf16 entry), routings of its max rows:
  none      offs all 0: no tiles (the prologue, phase 1 and the grid barrier alone)
  h x r     h experts hit (spread over E), r rows each: h * ceil(r / tile_m) * N / tile_n tiles
  h x r @ s with --hit: h adjacent experts from expert s instead (where the hit experts sit in
            the table, apart from how many there are)
  T x k     with --route T: bench_models' skewed top-k routing of T tokens (its seed)
Each line: us (CUDA-event median over graph replays rotating > 3x L2 of weight copies), tiles,
tiles per CTA (the most any CTA runs), the bytes of the hit experts' weights and scales, and
the rate those bytes moved at, beside the run's copy bandwidth through the SMs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench", ROOT / "scripts"):
    sys.path.insert(0, str(p))

from bench_grouped import capture, time_graphs
from bench_models import (
    Weights,
    expert_layers,
    layer_weight_bytes,
    make_inputs,
    route,
    sm_copy_gbs,
    weight_sets,
)

import runtime
from runtime.formats import blocked_scale_numel, scale_cols
from runtime.serving import sfa_rows_needed

DEFAULT = ("qwen3_30b_down_decode", "qwen3_30b_gateup_decode", "dsv3_down_e32_decode",
           "dsv3_gateup_e32_decode")


def routings(experts: int) -> list[tuple[str, int, int]]:
    """(label, experts hit, rows each)."""
    out = [("none", 0, 0)]
    for h in sorted({1, experts // 8, experts // 4, experts // 2, experts}):
        out.append((f"{h}x16", h, 16))
    out += [(f"{experts}x1", experts, 1), (f"{experts}x32", experts, 32)]
    return out


def counts_for(experts: int, hit: int, rows: int, start: int | None = None) -> list[int]:
    """Rows per expert: `hit` experts spread over E, or adjacent from `start`."""
    counts = [0] * experts
    for j in range(hit):
        counts[j * experts // hit if start is None else (start + j) % experts] = rows
    return counts


def parse_hit(spec: str) -> tuple[str, int, int, int | None]:
    """'HxR' or 'HxR@S' -> (label, H, R, S or None)."""
    hr, _, start = spec.partition("@")
    h, r = map(int, hr.split("x"))
    return spec, h, r, int(start) if start else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--only", nargs="*", default=list(DEFAULT))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--profile", action="store_true",
                    help="for a profiler (experiments/ncu.sh): each --only layer's E x 16 "
                         "routing (or --route's), 3 eager launches on one weight copy, no "
                         "timing")
    ap.add_argument("--copies", type=int, default=0,
                    help="weight copies the graphs rotate over (default: enough to defeat L2); "
                         "1 keeps the hit experts' weights, and their pages' translations, warm")
    ap.add_argument("--hit", nargs="*", default=[], metavar="HxR",
                    help="more routings: H experts hit (spread over E), R rows each; HxR@S: "
                         "H adjacent experts from expert S")
    ap.add_argument("--hit-only", action="store_true",
                    help="time the --hit routings only (not the default list)")
    ap.add_argument("--route", type=int, nargs="*", default=[], metavar="T",
                    help="also bench_models' routing of T tokens, top-8 (capped at E)")
    args = ap.parse_args()
    gg = runtime.load(args.artifacts)
    rt = gg.device_runtime()
    sms = rt.device.sm_count
    gbs = 1.0 if args.profile else sm_copy_gbs() / 2  # read rate: the copy's read half
    print(f"copy through the SMs: {2 * gbs:.0f} GB/s (read + write); reads at {gbs:.0f} GB/s")
    lines = []
    for layer in expert_layers(gg.kernels, rt.arch, "bfloat16", args.only):
        entry = next(e for e in gg.kernels if e.name == layer.entry)
        tile_m, tile_n = entry.tile.m, entry.tile.n
        e, n, k = layer.experts, layer.n, layer.k
        t = min(layer.max_m or 4096, 4096)
        copies = 1 if args.profile else args.copies or weight_sets(layer_weight_bytes(layer))
        wsets = [Weights(layer, 11 + i) for i in range(copies)]
        per_expert = n * k // 2 + blocked_scale_numel(n, k)
        op = rt.offsets_plan(entry, e, n, k, t)
        # Routings past the set's max_m are another set's calls.
        routed = {f"{tok}x{min(8, e)}": route(tok, e, min(8, e), 26) for tok in args.route
                  if tok * min(8, e) <= t}
        if args.profile:
            cases = [(f"{e}x16", e, 16, None)] if not routed else []
        else:
            cases = [] if args.hit_only else [(*c, None) for c in routings(e)]
        cases += [parse_hit(h_r) for h_r in args.hit]
        for label, hit, r, start in cases + [(lab, None, None, None) for lab in routed]:
            counts = routed[label] if hit is None else counts_for(e, hit, r, start)
            if sum(counts) > t:  # past the set's max_m: another set's calls
                continue
            hit = sum(1 for c in counts if c)
            inp = make_inputs(layer, counts, 5) if sum(counts) else None
            rows_used = sum(counts)
            a = torch.zeros(t, k // 2, dtype=torch.uint8, device="cuda")
            sfa = torch.zeros(sfa_rows_needed(t, e) * scale_cols(k), dtype=torch.uint8,
                              device="cuda")
            if inp is not None:
                a[:rows_used] = inp["a"].view(torch.uint8)
                sfa[:inp["sfa"].numel()] = inp["sfa"]
            offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
            outs = [torch.empty(t, n, dtype=torch.bfloat16, device="cuda") for _ in wsets]

            def call(w: Weights, o: torch.Tensor) -> None:
                rt.launch_offsets(op, (offs.data_ptr(), a.data_ptr(), w.b.data_ptr(),
                                       sfa.data_ptr(), w.sfb.data_ptr(), o.data_ptr()), 0)

            if args.profile:
                for _ in range(3):
                    call(wsets[0], outs[0])
                torch.cuda.synchronize()
                continue
            graphs = [capture(lambda w=w, o=o: call(w, o)) for w, o in zip(wsets, outs)]
            us = time_graphs(graphs, args.reps)
            del graphs
            m_tiles = sum(-(-c // tile_m) for c in counts)
            tiles = m_tiles * (-(-n // tile_n))
            wbytes = hit * per_expert
            # Each m-tile of an expert streams its weights again (L2 may serve the repeats).
            line = (f"{layer.set:28s} {label:>8s} {us:8.1f} us  tiles {tiles:5d} "
                    f"({-(-tiles // op.grid) if tiles else 0:3d}/CTA)  weights "
                    f"{wbytes / 1e6:7.1f} MB  {wbytes / us / 1e3 if us else 0:6.0f} GB/s "
                    f"({100 * wbytes / us / 1e3 / gbs:4.0f}% of reads)  m-tiles/expert "
                    f"{m_tiles / hit if hit else 0:4.2f}")
            print(line, flush=True)
            lines.append(line)
        del wsets
        torch.cuda.empty_cache()
    print(f"\ngrid: {sms} SMs")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
