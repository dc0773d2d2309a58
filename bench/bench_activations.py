"""What quantizing a serving step's activations costs: bf16 tokens (T, K) grouped by expert ->
NVFP4 a and scaled_grouped_mm's sfa, as an engine runs it before each expert GEMM, timed in CUDA
graphs (rotated over 4 input sets, new routing each), beside its bytes floor (read x, write a
and the scales, at the copy rate measured in the same run). Two paths: runtime.activations'
torch ops, and with --artifacts the artifacts' AOT quantizer (gg.quantize_experts, its bytes
checked against the torch path first).

    PYTHONPATH=. python bench/bench_activations.py [--artifacts artifacts [--compare DIR
        [--compare-fill N] [--compare-fill-ctas N]] [--masked]] [--tokens 8 64 512 4096]
        [--reps 50] [--compiled] [--json F]

--compiled also times `torch.compile(quantize_experts, fullgraph=True, dynamic=True)` (one
compile for every shape), after checking its bytes: what an engine that compiles its step gets.
The quantizer is one opaque custom op to Inductor (traced through, its Triton compile failed on
the H200, 2026-12-05), so this column checks that compiling works and costs what eager does.

--masked also times gg.quantize_masked with and without masked_m on DeepEP low-latency shapes
(E local experts, max_m the worst case, a few valid rows each): what skipping the masked rows
saves, beside the floor of the valid rows' bytes.

The torch path is torch operations (float64 rounding decisions): correct and sync-free, not a
fast kernel; the AOT kernel is what serving should run.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench", ROOT / "scripts"):
    sys.path.insert(0, str(p))

from bench_grouped import capture, measure_ceilings, time_graphs, time_interleaved

from runtime.activations import quantize_experts
from runtime.serving import sfa_rows_needed

# (the GEMM the activations feed, experts, K, top-k): each model's two expert-GEMM inputs.
LAYERS = (
    ("qwen3_30b_gateup", 128, 2048, 8),
    ("qwen3_30b_down", 128, 768, 8),
    ("dsv3_gateup_e256", 256, 7168, 8),
    ("dsv3_down_e256", 256, 2048, 8),
)
# The masked layout under DeepEP low-latency (--masked): (name, E, max_m, K, mean valid rows
# per expert). max_m is the worst case (tokens per rank x ranks), most rows are masked.
MASKED_CASES = (
    ("dsv3_gateup_ep8", 32, 256, 7168, 8),
    ("dsv3_gateup_ep8", 32, 1024, 7168, 32),
    ("qwen3_30b_gateup_ep8", 16, 512, 2048, 16),
)
SETS = 4
FAILED: list[str] = []  # why torch.compile(quantize_experts) failed, once it has


def routed_offs(tokens: int, experts: int, topk: int, seed: int) -> torch.Tensor:
    """int32 end offsets of `tokens` tokens each routed to topk distinct experts."""
    rng = random.Random(seed)
    counts = [0] * experts
    for _ in range(tokens):
        for g in rng.sample(range(experts), topk):
            counts[g] += 1
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()


@contextmanager
def _launch_plan(name: str, value: int | None) -> Iterator[None]:
    """runtime.quantize's launch-plan constant `name` set to value (None: left as it is) while
    checking and capturing: the grid is fixed at capture, so an A/B can give each variant its
    own plan."""
    import runtime.quantize as rq

    keep = getattr(rq, name)
    setattr(rq, name, keep if value is None else value)
    try:
        yield
    finally:
        setattr(rq, name, keep)


def _aot_graphs(gg: Any, sets: list, scales: torch.Tensor, want: tuple, label: str,
                plan: dict[str, int | None] | None = None) -> list:
    """gg's AOT quantizer captured once per input set, its bytes checked on the first, with
    runtime.quantize's launch-plan constants set as in `plan` (_launch_plan)."""
    with ExitStack() as stack:
        for name, value in (plan or {}).items():
            stack.enter_context(_launch_plan(name, value))
        got = gg.quantize_experts(*sets[0], scales)
        if any(not torch.equal(g.view(torch.uint8), w.view(torch.uint8))
               for g, w in zip(got, want)):
            raise SystemExit(f"{label}: the AOT quantizer's bytes differ")
        return [capture(lambda x=x, o=o: gg.quantize_experts(x, o, scales)) for x, o in sets]


def _masked_same(got: tuple, want: tuple, mask: torch.Tensor) -> bool:
    """Every scale byte equal, and the codes of each expert's rows below masked_m (the others
    are unspecified)."""
    rows = mask.clamp(0, got[0].shape[1]).tolist()
    return torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8)) and all(
        torch.equal(got[0][e, :m], want[0][e, :m]) for e, m in enumerate(rows))


