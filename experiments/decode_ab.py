"""A/B of decode kernel variants (issue 27) on the same inputs, replays interleaved in one
process (bench/bench_grouped.py's protocol): for each layer (sets named <layer>_<variant> in
experiments/decode_ab.yaml) and token count, every variant's kernel is launched directly (as
bench_models' "own kernel"), outputs compared bit for bit with torch._grouped_mm's (exit 1 if
any differs).

    python build_kernels.py build --spec experiments/decode_ab.yaml --out .artifacts_ab
    PYTHONPATH=. python experiments/decode_ab.py --artifacts .artifacts_ab --tokens 64 128 256
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

from bench_grouped import capture, time_interleaved
from bench_models import (
    Weights,
    expert_layers,
    fresh_replay,
    input_sets,
    layer_weight_bytes,
    make_inputs,
    route,
    time_grouped_mm,
    weight_sets,
)

import runtime


def variant_graphs(gg, rt, variants: list, inputs: list[dict], w_of: list,
                   first: torch.Tensor, rows: int, out_shape: tuple) -> tuple[list, list]:
    """Each variant's kernel launched directly (as bench_models' "own kernel"), one graph per
    input set (set j with weights w_of[j]), and its outputs. `first` is the kernel's first
    operand (offs, or masked_m for a masked kernel); `rows` the plan's T (E * max_m masked)."""
    all_graphs, outs = [], []
    for v in variants:
        entry = next(e for e in gg.kernels if e.name == v.entry)
        op = rt.offsets_plan(entry, v.experts, v.n, v.k, rows)
        o_list = [torch.empty(out_shape, dtype=torch.bfloat16, device="cuda") for _ in inputs]

        def launch(i, w, o, op=op):
            rt.launch_offsets(op, (first.data_ptr(), i["a"].data_ptr(), w.b.data_ptr(),
                                   i["sfa"].data_ptr(), w.sfb.data_ptr(), o.data_ptr()), 0)

        all_graphs.append([capture(lambda i=i, w=w, o=o, launch=launch: launch(i, w, o))
                           for i, w, o in zip(inputs, w_of, o_list)])
        outs.append(o_list)
    return all_graphs, outs


def ab_case(gg, rt, variants: list, inputs: list[dict], w_of: list, first: torch.Tensor,
            rows: int, out_shape: tuple, reps: int, theirs: torch.Tensor,
            valid=lambda out: out) -> tuple[list[float], list[bool]]:
    """One A/B case: each variant's graphs (variant_graphs), their replays interleaved
    (median us per variant), and whether each variant's last output, written by its graph
    alone (NaN first), has `valid` rows equal to `theirs` (torch._grouped_mm's on the same
    values: the kernels are exact)."""
    all_graphs, outs = variant_graphs(gg, rt, variants, inputs, w_of, first, rows, out_shape)
    times = time_interleaved(all_graphs, reps)
    same = [torch.equal(valid(fresh_replay(gs[-1], o[-1])), theirs)
            for gs, o in zip(all_graphs, outs)]
    return times, same


def cells(variants: list, times: list[float], same: list[bool]) -> str:
    """One result line's cells: each variant's name (after the set's last underscore), its
    median us, and DIFF where its output differed."""
    return "  ".join(f"{v.set.rsplit('_', 1)[1]} {t:7.1f}{'' if s else ' DIFF'}"
                     for v, t, s in zip(variants, times, same))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default=".artifacts_ab")
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    gg = runtime.load(args.artifacts)
    rt = gg.device_runtime()
    layers = expert_layers(gg.kernels, rt.arch, "bfloat16")
    by_layer = itertools.groupby(layers, key=lambda lay: lay.set.rsplit("_", 1)[0])
    lines, ok = [], True
    for name, group in by_layer:
        variants = list(group)
        base = variants[0]
        wsets = [Weights(base, 26 + j) for j in range(weight_sets(layer_weight_bytes(base)))]
        for tokens in args.tokens:
            counts = route(tokens, base.experts, min(args.topk, base.experts), 26)
            rows = sum(counts)
            n_sets = input_sets(layer_weight_bytes(base), rows * base.k // 2)
            inputs = [make_inputs(base, counts, 100 + i) for i in range(n_sets)]
            offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
            w_of = [wsets[j % len(wsets)] for j in range(len(inputs))]
            _, theirs = time_grouped_mm(inputs, w_of, offs, 3)
            times, same = ab_case(gg, rt, variants, inputs, w_of, offs, rows, (rows, base.n),
                                  args.reps, theirs)
            ok = ok and all(same)
            line = (f"{name:4s} E {base.experts:3d} N {base.n:5d} K {base.k:5d} tokens "
                    f"{tokens:4d} x {min(args.topk, base.experts)} (max/expert {max(counts)}): "
                    f"{cells(variants, times, same)}")
            print(line, flush=True)
            lines.append(line)
            del inputs
            torch.cuda.empty_cache()
        del wsets
    print("\n" + "\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
