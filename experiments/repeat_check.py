"""Repeat one routing many times through gg.scaled_grouped_mm and locate every wrong result:
which expert, which token rows and which output columns (within the n-tiles of the kernel it
picks) differ from the float64 reference, and by how much. Written to find inline_a's rare
wrong columns (docs/lab_notebook.md, twenty-first and twenty-second sessions): a race shows as
results that differ between identical calls.

    PYTHONPATH=. python experiments/repeat_check.py --artifacts DIR [--e 128 --n 3072 --k 4096]
        [--t 500] [--reps 150] [--routings 3] [--dump DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from serving_check import Layer, Weights, repeated_calls, routing

import runtime
from runtime.formats import scale_cols
from runtime.nvfp4 import from_blocked
from runtime.serving import select_serving


def _operand(packed: torch.Tensor, blocked: torch.Tensor, rows: int, k: int) -> tuple:
    """(packed fp4 bytes, plain e4m3 scale bytes (rows, k / 16)) on the CPU."""
    return packed.cpu(), from_blocked(blocked, rows, k).cpu()


def dump_tile(path: Path, layer: Layer, g: int, got: torch.Tensor, ref: torch.Tensor,
              wrong: torch.Tensor, tile_m: int, tile_n: int, call: int) -> None:
    """Save what a wrong result's tile computed from: its expert's A rows and weight rows of
    the first wrong n-tile, the kernel's and the reference's outputs there, and the operands of
    the two tiles before and after it on the same CTA (strided tiles: CTA = tile % SMs), so
    that hypotheses (a stale weight stage, another tile's C) can be tested offline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    k, n = layer.k, layer.n
    cols = scale_cols(k)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ntiles = n // tile_n
    row, srow = 0, 0
    tiles = []  # (expert, m-tile, n-tile, first row, scale row, m) by tile index
    for e, m in enumerate(layer.counts):
        mt_count = -(-m // tile_m)
        for nt in range(ntiles):
            for mt in range(mt_count):
                tiles.append((e, mt, nt, row, srow, m))
        row += m
        srow += -(-m // 128) * 128
    first_col = int(wrong.any(0).nonzero()[0])
    mt = int(wrong.any(1).nonzero()[0]) // tile_m
    nt = first_col // tile_n
    index = next(i for i, t in enumerate(tiles) if t[:3] == (g, mt, nt))

    def tile_operands(i: int) -> dict | None:
        if not 0 <= i < len(tiles):
            return None
        e, tm, tn, r, sr, m = tiles[i]
        rows = min(tile_m, m - tm * tile_m)
        sfa = layer.sfa[sr * cols:(sr + -(-m // 128) * 128) * cols]
        a, sa = _operand(layer.a[r:r + m], sfa, m, k)
        b, sb = _operand(layer.w.b[e], layer.w.sfb[e], n, k)
        span = slice(tn * tile_n, (tn + 1) * tile_n)
        return {"expert": e, "m_tile": tm, "n_tile": tn, "m": m, "tile": i,
                "a": a[tm * tile_m:tm * tile_m + rows].clone(),
                "sfa": sa[tm * tile_m:tm * tile_m + rows].clone(),
                "b": b[span].clone(), "sfb": sb[span].clone()}

    span = slice(nt * tile_n, (nt + 1) * tile_n)
    rows = slice(mt * tile_m, mt * tile_m + tile_m)
    torch.save({"call": call, "sms": sms, "tile_m": tile_m, "tile_n": tile_n,
                "counts": layer.counts, "got": got[rows, span].float().cpu().clone(),
                "ref": ref[rows, span].float().cpu().clone(),
                "tiles": {d: tile_operands(index + d * sms) for d in (-2, -1, 0, 1, 2)}}, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--e", type=int, default=128)
    ap.add_argument("--n", type=int, default=3072)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--t", type=int, default=500)
    ap.add_argument("--reps", type=int, default=150)
    ap.add_argument("--routings", type=int, default=3)
    ap.add_argument("--dump", default=None,
                    help="folder to save the first --dump-max wrong tiles' operands in "
                         "(experiments/wrong_tile.py reads them)")
    ap.add_argument("--dump-max", type=int, default=2)
    args = ap.parse_args()
    gg = runtime.load(args.artifacts)
    e, n, k, t = args.e, args.n, args.k, args.t
    # The kernel scaled_grouped_mm picks for these bf16 calls: its tile names the columns.
    entry = select_serving(gg.kernels, gg.device_runtime(0).arch, e, n, k, t, "bfloat16")
    tile_m, tile_n = entry.tile.m, entry.tile.n
    print(f"{entry.name}: tiles {tile_m} x {tile_n}")
    if args.dump and entry.options.get("blocked_tiles"):
        ap.error(f"--dump maps tiles to CTAs in the strided order; {entry.name} has blocked_tiles")
    w = Weights(e, n, k)
    rng = random.Random(7)
    total = 0
    dumped = 0
    for trial in range(args.routings):
        layer = Layer(w, t)
        layer.load(routing(rng, t, e, "skewed"), seed=100 + trial)
        bad = 0
        for i, g, m, _, got, ref in repeated_calls(gg, layer, args.reps):
            bad += 1
            wrong = got.float() != ref.float()
            rows = wrong.any(1).nonzero().flatten().tolist()
            cl = wrong.any(0).nonzero().flatten()
            diff = (got.float() - ref.float()).abs().nan_to_num(float("inf")).max().item()
            if args.dump and dumped < args.dump_max:
                dump_tile(Path(args.dump) / f"wrong{dumped}.pt", layer, g, got, ref, wrong,
                          tile_m, tile_n, i)
                dumped += 1
            print(f"routing {trial} call {i}: expert {g} (m = {m}) rows {rows}, "
                  f"{cl.numel()} columns {(cl % tile_n).tolist()} (n-tiles "
                  f"{sorted(set((cl // tile_n).tolist()))}), max |diff| {diff:.3g}, "
                  f"max |ref| {ref.float().abs().max().item():.3g}")
        print(f"routing {trial}: {bad} wrong expert results in {args.reps} calls "
              f"({sum(1 for m in layer.counts if m)} experts hit)")
        total += bad
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
