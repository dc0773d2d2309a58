"""bench/bench_models.py's CPU-side planning: which set entries are model expert layers, the
cases (token counts capped by what the kernel serves), the routing, the floors' arithmetic and
the rotation sizes, and that the script imports and answers --help without a GPU."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))
import bench_models as bm
from serving_check import padded_blocked_scales

from builder.families import load_families
from builder.spec import load_spec
from runtime.dispatch import KernelIndex
from runtime.formats import blocked_scale_numel
from runtime.manifest import Serves
from runtime.nvfp4 import to_blocked
from runtime.serving import sfa_rows_needed
from runtime.validate import check_structure

L2 = 50 * 2**20


def entry(name: str, groups, arch="sm_90a", dtype="bfloat16", dynamic=True, max_m=None,
          masked=False, offsets=False):
    return SimpleNamespace(name=f"{name}.{arch}.{dtype}", set=name, arch=arch, out_dtype=dtype,
                           takes_masked=masked, takes_offsets=offsets,
                           serves=Serves(groups=tuple(tuple(g) for g in groups),
                                         dynamic_m=dynamic, max_m=max_m))


def test_model_sets_are_the_specs_experts_sets(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("schema_version: 1\nsets:\n"
                    "  - {name: a, experts: 8, n: 256, k: 512}\n"
                    "  - {name: b, m: dynamic, groups: [[256, 512], [256, 512]]}\n"
                    "  - {name: c, experts: 4, n: 128, k: 256}\n")
    assert bm.model_sets(spec) == ["a", "c"]
    assert {"dsv3_gateup_e256", "dsv3_down_e256"} <= set(bm.model_sets())


def test_expert_layers_are_dynamic_sets_of_identical_groups() -> None:
    entries = [
        entry("layer", [(256, 512)] * 4, max_m=300),
        entry("layer", [(256, 512)] * 4, dtype="float16"),
        entry("layer", [(256, 512)] * 4, arch="sm_100a"),
        entry("mixed", [(256, 512), (512, 512)]),
        entry("single", [(256, 512)]),
        entry("exact", [(8, 256, 512)] * 4, dynamic=False),
        entry("other", [(1024, 2048)] * 16),
        entry("masked", [(256, 512)] * 4, masked=True),  # bench_masked.py's, not a layer here
    ]
    got = bm.expert_layers(entries, "sm_90a", "bfloat16")
    assert got == [bm.Layer("layer.sm_90a.bfloat16", "layer", 4, 256, 512, 300),
                   bm.Layer("other.sm_90a.bfloat16", "other", 16, 1024, 2048, None)]
    assert [x.set for x in bm.expert_layers(entries, "sm_90a", "bfloat16", ["other"])] == \
        ["other"]
    assert [x.set for x in bm.expert_layers(entries, "sm_90a", "float16")] == ["layer"]


def test_cases_cap_rows_by_what_the_kernel_serves() -> None:
    wide = bm.Layer("w", "w", 8, 28672, 4096, None)  # rows * 28672 < 2^31: rows <= 74898
    assert bm.max_rows(wide) == 74898
    assert [(c.tokens, c.topk, c.rows) for c in bm.plan_cases([wide], [64, 16384], 8)] == \
        [(64, 8, 512), (9362, 8, 74896)]
    bounded = bm.Layer("b", "b", 4, 256, 512, 1000)  # max_m 1000; topk capped at E = 4
    assert bm.max_rows(bounded) == 1000
    assert [(c.tokens, c.topk, c.rows) for c in bm.plan_cases([bounded], [64, 300, 400], 8)] \
        == [(64, 4, 256), (250, 4, 1000)]  # 300 and 400 both capped to 250: once
    two = bm.plan_cases([wide, bounded], [64], 2)
    assert [(c.layer.set, c.rows) for c in two] == [("w", 128), ("b", 128)]


def test_routing_is_top_k_distinct_experts_and_reproducible() -> None:
    counts = bm.route(10, 8, 3, seed=1)
    assert counts == [3, 2, 6, 5, 3, 9, 1, 1]
    assert bm.route(10, 8, 3, seed=1) == counts
    assert bm.route(10, 8, 3, seed=2) != counts
    big = bm.route(2048, 256, 8, seed=26)
    assert sum(big) == 2048 * 8 and max(big) <= 2048
    assert max(big) > 4 * 2048 * 8 / 256  # skewed: the busiest expert is well above the mean
    assert bm.route(5, 4, 8, seed=0) == [5, 5, 5, 5]  # k >= E: every token on every expert
    flat = bm.route(4096, 16, 2, seed=3, skew=0.0)  # equal popularity
    assert sum(flat) == 8192 and max(flat) - min(flat) < 200


def test_floors_count_the_experts_with_tokens() -> None:
    # Two experts hit (256 x 512: 65536 weight bytes + 256 * 32 blocked scale bytes each), four
    # rows of A (256 + 32 bytes each) and C (4 x 256 bf16).
    assert bm.fp4_bytes([0, 3, 1], 256, 512) == 2 * (65536 + 8192) + 4 * 288 + 4 * 256 * 2
    assert bm.fp4_bytes([0, 3, 1], 256, 512) == 150656
    assert bm.fp4_bytes([0, 0], 256, 512) == 0
    assert bm.mma_flops([0, 3, 1], 256, 512) == 2 * 4 * 256 * 512
    assert bm.layer_weight_bytes(bm.Layer("x", "x", 256, 7168, 2048, None)) == \
        256 * (7168 * 1024 + 7168 * 128)


def test_rotation_sizes() -> None:
    e256 = bm.layer_weight_bytes(bm.Layer("x", "x", 256, 4096, 7168, None))
    assert bm.weight_sets(e256) == 1  # 4.2 GB: one copy
    assert bm.weight_sets(56_623_104) == math.ceil(3 * L2 / 56_623_104) == 3
    assert bm.weight_sets(1000) == 16
    assert bm.input_sets(e256, 1_000_000) == 16  # decode: small activations, many sets
    assert bm.input_sets(e256, 470_000_000) == 4  # prefill: at least 4
    assert bm.input_sets(56_623_104, 100_000_000) == 4
    assert bm.input_sets(20_000_000, 470_000_000) == 8  # as many as the weight copies


def test_verdict_and_table() -> None:
    assert [bm.verdict(True, True), bm.verdict(False, True), bm.verdict(False, False)] == \
        ["exact", "close", "MISMATCH"]
    row = {"set": "s", "experts": 8, "n": 256, "k": 512, "tokens": 64, "topk": 8, "rows": 512,
           "experts_hit": 7, "ours_us": 10.0, "grouped_mm_us": 25.0, "cublas_us": 20.0,
           "fp8_us": float("nan"), "fp4_floor_us": 5.0, "mma_floor_us": 2.5, "check": "exact",
           "kernel": "s.sm_90a.acc1.bf16"}
    head, rule, line = bm.table([row]).splitlines()
    assert head.count("|") == rule.count("|") == line.count("|")
    assert line == ("| s | 8 | 256 | 512 | 64 x 8 | 512 | 7 | 10.0 | n/a | 25.0 | 2.50 | 20.0 "
                    "| 2.00 | n/a | n/a | 5.0 | 50 | 2.5 | 25 | exact |")
    # A call that scaled_grouped_mm serves with another set's kernel (a decode set) says so,
    # with the set's own kernel's time beside it, and whether its output differed.
    line = bm.table([{**row, "kernel": "s_decode.sm_90a.acc1.bf16", "own_us": 30.0,
                      "own_same": False}]).splitlines()[2]
    assert line.startswith("| s (run by s_decode) | 8 | 256 | 512 | 64 x 8 | 512 | 7 | 10.0 | "
                           "30.0 (DIFFERS) | 25.0 |")


def test_expert_spans_are_each_experts_rows_and_blocked_scales() -> None:
    # k = 512: 32 scale bytes per blocked row; experts padded to 128 scale rows, m = 0 empty.
    assert bm.expert_spans([3, 0, 130], 512) == [(0, 3, 0, 4096), (3, 3, 4096, 4096),
                                                 (3, 133, 4096, 12288)]
    counts = bm.route(300, 16, 4, seed=5)
    spans = bm.expert_spans(counts, 2880)
    assert spans[-1][1] == sum(counts)
    assert spans[-1][3] <= sfa_rows_needed(sum(counts), 16) * 180  # inside the serving sfa
    for (s, e, p, q), m in zip(spans, counts):
        assert e - s == m and q - p == blocked_scale_numel(m, 2880)


def test_list_call_passes_views_the_list_api_accepts() -> None:
    """The list call's per-expert tensors on the CPU: what grouped_gemm's structure checks
    accept (m = 0 groups included), views of the stacked tensors at 16-byte aligned offsets,
    and expert g's sfa slice equal to its own rows' blocked scales (the serving layout is
    each expert's blocked scales in turn)."""
    e_, n, k, counts = 4, 64, 512, [130, 0, 5, 1]
    rows, cols = sum(counts), 32
    gen = torch.Generator().manual_seed(0)
    plain = torch.randint(0, 256, (rows, k // 16), dtype=torch.uint8, generator=gen)
    sfa = torch.zeros(sfa_rows_needed(rows, e_) * cols, dtype=torch.uint8)
    blocked = padded_blocked_scales(plain, counts)
    sfa[:blocked.numel()] = blocked
    inp = {"a": torch.zeros(rows, k // 2, dtype=torch.uint8), "sfa": sfa}
    w = SimpleNamespace(b=torch.zeros(e_, n, k // 2, dtype=torch.uint8),
                        sfb=torch.zeros(e_, blocked_scale_numel(n, k), dtype=torch.uint8))
    out = torch.empty(rows, n, dtype=torch.bfloat16)
    seen = {}

    def grouped_gemm(a, b, sa, sb, out):
        seen.update(a=a, b=b, sfa=sa, sfb=sb, out=out)

    bm.list_call(SimpleNamespace(grouped_gemm=grouped_gemm), bm.expert_spans(counts, k))(
        inp, w, out)
    assert check_structure(seen["a"], seen["b"], seen["sfa"], seen["sfb"], seen["out"]) == \
        tuple((m, n, k) for m in counts)
    starts = [0, 130, 130, 135]
    for g, m in enumerate(counts):
        for name, base in (("a", inp["a"]), ("sfa", sfa), ("b", w.b), ("sfb", w.sfb),
                           ("out", out)):
            view = seen[name][g]
            assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
            if view.numel():  # an empty view's data_ptr is 0 (nothing is read or written)
                assert (view.data_ptr() - base.data_ptr()) % 16 == 0, (name, g)
        if m:
            assert seen["a"][g].data_ptr() == inp["a"][starts[g]].data_ptr()
            assert seen["out"][g].data_ptr() == out[starts[g]].data_ptr()
            assert torch.equal(seen["sfa"][g], to_blocked(plain[starts[g]:starts[g] + m]))


def test_list_entry_is_the_layers_list_set_when_it_serves_the_call() -> None:
    layer = bm.Layer("q.sm_90a.bfloat16", "q", 4, 256, 512, None)
    nk = [(256, 512)] * 4
    index = KernelIndex([entry("q", nk, offsets=True),  # ours: not a list kernel
                         entry("q_list", nk, max_m=100),
                         entry("q_list", nk, dtype="float16", max_m=100),
                         entry("r_list", [(256, 512)] * 3)])
    got, why = bm.list_entry(index, layer, [100, 0, 7, 1], "sm_90a", "bfloat16")
    assert got.name == "q_list.sm_90a.bfloat16" and why == ""
    assert bm.list_entry(index, layer, [101, 0, 7, 1], "sm_90a", "bfloat16") == \
        (None, "q_list serves m <= 100 per expert, the busiest has 101")
    assert bm.list_entry(index, layer, [1] * 4, "sm_100a", "bfloat16") == \
        (None, "no set q_list for sm_100a bfloat16")
    other = bm.Layer("r.sm_90a.bfloat16", "r", 4, 256, 512, None)  # r_list has 3 groups
    assert bm.list_entry(index, other, [1] * 4, "sm_90a", "bfloat16")[1] == \
        "r_list is not a list-API dynamic-m set of 4 x (n, k) = (256, 512)"
    first = KernelIndex([entry("p_list", nk), entry("q_list", nk)])  # p_list is selected
    assert bm.list_entry(first, layer, [1] * 4, "sm_90a", "bfloat16") == \
        (None, "grouped_gemm would run p_list.sm_90a.bfloat16, not q_list")


def test_list_api_spec_has_each_model_layer_as_a_default_options_list_set() -> None:
    fams = load_families("kernels.families")
    layers = {s.name: s for s in load_spec(ROOT / "shapes.yaml", fams).sets}
    spec = load_spec(ROOT / "experiments" / "list_api.yaml", fams)
    names = [s.name for s in spec.sets]
    # The layers: expert sets of no max_m (the tiers have one) in the offsets layout.
    base = [n for n in bm.model_sets() if layers[n].max_m is None
            and not any(dict(b.options).get("masked") for b in layers[n].builds)]
    assert names == [bm.list_set(bm.Layer("", n, 0, 0, 0, None)) for n in base]
    assert {"dsv3_gateup_e32_list", "dsv3_down_e32_list", "qwen3_30b_gateup_list",
            "qwen3_30b_down_list"} <= set(names)
    for s in spec.sets:
        layer = layers[s.name.removesuffix("_list")]
        assert s.dynamic_m and s.groups == layer.groups and s.max_m == 4096
        assert [(b.arch, b.options) for b in s.builds] == [("sm_90a", ())]  # no options
        assert s.out_dtypes == ("bfloat16",)


def test_list_columns_and_summary() -> None:
    row = {"set": "s", "experts": 8, "n": 256, "k": 512, "tokens": 64, "topk": 8, "rows": 512,
           "experts_hit": 7, "ours_us": 10.0, "grouped_mm_us": 25.0, "cublas_us": 20.0,
           "fp8_us": float("nan"), "fp4_floor_us": 5.0, "mma_floor_us": 2.5, "check": "exact",
           "kernel": "s.sm_90a.acc1.bf16"}
    rows = [{**row, "list_us": 15.0, "list_same": True},
            {**row, "tokens": 128, "list_us": 8.0, "list_same": False},
            {**row, "tokens": 256, "list_skip": "no set s_list"}]
    head, rule, *lines = bm.table(rows).splitlines()
    assert head.startswith("| layer | E | N | K | tokens x k | rows | experts hit | ours us | "
                           "list us | x | own kernel us |")
    assert all(head.count("|") == x.count("|") for x in (rule, *lines))
    assert "| 10.0 | 15.0 | 1.50 | n/a |" in lines[0]
    assert "| 10.0 | 8.0 (DIFFERS) | 0.80 | n/a |" in lines[1]
    assert "| 10.0 | n/a | n/a | n/a |" in lines[2]
    assert "list us" not in bm.table([row]).splitlines()[0]
    assert bm.list_summary(rows).splitlines() == [
        "ours vs the list API: not slower on 1 of 2 cases (1 skipped)",
        "  s T=128: ours 10.0 us, list 8.0, outputs DIFFER"]


def test_help_runs_without_a_gpu() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_models.py"), "--help"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--tokens" in proc.stdout and "--topk" in proc.stdout and "--list-api" in proc.stdout


def test_masked_bench_counts_and_table() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_masked as bmk

    counts = bmk.masked_counts(32, 64, 0.5, seed=27)
    assert counts == bmk.masked_counts(32, 64, 0.5, seed=27)  # reproducible
    assert len(counts) == 32 and all(0 <= c <= 64 for c in counts)
    assert counts.count(0) >= 8  # a quarter of the experts empty
    assert max(bmk.masked_counts(4, 16, 1.0, seed=1)) <= 16  # capped at max_m
    row = {"set": "s", "experts": 32, "n": 256, "k": 512, "max_m": 64, "rows": 700,
           "experts_hit": 24, "ours_us": 10.0, "grouped_mm_us": 25.0, "fp8_us": float("nan"),
           "fp4_floor_us": 5.0, "check": "exact"}
    head, rule, line = bmk.table([row]).splitlines()
    assert head.count("|") == rule.count("|") == line.count("|")
    assert line == "| s | 32 | 256 | 512 | 64 | 700 | 24 | 10.0 | 25.0 | 2.50 | n/a | n/a | 5.0 | 50 | exact |"


def test_the_weight_rotation_is_sized_from_the_experts_with_tokens() -> None:
    # Qwen3-30B-A3B gate-up at 1 token x 8: 8 experts hit, 13.5 MB of fp4 weights and scales.
    # Sized from all 128 experts (216 MB) it was one copy, read whole from L2 every replay.
    qwen = bm.Layer("q", "q", 128, 1536, 2048, None)
    one_token = [1] * 8 + [0] * 120
    per_expert = 1536 * 1024 + 1536 * 128
    assert bm.hit_weight_bytes(one_token, qwen) == 8 * per_expert
    assert bm.weight_sets(bm.layer_weight_bytes(qwen)) == 1
    assert bm.layer_weight_copies(qwen, [one_token, [4] * 128]) == \
        math.ceil(3 * L2 / (8 * per_expert)) == 12
    # DeepSeek-V3 E = 256 gate-up copies are 26 GB with their bf16 and fp8 twins: the budget
    # (60 GB) allows two, which 1 token x 8 (117 MB hit) needs.
    dsv3 = bm.Layer("d", "d", 256, 4096, 7168, None)
    assert bm.layer_weight_copies(dsv3, [[1] * 8 + [0] * 248]) == 2
    assert bm.layer_weight_copies(dsv3, [[2] * 256]) == 1


def test_the_checks_read_what_the_graph_wrote() -> None:
    # capture()'s eager warm-up leaves the right values in every output: a graph that writes
    # nothing passed same_as_ours before the outputs were set to NaN ahead of each replay.
    import torch

    class Graph:
        def __init__(self, out: torch.Tensor | None, value: float) -> None:
            self.out, self.value = out, value

        def replay(self) -> None:
            if self.out is not None:
                self.out.fill_(self.value)

    ours = [torch.full((2, 3), 5.0) for _ in range(3)]
    graphs = [Graph(o, 5.0) for o in ours]
    theirs = [torch.full((2, 3), 5.0) for _ in range(3)]  # the warm-up's values
    assert bm.same_as_ours([Graph(t, 5.0) for t in theirs], theirs, graphs, ours)
    assert not bm.same_as_ours([Graph(None, 5.0) for _ in theirs], theirs, graphs, ours)
    assert not bm.same_as_ours([Graph(t, 5.0) for t in theirs[:2]] + [Graph(None, 5.0)],
                               theirs, graphs, ours)
    assert bm.fresh_replay(Graph(None, 0.0), torch.zeros(2)).isnan().all()


def test_the_decode_summary_counts_issue_27s_marks_over_decode_sized_cases() -> None:
    def row(rows, experts, ours, floor, grp, fp8, cold=True):
        return {"rows": rows, "experts": experts, "ours_us": ours, "fp4_floor_us": floor,
                "grouped_mm_us": grp, "fp8_us": fp8, "weights_l2_cold": cold}

    rows = [row(4096, 128, 100.0, 80.0, 300.0, 150.0),  # 32 rows per expert: decode-sized
            row(4097, 128, 100.0, 80.0, 300.0, 150.0),  # just past: prefill, not counted
            row(64, 128, 100.0, 69.0, 249.0, 99.0, cold=False),
            row(8, 8, 10.0, 7.0, 25.0, float("nan"))]  # no fp8 time: not faster
    assert bm.decode_summary(rows) == (
        "decode-sized cases (<= 32 rows per expert): 3 distinct calls; >= 70% of the fp4-bytes "
        "floor: 2; >= 2.5x _grouped_mm: 2; faster than fp8 row-wise: 1; 1 with weights partly "
        "L2-warm")
    assert bm.decode_summary(rows[1:2]) == ("decode-sized cases (<= 32 rows per expert): none "
                                            "in this run")


def test_the_decode_summary_counts_a_call_timed_through_several_tier_sets_once() -> None:
    def row(set_name, n, rows, ours):
        return {"set": set_name, "experts": 32, "n": n, "k": 2048, "rows": rows, "ours_us": ours,
                "fp4_floor_us": 80.0, "grouped_mm_us": 300.0, "fp8_us": 150.0}

    # The layer's base set and its tiny set time the same call (counted once, by the first
    # row: 100 us, at 80%); another N or another row count is another call.
    rows = [row("lay", 7168, 512, 100.0), row("lay_tiny", 7168, 512, 200.0),
            row("lay", 4096, 512, 200.0), row("lay_tiny", 7168, 256, 100.0)]
    assert bm.decode_summary(rows) == (
        "decode-sized cases (<= 32 rows per expert): 3 distinct calls; >= 70% of the fp4-bytes "
        "floor: 2; >= 2.5x _grouped_mm: 2; faster than fp8 row-wise: 2")


def test_the_compare_summary_gives_each_parts_geomean_range_and_differing_calls() -> None:
    def row(set_name, experts, rows, ours, before=None, same=True, tokens=1):
        r = {"set": set_name, "experts": experts, "n": 4096, "k": 2048, "rows": rows,
             "tokens": tokens, "ours_us": ours}
        if before is not None:
            r.update(before_us=before, before_same=same)
        return r

    rows = [row("a", 8, 8, 90.0, 100.0, tokens=1),       # decode: 0.9
            row("a_tiny", 8, 8, 50.0, 10.0, tokens=1),   # the same call again: not counted
            row("a", 8, 256, 40.0, 10.0, tokens=32),     # decode (32 per expert): 4.0
            row("a", 8, 264, 120.0, 100.0, False, 33),   # prefill: 1.2, outputs differ
            row("b", 8, 8, 10.0)]                        # not served by the other artifacts
    assert bm.compare_summary(rows, extremes=1) == "\n".join([
        "A/B against --compare (time ours / before, < 1: ours faster; each call once): 3 calls, "
        "1 case(s) the other artifacts do not serve",
        "  decode-sized: 2 calls, geomean 1.897 (0.900-4.000); outputs differ on 0",
        "    0.900 a T=1: ours 90.0 us, before 100.0",
        "    4.000 a T=32: ours 40.0 us, before 10.0",
        "  prefill-sized: 1 calls, geomean 1.200 (1.200-1.200); outputs differ on 1",
        "    1.200 a T=33: ours 120.0 us, before 100.0"])
    # More calls than 2 * extremes: only the ends are listed.
    many = [row("c", 8, 8 * i, 10.0 * i, 10.0, tokens=i) for i in (1, 2, 3, 4)]
    lines = bm.compare_summary(many, extremes=1).splitlines()
    assert lines[1] == "  decode-sized: 4 calls, geomean 2.213 (1.000-4.000); outputs differ on 0"
    assert [x.split()[0] for x in lines[2:]] == ["1.000", "4.000"]
    # Equal ratios keep their order (rows are dicts: they must never be compared).
    ties = [row("d", 8, 8 * i, 10.0, 10.0, tokens=i) for i in (1, 2)]
    assert bm.compare_summary(ties).splitlines()[2:] == [
        "    1.000 d T=1: ours 10.0 us, before 10.0", "    1.000 d T=2: ours 10.0 us, before 10.0"]
