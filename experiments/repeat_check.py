"""Repeat one routing many times through gg.scaled_grouped_mm and locate every wrong result:
which expert, which token rows and which output columns (n-tiles of 256) differ from the float64
reference, and by how much. Written to find inline_a's rare wrong columns (docs/lab_notebook.md,
twenty-first session, run 7): a race shows as results that differ between identical calls.

    PYTHONPATH=. python experiments/repeat_check.py --artifacts DIR [--e 128 --n 3072 --k 4096]
        [--t 500] [--reps 150] [--routings 3]
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

from serving_check import Layer, Weights, routing

import runtime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--e", type=int, default=128)
    ap.add_argument("--n", type=int, default=3072)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--t", type=int, default=500)
    ap.add_argument("--reps", type=int, default=150)
    ap.add_argument("--routings", type=int, default=3)
    args = ap.parse_args()
    gg = runtime.load(args.artifacts)
    e, n, k, t = args.e, args.n, args.k, args.t
    w = Weights(e, n, k)
    rng = random.Random(7)
    total = 0
    for trial in range(args.routings):
        layer = Layer(w, t)
        layer.load(routing(rng, t, e, "skewed"), seed=100 + trial)
        alpha = torch.ones(e, device="cuda")
        out = torch.full((t, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        refs = list(layer.references([1.0] * e, torch.bfloat16))
        bad = 0
        for i in range(args.reps):
            out.fill_(float("nan"))
            gg.scaled_grouped_mm(layer.a, w.b, layer.sfa, w.sfb, layer.offs, alpha=alpha, out=out)
            torch.cuda.synchronize()
            for g, m, r0, ref in refs:
                got = out[r0:r0 + m]
                if torch.equal(got, ref):
                    continue
                bad += 1
                wrong = got.float() != ref.float()
                rows = wrong.any(1).nonzero().flatten().tolist()
                cl = wrong.any(0).nonzero().flatten()
                diff = (got.float() - ref.float()).abs().nan_to_num(float("inf")).max().item()
                print(f"routing {trial} call {i}: expert {g} (m = {m}) rows {rows}, "
                      f"{cl.numel()} columns {cl.min().item()}..{cl.max().item()} (n-tiles "
                      f"{sorted(set((cl // 256).tolist()))}), max |diff| {diff:.3g}, "
                      f"max |ref| {ref.float().abs().max().item():.3g}")
        print(f"routing {trial}: {bad} wrong expert results in {args.reps} calls "
              f"({len(refs)} experts hit)")
        total += bad
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
