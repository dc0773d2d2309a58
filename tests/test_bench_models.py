"""bench/bench_models.py's CPU-side planning: which set entries are model expert layers, the
cases (token counts capped by what the kernel serves), the routing, the floors' arithmetic and
the rotation sizes, and that the script imports and answers --help without a GPU."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_models as bm

from runtime.manifest import Serves

L2 = 50 * 2**20


def entry(name: str, groups, arch="sm_90a", dtype="bfloat16", dynamic=True, max_m=None,
          masked=False):
    return SimpleNamespace(name=f"{name}.{arch}.{dtype}", set=name, arch=arch, out_dtype=dtype,
                           takes_masked=masked,
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


def test_help_runs_without_a_gpu() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_models.py"), "--help"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--tokens" in proc.stdout and "--topk" in proc.stdout


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
