"""Run one benchmark set's grouped GEMM a few times, for a profiler to attach to
(experiments/ncu.sh).

    PYTHONPATH=. python experiments/profile_target.py --artifacts artifacts --set moe_gateup \
        --iters 3

Data as in bench/bench_grouped.py (scales that keep fp32 sums exact); the last output is checked
bit-exact against the float64 reference, so a profile of a broken kernel says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runtime  # noqa: E402
from bench.bench_grouped import SETS  # noqa: E402
from runtime.nvfp4 import EXACT_DATA, make_grouped_problem, reference_grouped_gemm  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--set", dest="set_name", default="moe_gateup", choices=sorted(SETS))
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    groups = SETS[args.set_name]
    gg = runtime.load(args.artifacts)
    p = make_grouped_problem(groups, seed=7, device="cuda", **EXACT_DATA)
    out = [torch.empty(m, n, dtype=torch.float16, device="cuda") for m, n, _ in groups]
    for _ in range(args.iters):
        gg.grouped_gemm(p.a, p.b, p.sfa, p.sfb, out=out)
    torch.cuda.synchronize()
    ref = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, groups)
    exact = all(torch.equal(o, r.half()) for o, r in zip(out, ref))
    print(f"{args.set_name}: {args.iters} calls, output bit-exact: {exact}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
