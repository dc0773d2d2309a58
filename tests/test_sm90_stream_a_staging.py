"""Streamed staging (Config.stream_a), the pure formulas of kernels/sm90/staging.py that the
kernel traces: the K-slab-major chunk order (slab_chunk), how many chunks precede a tile's stage
(chunks_before), the progress counters' slots and targets, and the progress header's layout.

The producer loads stage kt of a tile's A rows once `chunks_before(kt, row_end, rows)` chunks are
staged, so that count must cover every chunk of those rows and stages and no more; the stagers'
pair stores need chunks 2j and 2j + 1 in one row; and a wait on a counter slot must never pass
before the iterations it reports staged are counted by every CTA."""

from __future__ import annotations

import itertools

import pytest

from kernels.sm90.config import K_TILE
from kernels.sm90.staging import (
    A_CHUNK_K,
    EPOCH_OFFSET,
    PROGRESS_BANK_BYTES,
    PROGRESS_SLOTS,
    SLAB_CHUNKS,
    STREAM_HEADER_BYTES,
    chunks_before,
    progress_slot,
    progress_target,
    slab_chunk,
)

# (all groups' rows, k): one row, a few rows, moe_down's first two groups, rows past 128, a
# long k (moe_gateup's 7168 = 28 weight stages)
SHAPES = [(1, 256), (3, 512), (116, 2048), (130, 1536), (5, 7168)]


