"""bench/bench_layer.py's CPU-side planning: which expert sets pair into a model's SwiGLU block,
each model's top-k, the floor's bytes, the weight-copy rotation, the fault check's error, the
table, and that the script answers --help without a GPU."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))
import bench_layer as bl
from bench_models import Layer

from runtime.formats import blocked_scale_numel


def layer(set_: str, e: int, n: int, k: int, max_m: int | None = None) -> Layer:
    return Layer(f"{set_}.sm_90a.acc1.bf16", set_, e, n, k, max_m)


QWEN_UP = layer("qwen3_30b_gateup", 128, 1536, 2048)
QWEN_DOWN = layer("qwen3_30b_down", 128, 2048, 768)


def test_pairs_gateup_with_its_down_set_and_skips_tiers_and_mismatches() -> None:
    layers = [
        QWEN_UP, QWEN_DOWN,
        layer("qwen3_30b_gateup_tiny", 128, 1536, 2048, max_m=1024),  # a tier: not a model
        layer("qwen3_30b_down_tiny", 128, 2048, 768, max_m=1024),
        layer("mixtral_gateup", 8, 28672, 4096), layer("mixtral_down", 8, 4096, 14336),
        layer("odd_gateup", 8, 1000, 512), layer("odd_down", 8, 512, 400),  # 1000 != 2 x 400
        layer("lone_gateup", 8, 1024, 512),  # no down set
        layer("dsv3_gateup_e32", 32, 4096, 7168), layer("dsv3_down_e32", 16, 7168, 2048),  # E
    ]
    got = bl.pair_models(layers)
    assert [(m.name, m.gateup.set, m.down.set, m.topk) for m in got] == [
        ("qwen3_30b", "qwen3_30b_gateup", "qwen3_30b_down", 8),
        ("mixtral", "mixtral_gateup", "mixtral_down", 2),
    ]
    assert [m.topk for m in bl.pair_models(layers, topk=4)] == [4, 4]


def test_model_topk_is_the_models_own() -> None:
    assert [bl.model_topk(n) for n in ("qwen3_235b_e16", "dsv3_e256", "gptoss", "mixtral",
                                       "ep_e8", "unknown")] == [8, 8, 4, 2, 2, 8]


def test_floor_counts_both_gemms_of_the_experts_with_tokens_only() -> None:
    model = bl.pair_models([QWEN_UP, QWEN_DOWN])[0]
    per_expert = (1536 * 2048 // 2 + blocked_scale_numel(1536, 2048)
                  + 2048 * 768 // 2 + blocked_scale_numel(2048, 768))
    assert per_expert == 1536 * 2048 // 2 + 1536 * 128 + 2048 * 768 // 2 + 2048 * 48
    counts = [0] * 128
    counts[3], counts[70], counts[127] = 5, 1, 2
    assert bl.hit_bytes(counts, model) == 3 * per_expert
    assert bl.hit_bytes([0] * 128, model) == 0


def test_copies_rotate_hit_bytes_past_l2_within_the_budget() -> None:
    model = bl.pair_models([QWEN_UP, QWEN_DOWN])[0]
    one = [1] + [0] * 127  # 2.65 MB of hit weights: 3 x 50 MiB needs the cap of 16 copies
    assert bl.copies_for(one, model) == 16
    many = [1] * 128  # 339 MB: one copy already rotates past 3x L2
    assert bl.copies_for(many, model) == 1
    big = bl.pair_models([layer("x_gateup", 256, 4096, 7168), layer("x_down", 256, 7168, 2048)])[0]
    per_copy = 256 * (4096 * 7168 + 7168 * 2048) * 7 // 2  # 39.4 GB: the 40 GiB budget holds one
    assert per_copy < bl.WEIGHT_BUDGET < 2 * per_copy
    assert bl.copies_for([1] + [0] * 255, big) == 1


def test_rel_err_flags_wrong_results_and_nan() -> None:
    ref = torch.tensor([[3.0, -4.0]])
    assert bl.rel_err(ref, ref) == 0.0
    assert abs(bl.rel_err(ref * 1.1, ref) - 0.1) < 1e-6
    assert bl.rel_err(torch.zeros_like(ref), ref) == 1.0
    nan = bl.rel_err(torch.full_like(ref, float("nan")), ref)
    assert not (nan <= bl.ERR_LIMIT)  # the fault test of step_case


def worst_expert_err(x: torch.Tensor, ref: torch.Tensor, counts: list[int]) -> float:
    return bl.worst(bl.expert_errs(x, ref, counts))  # step_case's err, for one input set


def test_worst_expert_err_catches_one_bad_expert_and_any_nan() -> None:
    ref = torch.ones(1000, 4)
    good = ref * 1.1
    # One expert's 17 rows wrong out of 1000: one norm over the whole output says 0.28 and
    # would pass; the worst expert says 2.0.
    bad = good.clone()
    bad[980:997] = -1.0
    counts = [980, 0, 17, 3]
    assert abs(worst_expert_err(good, ref, counts) - 0.1) < 1e-6
    assert abs(worst_expert_err(bad, ref, counts) - 2.0) < 1e-6
    assert not bl.is_fault(bl.rel_err(bad, ref)) and bl.is_fault(worst_expert_err(bad, ref, counts))
    nan = good.clone()
    nan[998, 1] = float("nan")  # in the last expert: a plain max() of errors could drop it
    assert math.isnan(worst_expert_err(nan, ref, counts))
    assert bl.is_fault(float("nan")) and bl.is_fault(0.36) and not bl.is_fault(0.35)
    assert worst_expert_err(ref, ref, [0, 0]) == 0.0  # no expert with rows


def test_default_models_leave_out_the_test_sized_layers() -> None:
    layers = [QWEN_UP, QWEN_DOWN, layer("ep8_gateup", 8, 1024, 512), layer("ep8_down", 8, 512, 512),
              layer("ep_e8_gateup", 8, 1024, 1024), layer("ep_e8_down", 8, 1024, 512)]
    models = bl.pair_models(layers)
    assert [m.name for m in models] == ["qwen3_30b", "ep8", "ep_e8"]
    assert [m.name for m in bl.select_models(models, None)] == ["qwen3_30b"]
    assert [m.name for m in bl.select_models(models, ["ep8"])] == ["ep8"]


def test_table_rows() -> None:
    row = {"model": "qwen3_30b", "experts": 128, "tokens": 8, "topk": 8, "ours_us": 100.0,
           "gemms_us": 80.0, "bf16_us": 250.0, "fp8_us": 150.0, "floor_us": 70.0, "err": 0.12,
           "fault": False}
    lines = bl.table([row, {**row, "err": 1.4, "fault": True}]).splitlines()
    assert lines[2] == ("| qwen3_30b (128) | 8 x 8 | 100.0 | 80.0 | 250.0 | 150.0 | 2.50 | 1.50 "
                        "| 70.0 | 70 | 0.120 |")
    assert lines[3].endswith("| 1.400 FAULT |")
    assert bl.table([{**row, "l2_warm": True}]).splitlines()[2].endswith("| 0.120 L2-warm |")


def test_help_runs_without_a_gpu() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_layer.py"), "--help"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--tokens" in proc.stdout and "--only" in proc.stdout and "--topk" in proc.stdout
