"""experiments/tile_start_ab.yaml (what a tile start costs on moe_down): its two sets are the
bench's moe_down and its one-tile twin, with the same FLOPs, the shipped moe_down kernel
options, and the same number of 64-K steps on their busiest CTA, so their time difference is
tile starts."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import bench_grouped  # noqa: E402

from builder.families import load_families  # noqa: E402
from builder.spec import load_spec  # noqa: E402
from runtime.plan import cta_prefix  # noqa: E402

SMS = 132  # H200


def _sets(path: Path) -> dict:
    spec = load_spec(path, load_families("kernels.families"))
    return {s.name: s for s in spec.sets}


def _busiest_cta_steps(groups, tile_m: int, tile_n: int) -> int:
    """64-K steps of the CTA with the most tiles (persistent grid, tile b, b + grid, ...)."""
    tiles = cta_prefix(groups, tile_m, tile_n)[-1]
    grid = min(tiles, SMS)
    per_cta = -(-tiles // grid)
    return per_cta * groups[0][2] // 64


def test_the_twins_are_the_bench_sets_with_equal_flops() -> None:
    sets = _sets(ROOT / "experiments" / "tile_start_ab.yaml")
    assert list(sets) == ["moe_down", "moe_down_one_tile"]
    assert list(sets["moe_down"].groups) == bench_grouped.SETS["moe_down"]
    assert list(sets["moe_down_one_tile"].groups) == \
        bench_grouped.DIAG_SETS["moe_down_one_tile"]
    flops = [sum(m * n * k for m, n, k in sets[name].groups) for name in sets]
    assert flops[0] == flops[1]


def test_moe_down_is_built_as_shipped_and_both_have_128_steps_on_the_busiest_cta() -> None:
    shipped = _sets(ROOT / "shapes.yaml")["moe_down"]
    ab = _sets(ROOT / "experiments" / "tile_start_ab.yaml")
    [ship] = [b for b in shipped.builds if b.arch == "sm_90a"]
    for name in ab:
        [build] = ab[name].builds
        assert build.options_dict() == ship.options_dict()
    opts = ship.options_dict()
    tm, tn = opts["tile_m"], opts["tile_n"]
    assert cta_prefix(list(ab["moe_down"].groups), tm, tn)[-1] == 494  # 4 tiles on 98 CTAs
    assert cta_prefix(list(ab["moe_down_one_tile"].groups), tm, tn)[-1] == 130  # 1 per CTA
    assert _busiest_cta_steps(list(ab["moe_down"].groups), tm, tn) == 128
    assert _busiest_cta_steps(list(ab["moe_down_one_tile"].groups), tm, tn) == 128


def test_the_diagnostic_twin_is_not_in_the_default_run() -> None:
    assert "moe_down_one_tile" not in bench_grouped.SETS
    assert bench_grouped.ALL_SETS["moe_down_one_tile"] == \
        bench_grouped.DIAG_SETS["moe_down_one_tile"]