def places(rows: int, k: int) -> list[tuple[int, int, int]]:
    """slab_chunk of every chunk index of the call, in index order."""
    return [slab_chunk(i, rows) for i in range(rows * k // A_CHUNK_K)]


def test_slab_is_one_weight_stage_of_one_row() -> None:
    assert SLAB_CHUNKS == K_TILE // A_CHUNK_K == 8


@pytest.mark.parametrize("rows, k", SHAPES)
def test_slab_chunk_is_a_bijection_onto_rows_and_k_chunks(rows: int, k: int) -> None:
    got = places(rows, k)
    per_row = k // A_CHUNK_K
    for kt, row, kc in got:
        assert 0 <= row < rows and 0 <= kc < per_row
        assert kt == kc // SLAB_CHUNKS  # the stage the chunk belongs to
    assert sorted((row, kc) for _, row, kc in got) == [
        (row, kc) for row in range(rows) for kc in range(per_row)]


@pytest.mark.parametrize("rows, k", SHAPES)
def test_order_is_k_slab_major_then_row_then_k(rows: int, k: int) -> None:
    """All rows' chunks of stage kt come before any of stage kt + 1 (so every tile's first
    stages are staged first), rows in order inside a slab, K in order inside a row."""
    got = places(rows, k)
    assert got == sorted(got)
    stages = [kt for kt, _, _ in got]
    assert stages == [i // (rows * SLAB_CHUNKS) for i in range(len(got))]
    assert got[:SLAB_CHUNKS] == [(0, 0, kc) for kc in range(SLAB_CHUNKS)]
    if k > K_TILE:  # the second slab starts at row 0's second stage
        assert got[rows * SLAB_CHUNKS] == (1, 0, SLAB_CHUNKS)


@pytest.mark.parametrize("rows, k", SHAPES)
def test_pairs_share_a_row_with_even_and_odd_k_chunks(rows: int, k: int) -> None:
    """The stagers' pair stores (staging.PAIR_STORES): lanes 2j and 2j + 1 hold chunks 2j and
    2j + 1, whose fp16 outputs must be one 128-byte step of one row, even half first."""
    got = places(rows, k)
    assert len(got) % 2 == 0  # both lanes of a pair pass or fail the bounds check together
    for j in range(0, len(got), 2):
        (kt0, row0, kc0), (kt1, row1, kc1) = got[j], got[j + 1]
        assert (kt1, row1) == (kt0, row0)
        assert kc0 % 2 == 0 and kc1 == kc0 + 1


@pytest.mark.parametrize("rows, k", SHAPES)
def test_chunks_before_covers_exactly_the_rows_and_stages_needed(rows: int, k: int) -> None:
    got = places(rows, k)
    index = {(kt, row, kc): i for i, (kt, row, kc) in enumerate(got)}
    for kt in range(k // K_TILE):
        for row_end in range(1, rows + 1):
            n = chunks_before(kt, row_end, rows)
            needed = [i for (kt_, row, _), i in index.items() if kt_ <= kt and row < row_end]
            # every chunk of stages 0..kt of rows < row_end precedes it, and the last chunk
            # before it is one of them: waiting for n chunks waits for nothing extra
            assert n == 1 + max(needed)
            assert got[n - 1] == (kt, row_end - 1, (kt + 1) * SLAB_CHUNKS - 1)
    # stage 0 of every row is the first thing staged
    assert chunks_before(0, rows, rows) == rows * SLAB_CHUNKS
    # the last stage of the last row is the last chunk of the call
    assert chunks_before(k // K_TILE - 1, rows, rows) == len(got)


def test_chunks_before_examples() -> None:
    # moe_down's first two groups (40 + 76 rows, k 2048): stage 2 of the second group's first
    # 128-row tile (rows 40..115) needs stages 0, 1 of everything and stage 2 of rows < 116
    assert chunks_before(2, 116, 116) == 3 * 116 * 8 == 2784
    assert chunks_before(0, 40, 116) == 320
    assert chunks_before(3, 1, 116) == (3 * 116 + 1) * 8


def test_progress_slot_is_the_iteration_then_the_last_slot() -> None:
    assert PROGRESS_SLOTS == 32
    assert [progress_slot(i) for i in range(31)] == list(range(31))
    assert [progress_slot(i) for i in (31, 32, 33, 100, 10**6)] == [31] * 5


@pytest.mark.parametrize("grid", [1, 2, 132])
@pytest.mark.parametrize("iterations", [1, 31, 32, 33, 100])
def test_progress_target_values(grid: int, iterations: int) -> None:
    for it in range(iterations):
        if it < 31:
            assert progress_target(it, iterations, grid) == (grid, it + 1)
        else:
            assert progress_target(it, iterations, grid) == (grid * (iterations - 31), iterations)


def _slot_counts(done: tuple[int, ...]) -> list[int]:
    """The bank after each CTA x counted its first done[x] iterations (in order, one add to
    progress_slot(it) per iteration)."""
    bank = [0] * PROGRESS_SLOTS
    for d in done:
        for it in range(d):
            bank[progress_slot(it)] += 1
    return bank


@pytest.mark.parametrize("grid, iterations", [
    (1, 1), (1, 31), (1, 33), (1, 40), (2, 2), (2, 31), (2, 32), (2, 34), (3, 2), (3, 33)])
def test_a_reached_target_proves_what_it_reports(grid: int, iterations: int) -> None:
    """For every state of the CTAs (each counted some prefix of its iterations): when the slot
    of iteration `it` has reached its target, every CTA has counted the `known` iterations
    reported, and known > it; for it < 31 the target is reached as soon as every CTA has
    counted `it` (no wait beyond it); and once all is counted every target is reached."""
    for done in itertools.product(range(iterations + 1), repeat=grid):
        bank = _slot_counts(done)
        for it in range(iterations):
            target, known = progress_target(it, iterations, grid)
            assert known > it
            reached = bank[progress_slot(it)] >= target
            if reached:
                assert min(done) >= known, (done, it)
            if it < PROGRESS_SLOTS - 1:
                assert reached == (min(done) > it), (done, it)
            if min(done) == iterations:
                assert reached


def test_progress_header_layout() -> None:
    """Two banks of 32 u32 counters, then the epoch word, in whole 128-byte lines (the runtime
    requires header_bytes to be a multiple of 128 and zeroes exactly that many bytes)."""
    assert PROGRESS_BANK_BYTES == PROGRESS_SLOTS * 4 == 128
    assert EPOCH_OFFSET == 2 * PROGRESS_BANK_BYTES == 256  # bank 1 ends where the epoch starts
    assert EPOCH_OFFSET + 4 <= STREAM_HEADER_BYTES
    assert STREAM_HEADER_BYTES % 128 == 0
    assert STREAM_HEADER_BYTES == -(-(EPOCH_OFFSET + 4) // 128) * 128 == 384
