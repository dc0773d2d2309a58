"""The stream-K schedule (kernels/sm90/stream_k.py) on a Python model of the kernel's walk:
every K stage of every tile computed exactly once, each CTA writing at most one partial, and
every wait on a partial whose owner computes it before anything it waits for itself."""

from __future__ import annotations

import pytest

from kernels.sm90.stream_k import dp_tiles, piece, unit_owner, unit_range


def walk(stages: list[int], grid: int) -> dict[int, list[tuple]]:
    """Per CTA, its work in order: ('dp', tile) or ('sk', tile, k_begin, k_end)."""
    total = len(stages)
    t_dp = dp_tiles(total, grid)
    starts, units = [], 0
    for t in range(t_dp, total):
        starts.append(units)
        units += stages[t]
    work = {}
    for b in range(grid):
        items = [("dp", t) for t in range(b, t_dp, grid)]
        if units:
            u_lo, u_hi = unit_range(b, units, grid)
            while u_hi > u_lo:
                i = max(j for j, s in enumerate(starts) if s <= u_hi - 1)
                kb, ke = piece(u_lo, u_hi, starts[i])
                items.append(("sk", t_dp + i, kb, ke))
                u_hi = starts[i] + kb
        work[b] = items
    return work


CASES = [([28] * 242, 132), ([8] * 494, 132), ([16] * 128, 132), ([28] * 1408, 132),
         ([4] * 5 + [12] * 7 + [2] * 3, 4), ([6] * 3, 8), ([1] * 9, 4), ([28] * 132, 132)]


@pytest.mark.parametrize("stages, grid", CASES)
def test_every_stage_once_and_one_partial_per_cta(stages: list[int], grid: int) -> None:
    work = walk(stages, grid)
    done = {t: [] for t in range(len(stages))}
    for b, items in work.items():
        partials = 0
        for it in items:
            if it[0] == "dp":
                done[it[1]].append((0, stages[it[1]]))
            else:
                _, t, kb, ke = it
                assert 0 <= kb < ke <= stages[t]
                done[t].append((kb, ke))
                partials += ke < stages[t]
        assert partials <= 1, b
        # the only piece that can end inside a tile is the first stream-K piece
        sk = [it for it in items if it[0] == "sk"]
        assert all(ke == stages[t] for _, t, _, ke in sk[1:])
    for t, spans in done.items():
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == stages[t], t
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), (t, spans)


@pytest.mark.parametrize("stages, grid", CASES)
def test_waits_go_to_the_owner_of_the_unit_before(stages: list[int], grid: int) -> None:
    work = walk(stages, grid)
    t_dp = dp_tiles(len(stages), grid)
    units = sum(stages[t_dp:])
    starts = {t: sum(stages[t_dp:t]) for t in range(t_dp, len(stages))}
    for b, items in work.items():
        for it in items:
            if it[0] == "sk" and it[2] > 0:
                _, t, kb, _ = it
                p = unit_owner(starts[t] + kb - 1, units, grid)
                assert p < b
                # the owner's partial of t is its first stream-K piece, ending at kb
                first = next(x for x in work[p] if x[0] == "sk")
                assert first[1] == t and first[3] == kb


def test_owner_inverts_the_ranges() -> None:
    for units, grid in [(3080, 132), (784, 132), (5, 8), (2048, 132)]:
        for u in range(units):
            c = unit_owner(u, units, grid)
            lo, hi = unit_range(c, units, grid)
            assert lo <= u < hi


def test_descriptor_sets_outlast_both_rings() -> None:
    """A set is patched again after (sets - 1) group changes of at least one stage each: that
    must refill the weight ring (`stages` slots) and, in v3, the A ring (`a_slots` tiles of
    64 K, 4 per stage), whatever the tiles' k. Every kernel, stream-K or not, since a
    data-parallel CTA walking several small-k groups changes groups every tile."""
    pytest.importorskip("cutlass")  # grouped_gemm is device code
    from kernels.sm90.config import Config, check
    from kernels.sm90.grouped_gemm import Sm90GroupedGemm

    assert Sm90GroupedGemm(Config()).desc_sets == 4  # the default config
    assert Sm90GroupedGemm(Config(a_fp16=False)).desc_sets == 4
    for stages in range(2, 6):
        for a_slots in range(4, 17, 4):
            for a_fp16 in (True, False):
                config = Config(tile_m=64, stages=stages, a_slots=a_slots, a_fp16=a_fp16)
                assert check(config) == []
                sets = Sm90GroupedGemm(config).desc_sets
                ring = max(stages, a_slots // 4) if a_fp16 else stages
                assert sets - 1 >= ring and sets - 2 < ring, (stages, a_slots, a_fp16)
