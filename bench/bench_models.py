"""Model benchmark (issues 26 and 27): the expert layers of real models through
gg.scaled_grouped_mm, side by side with what a user would run instead, in one process.

    PYTHONPATH=. python bench/bench_models.py --artifacts artifacts [--tokens 64 2048 ...]
        [--topk 8] [--only SET ...] [--all-layers] [--out-dtype bf16] [--reps 100] [--json F]
        [--compare DIR] [--list-api DIR]

Cases: each expert-layer set entry (dynamic m, E identical (n, k) groups) for this GPU and
output type, by default the model layers shapes.yaml declares with `experts:` (--all-layers:
every such set), at each T of --tokens: T tokens routed top-k (k = min(--topk, E)) over E
experts of skewed popularity (fixed seed), T * k rows sorted by expert, T capped by what the
kernel serves (rows <= max_m, rows * N < 2^31). Timed in one process on the same values:
  ours    gg.scaled_grouped_mm, offsets on the device, in a CUDA graph
  before  with --compare DIR: DIR's scaled_grouped_mm on the same inputs, replays interleaved
          with ours (bit-equality with ours checked)
  list    with --list-api DIR: the list API (gg.grouped_gemm, host tables) on DIR's set
          `<layer set>_list` (experiments/list_api.yaml: the default-options dynamic-m
          kernel, issue 26's "today's list-API kernel"), one group per expert (m = 0 ones
          too), on views of the same tensors, in a CUDA graph, its replays interleaved with
          ours; bit-equality with ours checked; x = list / ours; JSON list_us, list_same,
          list_kernel, or list_skip (why: no such set, or an expert past its max_m)
  own     when scaled_grouped_mm chose another set's kernel (a decode set's), the set's own
          kernel launched directly on the same inputs (bit-equality with ours checked)
  grp_mm  torch._grouped_mm bf16, device offsets, on pre-dequantized bf16 copies
  cublas  torch.mm per expert with tokens (host-known counts) on the bf16 copies
  fp8     torch._scaled_grouped_mm row-wise on e4m3 copies (exact: the values fit), scales 1;
          "n/a" where it does not run
  floors  fp4 bytes (weights + scales of the experts with tokens, A + scales, C) at the run's
          read bandwidth (sm_read_gbs, as issue 27 asks; until 2026-12-06 the copy bandwidth
          through the SMs, sm_copy_gbs, which JSON still records); FLOPs at its bf16 matmul
          rate (bench_grouped.measure_ceilings)
Protocol as bench_grouped (bench/RESULTS.md): graphs replayed in rotation over >= 4 input sets
(> 3x L2 together), CUDA-event medians, a spin kernel holding the GPU while replays are
enqueued. EXACT_DATA values (every fp32 sum exact): our output must equal torch._grouped_mm's
bit for bit, and the float64 reference on two experts: "exact", "close" (1e-2) or "MISMATCH"
(with --out-dtype f16 the baselines stay bf16: "close" at best).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench", ROOT / "scripts"):
    sys.path.insert(0, str(p))

from bench_grouped import L2_BYTES, capture, measure_ceilings, time_graphs, time_interleaved
from serving_check import Weights as DrawnWeights
from serving_check import draw_nvfp4, padded_blocked_scales

import runtime
from runtime.dispatch import KernelIndex, dynamic_groups
from runtime.errors import InputError, NoKernelError
from runtime.formats import MN_LIMIT, blocked_scale_numel, scale_cols
from runtime.nvfp4 import EXACT_DATA, check_close, dequantize_nvfp4, from_blocked
from runtime.nvfp4 import reference_grouped_gemm as reference
from runtime.serving import select_serving, sfa_rows_needed
from runtime.validate import OUT_TORCH_DTYPES

DEFAULT_TOKENS = (64, 128, 256, 512, 2048, 4096, 16384)
OUT = {"bf16": "bfloat16", "f16": "float16"}  # --out-dtype: manifest names

# ------------------------------------------------------------------ planning (CPU-tested)


@dataclass(frozen=True)
class Layer:
    entry: str  # the set entry's name
    set: str
    experts: int
    n: int
    k: int
    max_m: int | None


@dataclass(frozen=True)
class Case:
    layer: Layer
    tokens: int
    topk: int
    rows: int


def model_sets(spec: Path = ROOT / "shapes.yaml") -> list[str]:
    """The sets a shapes.yaml declares as model expert layers (`experts: E, n, k`)."""
    return [s["name"] for s in yaml.safe_load(spec.read_text())["sets"] if "experts" in s]


def expert_layers(entries: Any, arch: str, out_dtype: str,
                  sets: list[str] | None = None) -> list[Layer]:
    """Entries of `arch` and `out_dtype` that are expert layers (dynamic m, E >= 2 identical
    (n, k) groups; not the masked layout's: bench_masked.py times those), of `sets` when given,
    in manifest order."""
    out = []
    for e in entries:
        dyn = dynamic_groups(e)
        if (e.arch != arch or e.out_dtype != out_dtype or dyn is None or e.takes_masked
                or len(dyn[0]) < 2
                or len(set(dyn[0])) != 1 or (sets is not None and e.set not in sets)):
            continue
        out.append(Layer(e.name, e.set, len(dyn[0]), *dyn[0][0], dyn[1]))
    return out


def max_rows(layer: Layer) -> int:
    """Rows a call may have: <= max_m (a routing may give one expert all), rows * N < 2^31."""
    cap = (MN_LIMIT - 1) // layer.n
    return cap if layer.max_m is None else min(cap, layer.max_m)


def plan_cases(layers: list[Layer], tokens: list[int], topk: int) -> list[Case]:
    """(layer, tokens, k, rows) per layer and token count: k = min(topk, E), tokens capped so
    that rows = tokens * k fits max_rows; a capped duplicate is dropped."""
    cases = []
    for layer in layers:
        k = min(topk, layer.experts)
        seen = set()
        for t in tokens:
            t = min(t, max_rows(layer) // k)
            if t > 0 and t not in seen:
                seen.add(t)
                cases.append(Case(layer, t, k, t * k))
    return cases


def route(tokens: int, experts: int, topk: int, seed: int, skew: float = 1.0) -> list[int]:
    """Rows per expert when each token picks `topk` distinct experts, each drawn with a
    popularity weight exp(skew * N(0, 1)) fixed per expert (random.Random(seed): the same
    counts everywhere)."""
    rng = random.Random(seed)
    cum = list(itertools.accumulate(rng.lognormvariate(0.0, skew) for _ in range(experts)))
    counts = [0] * experts
    ids = range(experts)
    for _ in range(tokens):
        if topk >= experts:
            chosen: set[int] = set(ids)
        else:
            chosen = set()
            while len(chosen) < topk:
                chosen.add(rng.choices(ids, cum_weights=cum)[0])
        for g in chosen:
            counts[g] += 1
    return counts


def expert_weight_bytes(n: int, k: int) -> int:
    """One expert's packed fp4 weights and blocked scales."""
    return n * k // 2 + blocked_scale_numel(n, k)


def fp4_bytes(counts: list[int], n: int, k: int, out_bytes: int = 2) -> int:
    """Bytes a call must move at least: each expert with tokens' packed weights and blocked
    scales, every row's packed A and scales, and C."""
    rows, hit = sum(counts), sum(1 for c in counts if c)
    return hit * expert_weight_bytes(n, k) + rows * (k // 2 + k // 16) + rows * n * out_bytes


def mma_flops(counts: list[int], n: int, k: int) -> int:
    return 2 * sum(counts) * n * k  # padding rows aside


def layer_weight_bytes(layer: Layer) -> int:
    """Packed weights and blocked scales of all E experts."""
    return layer.experts * expert_weight_bytes(layer.n, layer.k)


def weight_sets(weight_bytes: int) -> int:
    """Weight copies in the rotation: > 3x L2 together, at most 16 (one E = 256 copy: 4 GB)."""
    return min(16, max(1, math.ceil(3 * L2_BYTES / weight_bytes)))


def hit_weight_bytes(counts: list[int], layer: Layer) -> int:
    """Packed weights and blocked scales of the experts with tokens: what a call reads, so what
    the rotation must keep out of L2 (all E experts' bytes overstate it at a few tokens)."""
    return sum(1 for c in counts if c) * expert_weight_bytes(layer.n, layer.k)


# Device memory the weight copies of one layer may take: each copy holds fp4, bf16 and fp8
# weights (3.6 bytes per weight; a DeepSeek-V3 E = 256 copy is 27 GB).
WEIGHT_BUDGET = 60 * 2**30


def layer_weight_copies(layer: Layer, case_counts: list[list[int]]) -> int:
    """Weight copies for a layer's cases: enough that the experts with tokens of every case
    rotate through more than 3x L2 (weight_sets of the fewest hit bytes), within
    WEIGHT_BUDGET. A case the budget leaves short is flagged in its row (weights_l2_cold)."""
    want = max(weight_sets(max(1, hit_weight_bytes(c, layer))) for c in case_counts)
    per_copy = layer.experts * layer.n * layer.k * 7 // 2  # 0.5 fp4 + 2 bf16 + 1 fp8
    return max(1, min(want, WEIGHT_BUDGET // per_copy))


def input_sets(weight_bytes: int, act_bytes: int) -> int:
    """Input sets in the rotation (set i uses weight copy i % weight_sets): >= 4, >= the weight
    copies, > 3x L2 in activations alone, at most 16."""
    return min(16, max(4, weight_sets(weight_bytes), math.ceil(3 * L2_BYTES / max(1, act_bytes))))


def expert_spans(counts: list[int], k: int) -> list[tuple[int, int, int, int]]:
    """Per expert of the serving layout, (first row, end row) of a and out and (first byte,
    end byte) of sfa: rows in expert order, each expert's blocked scales starting at row
    sum_{i<g} round_up(m_i, 128) (runtime/serving.py), so a slice is that expert's own blocked
    scales, the list API's sfa for the group (blocked_scale_numel(m, k) bytes, empty at m = 0)."""
    cols, rows, srow, out = scale_cols(k), 0, 0, []
    for m in counts:
        out.append((rows, rows + m, srow * cols, (srow + -(-m // 128) * 128) * cols))
        rows, srow = rows + m, srow + -(-m // 128) * 128
    return out


def list_set(layer: Layer) -> str:
    """The list-API set of a layer in experiments/list_api.yaml."""
    return f"{layer.set}_list"


def list_entry(index: KernelIndex, layer: Layer, counts: list[int], arch: str,
               out_dtype: str) -> tuple[Any, str]:
    """(the entry, "") when grouped_gemm on `index`'s artifacts runs the layer's list set for
    one group of m = counts[g] per expert (m = 0 included: dynamic-m kernels take it), else
    (None, why not)."""
    name, nk = list_set(layer), ((layer.n, layer.k),) * layer.experts
    own = [e for e in index.kernels if e.set == name and e.arch == arch
           and e.out_dtype == out_dtype]
    if not own:
        return None, f"no set {name} for {arch} {out_dtype}"
    dyn = dynamic_groups(own[0])
    if dyn is None or dyn[0] != nk or own[0].takes_offsets:
        return None, f"{name} is not a list-API dynamic-m set of {layer.experts} x (n, k) = " \
                     f"({layer.n}, {layer.k})"
    try:
        entry = index.select(tuple((m, layer.n, layer.k) for m in counts), arch, "", out_dtype)
    except (NoKernelError, InputError):  # an expert's rows past max_m
        return None, f"{name} serves m <= {dyn[1]} per expert, the busiest has {max(counts)}"
    if entry.set != name:  # another set of the same (n, k) list comes first in the manifest
        return None, f"grouped_gemm would run {entry.name}, not {name}"
    return entry, ""


def verdict(exact: bool, close: bool) -> str:
    return "exact" if exact else "close" if close else "MISMATCH"


# ------------------------------------------------------------------ GPU work


def sm_copy_gbs() -> float:
    """Device copy bandwidth in GB/s (read + write) through the SMs: 1 GiB of int32 copied by an
    elementwise kernel in a graph. bench_grouped's copy_ in a graph becomes a memcpy node that
    the copy engines run: 2.77 TB/s on the H200 against 4.24 through the SMs (2026-12-04)."""
    src = torch.empty(2**28, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    return 2 * 2**30 / time_graphs([capture(lambda: torch.bitwise_not(src, out=dst))], 30) / 1e3


def sm_read_gbs() -> float:
    """Device read bandwidth in GB/s: 1 GiB of float32 summed by torch's reduction kernel in a
    graph (it reads the bytes and writes one value): the rate a decode GEMM, which mostly
    reads weights, can reach at best."""
    src = torch.ones(2**28, dtype=torch.float32, device="cuda")
    return 2**30 / time_graphs([capture(lambda: src.sum())], 30) / 1e3


def dequant_rows(packed: torch.Tensor, plain: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """bf16 of NVFP4 rows (exact), in chunks (the float32 temporary of 131072 x 7168 is 4 GB)."""
    out = torch.empty(packed.shape[0], packed.shape[1] * 2, dtype=torch.bfloat16,
                      device=packed.device)
    for i in range(0, packed.shape[0], chunk):
        out[i:i + chunk] = dequantize_nvfp4(packed[i:i + chunk], plain[i:i + chunk])
    return out


class Weights:
    """One copy of a layer's weights: fp4 b (E, N, K/2) and blocked sfb (serving_check's draw),
    a bf16 copy (E, N, K) and, once asked for, an e4m3 copy."""

    def __init__(self, layer: Layer, seed: int) -> None:
        w = DrawnWeights(layer.experts, layer.n, layer.k, seed=seed)
        self.b, self.sfb, self.fp8 = w.b, w.sfb, None
        self.bf16 = torch.empty(*w.b.shape[:2], layer.k, dtype=torch.bfloat16, device="cuda")
        for g in range(layer.experts):
            self.bf16[g] = dequant_rows(w.b[g], from_blocked(w.sfb[g], layer.n, layer.k))


def make_inputs(layer: Layer, counts: list[int], seed: int) -> dict:
    """One input set's tokens: fp4 a, sfa in torch's padded 2D x 3D layout, a bf16 copy."""
    rows = sum(counts)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, s = draw_nvfp4(rows, layer.k, gen, EXACT_DATA["scale_exp"])
    sfa = torch.zeros(sfa_rows_needed(rows, layer.experts) * scale_cols(layer.k),
                      dtype=torch.uint8, device="cuda")
    blocked = padded_blocked_scales(s.view(torch.uint8), counts)
    sfa[:blocked.numel()] = blocked
    return {"a": a, "sfa": sfa, "bf16": dequant_rows(a, s)}


def reference_ok(out: torch.Tensor, w: Weights, inp: dict, counts: list[int],
                 layer: Layer) -> tuple[bool, int]:
    """out's rows of the first and the busiest expert against the float64 reference rounded
    to out's type: (all equal, experts checked)."""
    spans = expert_spans(counts, layer.k)
    hit = [g for g, m in enumerate(counts) if m]
    picked = sorted({hit[0], max(hit, key=lambda g: counts[g])}) if hit else []
    for g in picked:
        s, e, p, q = spans[g]
        ref = reference([inp["a"][s:e]], [w.b[g]], [inp["sfa"][p:q]], [w.sfb[g]],
                        [(e - s, layer.n, layer.k)], out_dtype=out.dtype)
        if not torch.equal(out[s:e], ref[0]):
            return False, len(picked)
    return True, len(picked)


def same_and_close(x: torch.Tensor, y: torch.Tensor, chunk: int = 8192) -> tuple[bool, bool]:
    """(bit-identical, close at rtol = atol = 1e-2), compared in row chunks (float64 copies of
    a 131072 x 4096 output would be 4 GB each)."""
    if torch.equal(x, y):
        return True, True
    return False, all(check_close(x[i:i + chunk].double(), y[i:i + chunk].double(),
                                  rtol=1e-2, atol=1e-2)[0] for i in range(0, len(x), chunk))


def bench_case(gg: Any, case: Case, wsets: list[Weights], ceilings: tuple[float, ...],
               out_name: str, reps: int, seed: int, before: Any = None,
               listed: Any = None) -> dict:
    # ceilings: bf16 TFLOP/s, read GB/s (the fp4 floor's), copy GB/s
    layer, (tflops, gbs), dtype = case.layer, ceilings[:2], OUT_TORCH_DTYPES[out_name]
    arch = gg.device_runtime().arch
    rows, n, k = case.rows, layer.n, layer.k
    counts = route(case.tokens, layer.experts, case.topk, seed)
    hit_bytes = hit_weight_bytes(counts, layer)
    n_sets = input_sets(hit_bytes, rows * (k // 2 + k // 16))
    inputs = [make_inputs(layer, counts, seed * 100 + i) for i in range(n_sets)]
    w_of = [wsets[i % len(wsets)] for i in range(n_sets)]
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    row: dict[str, Any] = {
        **asdict(case.layer), "tokens": case.tokens, "topk": case.topk, "rows": rows,
        "input_sets": n_sets, "weight_sets": len(wsets), "experts_hit": sum(map(bool, counts)),
        # The rotation's weights of the experts with tokens exceed 3x L2: every replay reads
        # them from DRAM (False: some come from L2, and ours and the baselines' differ there).
        "weights_l2_cold": hit_bytes * min(len(wsets), n_sets) >= 3 * L2_BYTES,
        "max_per_expert": max(counts), "counts": counts,
        "fp4_floor_us": fp4_bytes(counts, n, k, dtype.itemsize) / (gbs * 1e3),
        "mma_floor_us": mma_flops(counts, n, k) / (tflops * 1e6),
        "kernel": select_serving(gg.kernels, arch, layer.experts, n, k, rows, out_name).name}
    graphs, outs = capture_each(lambda i, w, o: gg.scaled_grouped_mm(
        i["a"], w.b, i["sfa"], w.sfb, offs, out=o), inputs, w_of, rows, n, dtype)
    before_kernel = None
    if before is not None:
        try:
            before_kernel = select_serving(before.kernels, arch, layer.experts, n, k, rows,
                                           out_name).name
        except NoKernelError:  # a layer the other artifacts do not declare: no before_us
            before = None
    # Variants timed together, replays interleaved (one process, one clock state): JSON key
    # -> (graphs, the outputs they write); each output is checked against ours after timing.
    variants: dict[str, tuple[list, list]] = {"ours_us": (graphs, outs)}
    if before is not None:
        # --compare: the other artifacts' scaled_grouped_mm on the same inputs.
        variants["before_us"] = capture_each(lambda i, w, o: before.scaled_grouped_mm(
            i["a"], w.b, i["sfa"], w.sfb, offs, out=o), inputs, w_of, rows, n, dtype)
        row["before_kernel"] = before_kernel
    if listed is not None:
        # --list-api: the list API's kernel for the layer on the same inputs.
        entry, why = list_entry(listed.index, layer, counts, arch, out_name)
        if entry is None:
            row["list_skip"] = why
        else:
            variants["list_us"] = capture_each(list_call(listed, expert_spans(counts, k)),
                                               inputs, w_of, rows, n, dtype)
            row["list_kernel"] = entry.name
    row.update(zip(variants, time_interleaved([g for g, _ in variants.values()], reps)))
    for key in [*variants][1:]:  # popped: their graphs and outputs freed before the baselines
        row[key.replace("_us", "_same")] = same_as_ours(*variants.pop(key), graphs, outs)
    ours = fresh_replay(graphs[-1], outs[-1])  # the last set's output, for the checks
    del graphs
    row["own_us"] = float("nan")
    if row["kernel"] != layer.entry:
        # scaled_grouped_mm chose another set's kernel (a decode kernel): time the set's own
        # kernel too, launched directly, on the same inputs (an A/B in one process).
        own_entry = next(e for e in gg.kernels if e.name == layer.entry)
        rt = gg.device_runtime()
        op = rt.offsets_plan(own_entry, layer.experts, n, k, rows)
        own_outs = [torch.empty(rows, n, dtype=dtype, device="cuda") for _ in inputs]

        def own(i: dict, w: Weights, o: torch.Tensor) -> None:
            rt.launch_offsets(op, (offs.data_ptr(), i["a"].data_ptr(), w.b.data_ptr(),
                                   i["sfa"].data_ptr(), w.sfb.data_ptr(), o.data_ptr()), 0)

        graphs = [capture(lambda i=i, w=w, o=o: own(i, w, o))
                  for i, w, o in zip(inputs, w_of, own_outs)]
        row["own_us"] = time_graphs(graphs, reps)
        fresh_replay(graphs[-1], own_outs[-1])
        row["own_same"] = bool(torch.equal(own_outs[-1][:sum(counts)], ours[:sum(counts)]))
        del graphs, own_outs
    del outs
    ref_ok, n_ref = reference_ok(ours, w_of[-1], inputs[-1], counts, layer)
    row["grouped_mm_us"], theirs = time_grouped_mm(inputs, w_of, offs, reps)
    same, close = same_and_close(ours, theirs)
    row["check"] = verdict(same and ref_ok, close and ref_ok)
    row["check_detail"] = f"== torch._grouped_mm: {same}; float64 reference on {n_ref} " \
                          f"experts: {ref_ok}"
    del ours, theirs
    hit = [(g, s, s + m) for g, (s, m) in enumerate(zip(itertools.accumulate([0, *counts]),
                                                         counts)) if m]
    c_outs = [torch.empty(rows, n, dtype=torch.bfloat16, device="cuda") for _ in inputs]

    def cublas(x: torch.Tensor, w: torch.Tensor, o: torch.Tensor) -> None:
        for g, s, e in hit:
            torch.mm(x[s:e], w[g].t(), out=o[s:e])

    row["cublas_us"] = time_graphs([capture(lambda i=i, w=w, o=o: cublas(i["bf16"], w.bf16, o))
                                    for i, w, o in zip(inputs, w_of, c_outs)], reps)
    del c_outs
    row.update(time_fp8_grouped(inputs, wsets, w_of, offs, rows, layer.experts, n, reps))
    return row


def capture_each(call: Any, inputs: list[dict], w_of: list, rows: int, n: int,
                 dtype: torch.dtype) -> tuple[list, list]:
    """One graph per input set of call(inputs, weights, out) and the (rows, N) outputs they
    write."""
    outs = [torch.empty(rows, n, dtype=dtype, device="cuda") for _ in inputs]
    return [capture(lambda i=i, w=w, o=o: call(i, w, o))
            for i, w, o in zip(inputs, w_of, outs)], outs


def fresh_replay(graph: torch.cuda.CUDAGraph, out: torch.Tensor) -> torch.Tensor:
    """`out` written by `graph` alone: NaN first, since capture()'s eager warm-up call already
    wrote the right values into it (a graph that wrote nothing would still pass)."""
    out.fill_(float("nan"))
    graph.replay()
    return out


def same_as_ours(v_graphs: list, v_outs: list, graphs: list, outs: list) -> bool:
    """Whether a variant's outputs of the last two input sets equal ours, each freshly written
    by its graph (the kernels are exact: a correct variant's is bit-identical)."""
    return all(bool(torch.equal(fresh_replay(v_graphs[i], v_outs[i]),
                                fresh_replay(graphs[i], outs[i])))
               for i in range(max(-2, -len(graphs)), 0))


def list_call(listed: Any, spans: list[tuple[int, int, int, int]]) -> Any:
    """call(inputs, weights, out) running the list API (`listed.grouped_gemm`) with one group
    per expert on views of the stacked tensors: a's and out's expert rows, b[g], sfb[g] and
    expert g's blocked sfa rows (expert_spans), all contiguous and 16-byte aligned (rows of
    K/2 and 2N bytes, scale slices at 128-row boundaries); m = 0 experts as empty groups. The
    views are made when the graph is captured (grouped_gemm plans its host tables then, once);
    a replay runs the kernel alone, as ours does."""
    def call(i: dict, w: Weights, o: torch.Tensor) -> None:
        listed.grouped_gemm([i["a"][s:e] for s, e, _, _ in spans], list(w.b),
                            [i["sfa"][p:q] for _, _, p, q in spans], list(w.sfb),
                            out=[o[s:e] for s, e, _, _ in spans])
    return call


def time_grouped_mm(inputs: list[dict], w_of: list, offs: torch.Tensor,
                    reps: int) -> tuple[float, torch.Tensor]:
    """torch._grouped_mm bf16 on each input set's rows (`"bf16"`, grouped by expert as offs
    says) and its weight copy: (median us, the last set's output). mat_b (E, K, N) is the
    transposed view of the (E, N, K) copy; a graph's output lives in its pool, read after a
    replay."""
    res: list[Any] = [None] * len(inputs)

    def grouped(j: int) -> None:
        res[j] = torch._grouped_mm(inputs[j]["bf16"], w_of[j].bf16.transpose(1, 2), offs=offs)

    graphs = [capture(lambda j=j: grouped(j)) for j in range(len(inputs))]
    us = time_graphs(graphs, reps)
    fresh_replay(graphs[-1], res[-1])  # NaN first: the output holds capture's warm-up values
    torch.cuda.synchronize()
    return us, res[-1]


def time_fp8_grouped(inputs: list[dict], wsets: list, w_of: list, offs: torch.Tensor,
                     rows: int, experts: int, n: int, reps: int) -> dict[str, Any]:
    """torch._scaled_grouped_mm row-wise fp8 on e4m3 copies of the same values (exact: they
    fit), scales of 1 per row of a and per column of b: {"fp8_us"}, or NaN and "fp8_error"
    where this torch or GPU has no fp8 grouped GEMM."""
    try:
        for w in wsets:
            w.fp8 = w.bf16.to(torch.float8_e4m3fn) if w.fp8 is None else w.fp8
        one_a = torch.ones(rows, dtype=torch.float32, device="cuda")
        one_b = torch.ones(experts, n, dtype=torch.float32, device="cuda")
        a8 = [i["bf16"].to(torch.float8_e4m3fn) for i in inputs]
        return {"fp8_us": time_graphs([capture(lambda x=x, w=w: torch._scaled_grouped_mm(
            x, w.fp8.transpose(-2, -1), one_a, one_b, offs=offs, out_dtype=torch.bfloat16))
            for x, w in zip(a8, w_of)], reps)}
    except Exception as exc:  # not every torch / GPU has the fp8 grouped GEMM
        return {"fp8_us": float("nan"), "fp8_error": str(exc).splitlines()[0][:200]}


def fmt(x: float, digits: int = 1) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def table(rows: list[dict]) -> str:
    compare = any("before_us" in r for r in rows)
    listed = any("list_us" in r or "list_skip" in r for r in rows)
    head = ("| layer | E | N | K | tokens x k | rows | experts hit | ours us | "
            + ("before us | " if compare else "") + ("list us | x | " if listed else "")
            + "own kernel us | "
            "grp_mm us | x | cuBLAS us | x | fp8 us | x | fp4 floor us | % | MMA floor us | % "
            "| check |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        o, run_by = r["ours_us"], r["kernel"].split(".")[0]  # scaled_grouped_mm's choice
        name = r["set"] if run_by == r["set"] else f"{r['set']} (run by {run_by})"
        cells = [name, r["experts"], r["n"], r["k"], f"{r['tokens']} x {r['topk']}", r["rows"],
                 r["experts_hit"], fmt(o)]
        if compare:
            cells.append(fmt(r.get("before_us", float("nan")))
                         + ("" if r.get("before_same", True) else " (DIFFERS)"))
        if listed:  # x = list / ours, as the baselines' (> 1: ours faster)
            lu = r.get("list_us", float("nan"))
            cells += [fmt(lu) + ("" if r.get("list_same", True) else " (DIFFERS)"),
                      fmt(lu / o, 2)]
        cells += [fmt(r.get("own_us", float("nan")))
                 + ("" if r.get("own_same", True) else " (DIFFERS)")]
        for key in ("grouped_mm_us", "cublas_us", "fp8_us"):  # time, x = theirs / ours
            cells += [fmt(r[key]), fmt(r[key] / o, 2)]
        for key in ("fp4_floor_us", "mma_floor_us"):  # floor, % = floor / ours
            cells += [fmt(r[key]), fmt(100 * r[key] / o, 0)]
        warm = "" if r.get("weights_l2_cold", True) else " (weights partly L2-warm)"
        lines.append("| " + " | ".join(map(str, [*cells, r["check"] + warm])) + " |")
    return "\n".join(lines)


# Issue 27's decode-sized cases: at most this many rows per expert on average (T * k / E).
DECODE_ROWS_PER_EXPERT = 32


def _decode_sized(r: dict) -> bool:
    return r["rows"] <= DECODE_ROWS_PER_EXPERT * r["experts"]


def decode_summary(rows: list[dict]) -> str:
    """Issue 27's done-when over this run's decode-sized calls: how many reach 70% of the
    fp4-bytes floor, 2.5x torch._grouped_mm bf16, and beat fp8 row-wise (a call without an
    fp8 time does not). A layer's tier sets are timed at their own bounds and at the common
    token counts, so several rows can be the same call (the same E, N, K and rows, dispatched
    to the same kernel): each call counts once, by its first row."""
    dec = _distinct_calls([r for r in rows if _decode_sized(r)])
    if not dec:
        return f"decode-sized cases (<= {DECODE_ROWS_PER_EXPERT} rows per expert): none in this run"
    floor = sum(100 * r["fp4_floor_us"] / r["ours_us"] >= 70 for r in dec)
    bf16 = sum(r["grouped_mm_us"] / r["ours_us"] >= 2.5 for r in dec)
    fp8 = sum(r["fp8_us"] > r["ours_us"] for r in dec)  # NaN compares False
    warm = sum(not r.get("weights_l2_cold", True) for r in dec)
    return (f"decode-sized cases (<= {DECODE_ROWS_PER_EXPERT} rows per expert): {len(dec)} "
            f"distinct calls; "
            f">= 70% of the fp4-bytes floor: {floor}; >= 2.5x _grouped_mm: {bf16}; faster "
            f"than fp8 row-wise: {fp8}" + (f"; {warm} with weights partly L2-warm" if warm
                                            else ""))


def _distinct_calls(rows: list[dict]) -> list[dict]:
    """One row per call (the same E, N, K and rows; a layer's tier sets time the same call
    through scaled_grouped_mm at the common token counts), the first of each."""
    calls: dict[tuple, dict] = {}
    for r in rows:
        calls.setdefault((r["experts"], r.get("n"), r.get("k"), r["rows"]), r)
    return list(calls.values())


def compare_summary(rows: list[dict], extremes: int = 3) -> str:
    """--compare's verdict: per part (decode-sized, prefill-sized), the geomean of ours / before
    time over the distinct calls both timed (below 1: ours faster), its range, the calls
    whose outputs differ, and the `extremes` calls at each end."""
    timed = _distinct_calls([r for r in rows if "before_us" in r])
    untimed = sum("before_us" not in r for r in rows)
    lines = [f"A/B against --compare (time ours / before, < 1: ours faster; each call once): "
             f"{len(timed)} calls, {untimed} case(s) the other artifacts do not serve"]
    for part, test in (("decode-sized", True), ("prefill-sized", False)):
        calls = [r for r in timed if _decode_sized(r) == test]
        if not calls:
            continue
        ratios = sorted(((r["ours_us"] / r["before_us"], r) for r in calls), key=lambda x: x[0])
        geo = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
        differ = sum(not r.get("before_same", True) for r in calls)
        lines.append(f"  {part}: {len(calls)} calls, geomean {geo:.3f} ({ratios[0][0]:.3f}-"
                     f"{ratios[-1][0]:.3f}); outputs differ on {differ}")
        ends = ratios if len(ratios) <= 2 * extremes else ratios[:extremes] + ratios[-extremes:]
        lines += [f"    {x:.3f} {r['set']} T={r['tokens']}: ours {fmt(r['ours_us'])} us, before "
                  f"{fmt(r['before_us'])}" for x, r in ends]
    return "\n".join(lines)


def list_summary(rows: list[dict]) -> str:
    """Issue 26's claim on the cases with a list-API time: on how many ours is not slower,
    and each one where it is slower or its output differs."""
    timed = [r for r in rows if "list_us" in r]
    bad = [r for r in timed if r["ours_us"] > r["list_us"] or not r.get("list_same", True)]
    lines = [f"ours vs the list API: not slower on "
             f"{sum(r['ours_us'] <= r['list_us'] for r in timed)} of {len(timed)} cases "
             f"({sum('list_skip' in r for r in rows)} skipped)"]
    lines += [f"  {r['set']} T={r['tokens']}: ours {fmt(r['ours_us'])} us, list "
              f"{fmt(r['list_us'])}" + ("" if r.get("list_same", True) else ", outputs DIFFER")
              for r in bad]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default=str(ROOT / "artifacts"))
    ap.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS))
    ap.add_argument("--topk", type=int, default=8, help="experts per token (capped at E)")
    ap.add_argument("--only", nargs="+", metavar="SET", help="these sets only")
    ap.add_argument("--all-layers", action="store_true",
                    help="every dynamic-m set of identical (n, k) groups, not only the models")
    ap.add_argument("--out-dtype", choices=sorted(OUT), default="bf16")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--compare", metavar="DIR",
                    help="also time these artifacts' scaled_grouped_mm on every case, its "
                         "replays interleaved with ours (a before/after A/B in one run)")
    ap.add_argument("--list-api", metavar="DIR",
                    help="also time the list API (grouped_gemm, one group per expert) on each "
                         "layer's set <set>_list of these artifacts (experiments/list_api.yaml),"
                         " its replays interleaved with ours")
    args = ap.parse_args()
    if args.topk < 1 or any(t < 1 for t in args.tokens):
        ap.error("--topk and --tokens must be positive")
    gg = runtime.load(args.artifacts)
    before = runtime.load(args.compare) if args.compare else None
    listed = runtime.load(args.list_api) if args.list_api else None
    arch = gg.device_runtime().arch
    names = args.only or (None if args.all_layers else model_sets())
    layers = expert_layers(gg.kernels, arch, OUT[args.out_dtype], names)
    cases = plan_cases(layers, args.tokens, args.topk)
    if not cases:
        print(f"no expert-layer set entry for {arch} and {args.out_dtype} (sets: {names})")
        return 1
    ceilings = (measure_ceilings()[0], sm_read_gbs(), sm_copy_gbs())
    print(f"{torch.cuda.get_device_name()}: bf16 matmul {ceilings[0]:.0f} TFLOP/s, read "
          f"{ceilings[1]:.0f} GB/s (the fp4 floor's), copy {ceilings[2]:.0f} GB/s (read + "
          f"write, through the SMs); {len(cases)} cases", flush=True)
    rows = []
    for layer, group in itertools.groupby(cases, key=lambda c: c.layer):
        group = list(group)
        copies = layer_weight_copies(
            layer, [route(c.tokens, layer.experts, c.topk, args.seed) for c in group])
        wsets = [Weights(layer, args.seed + j) for j in range(copies)]
        for case in group:
            torch.cuda.empty_cache()
            try:
                r = bench_case(gg, case, wsets, ceilings, OUT[args.out_dtype], args.reps,
                               args.seed, before, listed)
                lst = ""
                if "list_us" in r:
                    lst = f", list {fmt(r['list_us'])}" + ("" if r["list_same"] else " DIFF")
                elif "list_skip" in r:
                    lst = f", list skipped: {r['list_skip']}"
                print(f"  {layer.set} T={case.tokens}: ours {r['ours_us']:.1f} us, grouped_mm "
                      f"{r['grouped_mm_us']:.1f}, cuBLAS {r['cublas_us']:.1f}, fp8 "
                      f"{fmt(r['fp8_us'])}{lst} ({r['check']})", flush=True)
            except Exception as exc:
                print(f"  {layer.entry} T={case.tokens}: FAILED {type(exc).__name__}: {exc}")
                r = {**asdict(layer), "tokens": case.tokens, "error": str(exc)[:300]}
            rows.append(r)
        del wsets
        torch.cuda.empty_cache()
    done = [r for r in rows if "error" not in r]
    print(f"\n{torch.cuda.get_device_name()}, {arch}, {args.out_dtype} out, top-{args.topk}, "
          f"reps {args.reps}\n")
    print(table(done))
    if before is not None:
        print(compare_summary(done))
    print(decode_summary(done))
    if listed is not None:
        print(list_summary(done))
    for r in rows:
        if "error" in r:
            print(f"FAILED {r['entry']} T={r['tokens']}: {r['error']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"ceilings": ceilings, "rows": rows}, indent=1))
    return 0 if done and len(done) == len(rows) and all(
        r["check"] != "MISMATCH" for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