def bench_case(name: str, experts: int, k: int, topk: int, tokens: int, reps: int,
               copy_gbs: float, compiled: Any = None, gg: Any = None,
               before: Any = None, before_plan: dict[str, int | None] | None = None) -> dict:
    t = tokens * topk
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    scales = torch.full((experts,), 0.01, dtype=torch.float32, device="cuda")
    sets = [((torch.randn(t, k, generator=gen, device="cuda") * 3).to(torch.bfloat16),
             routed_offs(tokens, experts, topk, seed=i)) for i in range(SETS)]
    graphs = [capture(lambda x=x, o=o: quantize_experts(x, o, scales)) for x, o in sets]
    us = time_graphs(graphs, reps)
    compiled_us = None if compiled is None else time_compiled(
        compiled, sets, scales, reps, f"{name} {tokens}")
    aot_us = before_us = None
    if gg is not None:
        want = quantize_experts(*sets[0], scales)
        variants = [_aot_graphs(q, sets, scales, want, f"{name} {tokens} {label}", plan)
                    for q, label, plan in ((gg, "--artifacts", None),
                                           (before, "--compare", before_plan))
                    if q is not None]
        times = [round(us, 1) for us in time_interleaved(variants, reps)]
        aot_us, before_us = times[0], (times[1] if before is not None else None)
    moved = t * k * 2 + t * k // 2 + sfa_rows_needed(t, experts) * (-(-k // 64) * 4)
    floor_us = moved / copy_gbs / 1e3  # copy_gbs counts read + write bytes, as `moved` does
    return {"layer": name, "experts": experts, "k": k, "tokens": tokens, "rows": t,
            "us": round(us, 1), "compiled_us": compiled_us, "aot_us": aot_us,
            "before_us": before_us,
            "floor_us": round(floor_us, 2), "floor_pct": round(100 * floor_us / us, 1),
            "aot_floor_pct": None if aot_us is None else round(100 * floor_us / aot_us, 1)}


def bench_masked(gg: Any, name: str, experts: int, max_m: int, k: int, mean: int, reps: int,
                 copy_gbs: float, caps: list[int], before: Any = None) -> dict:
    """gg.quantize_masked without and with masked_m (random counts of the given mean), each
    captured per input set and timed interleaved, the masked one's bytes checked against the
    torch path; its floor: read the valid rows, write their codes and all of sfa. `caps`:
    runtime.quantize.MASKED_CTAS_PER_SM values to time the masked call at (the launch plan
    is fixed at capture), the runtime's own first. `before` (--compare): its masked_m call
    too, when its quantizer takes masked_m."""
    import runtime.quantize as rq
    from runtime.activations import quantize_masked

    gen = torch.Generator(device="cuda").manual_seed(max_m)
    scales = torch.full((experts,), 0.01, dtype=torch.float32, device="cuda")
    sets = []
    for _ in range(SETS):
        x = (torch.randn(experts, max_m, k, generator=gen, device="cuda") * 3).to(torch.bfloat16)
        mask = torch.randint(0, 2 * mean + 1, (experts,), generator=gen, device="cuda",
                             dtype=torch.int32)
        sets.append((x, mask))
    x0, m0 = sets[0]
    want = quantize_masked(x0, scales, m0)
    other_caps = [c for c in caps if c != rq.MASKED_CTAS_PER_SM]
    old = before is not None and rq.quantizer_for(before, "masked", x0, experts, True)
    variants = [[capture(lambda x=x: gg.quantize_masked(x, scales)) for x, _ in sets]]
    runs = [(gg, None, "")] + [(gg, c, f" cap {c}") for c in other_caps]
    if old:
        runs.append((before, None, " --compare"))
    for q, cap, label in runs:
        with _launch_plan("MASKED_CTAS_PER_SM", cap):
            if not _masked_same(q.quantize_masked(x0, scales, m0), want, m0):
                raise SystemExit(f"{name} max_m {max_m}{label}: the masked quantizer's bytes "
                                 f"differ")
            variants.append([capture(lambda x=x, m=m, q=q: q.quantize_masked(x, scales, m))
                             for x, m in sets])
    times = time_interleaved(variants, reps)
    before_us = times.pop() if old else None
    full_us, masked_us, *other = times
    valid = sum(int(m.clamp(max=max_m).sum()) for _, m in sets) / SETS
    moved = valid * (k * 2 + k // 2) + experts * ((max_m + 127) // 128 * 128) * (-(-k // 64) * 4)
    floor_us = moved / copy_gbs / 1e3
    return {"layer": name, "experts": experts, "max_m": max_m, "k": k, "mean_rows": mean,
            "full_us": round(full_us, 1), "masked_us": round(masked_us, 1),
            "before_masked_us": None if before_us is None else round(before_us, 1),
            "caps": {str(c): round(us, 1) for c, us in zip(other_caps, other)},
            "floor_us": round(floor_us, 2), "floor_pct": round(100 * floor_us / masked_us, 1)}


def masked_table(rows: list[dict]) -> str:
    lines = ["| input of | E | max_m | K | mean masked_m | all rows us | masked_m before us | "
             "masked_m us | other caps us | floor us | % floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['layer']} | {r['experts']} | {r['max_m']} | {r['k']} | {r['mean_rows']} | "
              f"{r['full_us']} | {r['before_masked_us'] or '-'} | {r['masked_us']} | "
              f"{' '.join(f'{c}: {us}' for c, us in r['caps'].items()) or '-'} | "
              f"{r['floor_us']} | {r['floor_pct']} |" for r in rows]
    return "\n".join(lines)


def time_compiled(compiled: Any, sets: list, scales: torch.Tensor, reps: int,
                  label: str) -> float | None:
    """us per replay of the compiled quantizer on `sets`, after checking its bytes against
    eager on the first; None once torch.compile has failed (reported once, in FAILED)."""
    if FAILED:
        return None
    try:
        got = compiled(*sets[0], scales)
    except Exception as exc:  # Inductor / Triton failures: report once, time eager on
        FAILED.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}")
        print(f"torch.compile(quantize_experts) failed at {label}: {FAILED[0]}")
        return None
    want = quantize_experts(*sets[0], scales)
    if any(not torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want)):
        raise SystemExit(f"{label}: the compiled quantizer's bytes differ")
    graphs = [capture(lambda x=x, o=o: compiled(x, o, scales)) for x, o in sets]
    return round(time_graphs(graphs, reps), 1)


