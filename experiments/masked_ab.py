"""A/B of masked-layout kernel variants (issue 27) on the same inputs, replays interleaved in
one process: experiments/decode_ab.py for gg.masked_grouped_mm's layout. For each layer (masked
sets named <layer>_<variant> in experiments/masked_ab.yaml) and max_m, masked_m is drawn as
bench/bench_masked.py draws it (uniform in [0, 2 * fill * max_m], a quarter of the experts
empty), every variant's kernel is launched directly, and each variant's valid rows are compared
bit for bit with torch._grouped_mm's on the same values (the kernels are exact).

    python build_kernels.py build --spec experiments/masked_ab.yaml --out .artifacts_mab
    PYTHONPATH=. python experiments/masked_ab.py --artifacts .artifacts_mab --max-m 8 16 32 64
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench", ROOT / "scripts"):
    sys.path.insert(0, str(p))

from bench_masked import make_masked_inputs, masked_counts
from bench_models import (
    Layer,
    Weights,
    input_sets,
    layer_weight_bytes,
    time_grouped_mm,
    weight_sets,
)
from decode_ab import ab_case, cells

import runtime
from runtime.dispatch import dynamic_groups


def masked_variants(entries, arch: str) -> list[Layer]:
    """Every bf16 masked-layout set entry for `arch`, in the spec's order."""
    out = []
    for e in entries:
        dyn = dynamic_groups(e)
        if e.arch == arch and e.out_dtype == "bfloat16" and e.takes_masked and dyn is not None:
            out.append(Layer(e.name, e.set, len(dyn[0]), *dyn[0][0], dyn[1]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default=".artifacts_mab")
    ap.add_argument("--max-m", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--fill", type=float, default=0.5, help="mean masked_m / max_m")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=27)
    args = ap.parse_args()
    gg = runtime.load(args.artifacts)
    rt = gg.device_runtime()
    layers = masked_variants(gg.kernels, rt.arch)
    lines, ok = [], True
    for name, group in itertools.groupby(layers, key=lambda lay: lay.set.rsplit("_", 1)[0]):
        variants = list(group)
        base = variants[0]
        e, n, k = base.experts, base.n, base.k
        wsets = [Weights(base, args.seed + j) for j in range(weight_sets(layer_weight_bytes(base)))]
        for max_m in args.max_m:
            counts = masked_counts(e, max_m, args.fill, args.seed)
            n_sets = input_sets(layer_weight_bytes(base), e * max_m * (k // 2 + k // 16))
            inputs = [make_masked_inputs(base, max_m, counts, args.seed * 100 + i)
                      for i in range(n_sets)]
            w_of = [wsets[i % len(wsets)] for i in range(n_sets)]
            masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
            offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
            _, theirs = time_grouped_mm(inputs, w_of, offs, 3)
            times, same = ab_case(
                gg, rt, variants, inputs, w_of, masked_m, e * max_m, (e, max_m, n), args.reps,
                theirs, valid=lambda out: torch.cat([out[g, :m] for g, m in enumerate(counts)]))
            ok = ok and all(same)
            line = (f"{name:3s} E {e:3d} N {n:5d} K {k:5d} max_m {max_m:4d} (valid {sum(counts)}, "
                    f"max {max(counts)}): {cells(variants, times, same)}")
            print(line, flush=True)
            lines.append(line)
            del inputs
            torch.cuda.empty_cache()
        del wsets
    print("\n" + "\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
