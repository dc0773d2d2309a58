"""Explain a wrong tile saved by `repeat_check.py --dump`: for each wrong output column (a weight
row of the tile), find which stale or early weight data reproduces the kernel's values exactly.

A hypothesis replaces, in that weight row, the packed words, the scales or both of some 64-K
steps of stage kt with those of stage kt + delta (the fill that shares kt's ring slot: delta =
+stages is the next fill, a write-after-read race; -stages the previous, a read-after-write race;
past the tile's last stage they come from the CTA's next tile, before the first from its previous
one). It holds when the bf16-rounded product with the tile's A equals the kernel's column bit for
bit. This located inline_a's wrong columns (docs/lab_notebook.md, twenty-second session): step 3
of stage 1 read the packed words of stage 4, the slot's next fill.

    PYTHONPATH=. python experiments/wrong_tile.py DUMP.pt [...] [--stages 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.sm90.config import K_TILE as STAGE_K  # K of one weight stage
from runtime.formats import SF_VEC
from runtime.nvfp4 import fp4_to_float


def values_and_scales(packed: torch.Tensor, scales: torch.Tensor) -> tuple:
    """float64 e2m1 values (rows, K) and e4m3 scales (rows, K / 16)."""
    return (fp4_to_float(packed).double(), scales.view(torch.float8_e4m3fn).double())


def product(a: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16-rounded A @ (one weight row) as float32, as the kernel writes it (alpha 1)."""
    return (a @ (values * scales.repeat_interleave(SF_VEC))).to(torch.bfloat16).float()


def explain_column(a, sources, k_stages, ring, got, part_k: int = 64) -> list[tuple]:
    """Every (stage, delta, parts, what) whose substitution reproduces `got` exactly: `parts`
    has bit q set for each replaced part q of part_k K (64: a wgmma step). `sources[d]`:
    (values, scales) of the weight row in the tile d tiles away on the CTA (0: the tile
    itself); `ring`: the ring's depth."""
    hits = []
    row_v, row_s = sources[0]
    for kt in range(k_stages):
        for delta in (ring, -ring):
            src_kt = kt + delta
            shift = int(src_kt >= k_stages) - int(src_kt < 0)
            if shift not in sources:
                continue
            src_v, src_s = sources[shift]
            src_kt -= shift * k_stages
            if not 0 <= src_kt < k_stages:  # a ring deeper than a tile's stages
                continue
            parts = STAGE_K // part_k
            for mask in range(1, 2 ** parts):
                for what in ("both", "packed", "scales"):
                    v, s = row_v.clone(), row_s.clone()
                    for q in range(parts):
                        if mask >> q & 1:
                            dst = slice(kt * STAGE_K + q * part_k, kt * STAGE_K + (q + 1) * part_k)
                            src = slice(src_kt * STAGE_K + q * part_k,
                                        src_kt * STAGE_K + (q + 1) * part_k)
                            if what != "scales":
                                v[dst] = src_v[src]
                            if what != "packed":
                                s[dst.start // SF_VEC:dst.stop // SF_VEC] = \
                                    src_s[src.start // SF_VEC:src.stop // SF_VEC]
                    if torch.equal(product(a, v, s), got):
                        hits.append((kt, delta, f"{mask:0{parts}b}", what))
    return hits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dumps", nargs="+")
    ap.add_argument("--stages", type=int, default=3, help="the weight ring's depth")
    ap.add_argument("--part-k", type=int, default=64, choices=(32, 64, 128, 256),
                    help="K granularity of a replaced part (32: one 16-byte word of a row)")
    args = ap.parse_args()
    for path in args.dumps:
        d = torch.load(path)
        tile = d["tiles"][0]
        a_v, a_s = values_and_scales(tile["a"], tile["sfa"])
        a = a_v * a_s.repeat_interleave(SF_VEC, dim=1)
        w_v, w_s = values_and_scales(tile["b"], tile["sfb"])
        rows = a.shape[0]
        got, ref = d["got"][:rows], d["ref"][:rows]
        k_stages = w_v.shape[1] // STAGE_K
        near = {shift: values_and_scales(d["tiles"][shift]["b"], d["tiles"][shift]["sfb"])
                for shift in (-1, 1) if d["tiles"][shift] is not None}
        wrong = (got != ref).any(0).nonzero().flatten().tolist()
        print(f"{path}: expert {tile['expert']} m-tile {tile['m_tile']} n-tile {tile['n_tile']} "
              f"(tile {tile['tile']}), {rows} rows, wrong columns {wrong}")
        for j in wrong:
            sources = {0: (w_v[j], w_s[j])} | {s: (v[j], sc[j]) for s, (v, sc) in near.items()}
            hits = explain_column(a, sources, k_stages, args.stages, got[:, j], args.part_k)
            print(f"  column {j}: {hits if hits else 'no single-stage hypothesis'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