def table(rows: list[dict]) -> str:
    lines = ["| input of | E | K | tokens x k | torch path us | compiled us | AOT before us "
             "| AOT kernel us | bytes floor us | % floor (torch / AOT) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cell = {key: "-" if r.get(key) is None else r[key]
                for key in ("compiled_us", "before_us", "aot_us", "aot_floor_pct")}
        lines.append(f"| {r['layer']} | {r['experts']} | {r['k']} | {r['tokens']} x "
                     f"{r['rows'] // r['tokens']} | {r['us']} | {cell['compiled_us']} | "
                     f"{cell['before_us']} | {cell['aot_us']} | {r['floor_us']} | "
                     f"{r['floor_pct']} / {cell['aot_floor_pct']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 64, 512, 4096])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--compiled", action="store_true",
                    help="also time torch.compile(quantize_experts) (exactness checked first)")
    ap.add_argument("--artifacts", default=None,
                    help="also time these artifacts' AOT quantizer (gg.quantize_experts)")
    ap.add_argument("--compare", default=None, metavar="DIR",
                    help="with --artifacts: also time DIR's AOT quantizer, its replays "
                         "interleaved with those of --artifacts (a before/after A/B)")
    ap.add_argument("--compare-fill", type=int, default=None, metavar="N",
                    help="with --compare: the sfa-filling chunks per thread of the --compare "
                         "side's launches (default: the runtime's FILL_CHUNKS_PER_THREAD), "
                         "to A/B a build as shipped with its own launch plan")
    ap.add_argument("--compare-fill-ctas", type=int, default=None, metavar="N",
                    help="with --compare: the --compare side's filling CTAs per SM at most "
                         "(default: the runtime's FILL_CTAS_PER_SM), to A/B the cap")
    ap.add_argument("--masked", action="store_true",
                    help="with --artifacts: also time gg.quantize_masked with and without "
                         "masked_m on DeepEP low-latency shapes (MASKED_CASES)")
    ap.add_argument("--masked-caps", type=int, nargs="*", default=[], metavar="N",
                    help="with --masked: also time the masked_m call with these quantizing "
                         "CTAs per SM (runtime.quantize.MASKED_CTAS_PER_SM), interleaved")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.compare and not args.artifacts:
        ap.error("--compare needs --artifacts (the quantizer to compare it with)")
    if args.masked and not args.artifacts:
        ap.error("--masked needs --artifacts (it times the AOT quantizer)")
    if args.compare_fill is not None and (not args.compare or args.compare_fill < 1):
        ap.error(f"--compare-fill {args.compare_fill}: needs --compare and a count >= 1")
    if args.compare_fill_ctas is not None and (not args.compare or args.compare_fill_ctas < 1):
        ap.error(f"--compare-fill-ctas {args.compare_fill_ctas}: needs --compare and a count "
                 ">= 1")
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 1
    _, copy_gbs = measure_ceilings()
    compiled = (torch.compile(quantize_experts, fullgraph=True, dynamic=True)
                if args.compiled else None)
    gg = before = None
    if args.artifacts:
        import runtime

        gg = runtime.load(args.artifacts)
        before = runtime.load(args.compare) if args.compare else None
    before_plan = {"FILL_CHUNKS_PER_THREAD": args.compare_fill,
                   "FILL_CTAS_PER_SM": args.compare_fill_ctas}
    rows = [bench_case(name, e, k, topk, tok, args.reps, copy_gbs, compiled, gg, before,
                       before_plan)
            for name, e, k, topk in LAYERS for tok in args.tokens]
    masked = [bench_masked(gg, *case, args.reps, copy_gbs, args.masked_caps, before)
              for case in MASKED_CASES
              ] if args.masked else []
    print(f"copy rate {copy_gbs:.0f} GB/s (read + write)")
    print(table(rows))
    if masked:
        print(masked_table(masked))
    if FAILED:
        print(f"compiled: failed ({FAILED[0]})")
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_gbs": copy_gbs, "rows": rows,
                                               "masked": masked}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
