"""bench/bench_grouped.py times the shapes that are built: its sets come from shapes.yaml (and
its diagnostic twin from experiments/tile_start_ab.yaml), not from a copy of their groups."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_grouped  # noqa: E402

from builder.families import load_families  # noqa: E402
from builder.spec import load_spec  # noqa: E402


def test_the_bench_sets_are_the_specs_exact_sets() -> None:
    spec = {s.name: s for s in load_spec(ROOT / "shapes.yaml",
                                         load_families("kernels.families")).sets}
    assert list(bench_grouped.SETS) == list(bench_grouped.BENCH_SETS)
    for name, groups in bench_grouped.SETS.items():
        assert [tuple(g) for g in spec[name].groups] == groups, name
    assert set(bench_grouped.BASE_SETS) < set(bench_grouped.SETS)
    assert "moe_down_one_tile" not in bench_grouped.SETS
    assert "moe_down_one_tile" in bench_grouped.ALL_SETS


def test_a_spec_without_a_named_exact_set_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("schema_version: 1\nsets:\n  - name: a\n    m: dynamic\n"
                    "    groups: [[128, 256]]\n")
    with pytest.raises(SystemExit, match=r"must hold the exact sets \['a', 'b'\], but lacks"):
        bench_grouped.spec_groups(spec, ("a", "b"))
