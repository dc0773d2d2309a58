"""The kernel's phase 1: where each 32-K chunk of A is read and written
(kernels/sm90/staging.py, the formulas the kernel traces), against independent definitions:
the packed A bytes tile the row-major fp4 matrix, the scale bytes are the runtime's blocked
layout (runtime.nvfp4.blocked_scale_offset), and the fp16 outputs tile the staging area with
every chunk inside its own row and 64-K step."""

from __future__ import annotations

import pytest

from kernels.sm90.staging import (
    A_CHUNK_K,
    chunk_addresses,
    half_step_addresses,
)
from runtime.nvfp4 import blocked_scale_offset

BASES = (1 << 40, 1 << 41, 1 << 42)  # A, SFA and staging bases: distinct, far apart



def step_of_chunk(chunk: int, scale: int, chunk_parity: int) -> tuple[int, int]:
    """(packed address, scale word address) of the 64-K step holding a chunk whose packed bytes
    start at `chunk` and whose first scale is at `scale` (chunk_addresses), of index parity
    `chunk_parity`: the even chunk's two scales come first in the step's word."""
    return chunk - chunk_parity * 16, scale - chunk_parity * 2


@pytest.mark.parametrize("m, k", [(1, 256), (130, 512), (257, 1536), (40, 7168)])
def test_chunks_tile_their_source_and_output_exactly_once(m: int, k: int) -> None:
    per_row = k // A_CHUNK_K
    first = 1000  # the group's first chunk index in the call
    src_bytes, dst_bytes = set(), set()
    for local in range(m * per_row):
        src, sf, dst = chunk_addresses(first + local, first, k, lambda: BASES)
        row, kc = divmod(local, per_row)
        src, sf, dst = src - BASES[0], sf - BASES[1], dst - BASES[2]
        # 16 packed bytes = K elements 32 kc .. 32 kc + 31 of the row
        assert src == row * (k // 2) + 16 * kc
        src_bytes.update(range(src, src + 16))
        # its two 16-K blocks' scales, adjacent in the blocked layout
        assert sf == blocked_scale_offset(row, 2 * kc, k)
        assert sf + 1 == blocked_scale_offset(row, 2 * kc + 1, k)
        # 64 fp16 bytes inside this row's 64-K step (a 128-byte TMA box row), in the half
        # of it that holds K 32 kc .. 32 kc + 31 once the pairs are permuted back
        step = row * k * 2 + (kc // 2) * 128
        assert step <= dst and dst + 64 <= step + 128 and dst == step + 64 * (kc % 2)
        dst_bytes.update(range(dst, dst + 64))
    assert src_bytes == set(range(m * k // 2))
    assert dst_bytes == set(range(m * k * 2))


@pytest.mark.parametrize("m, k", [(1, 256), (130, 512), (40, 2880)])
def test_a_lanes_half_step_reads_its_parity_of_the_chunks_step(m: int, k: int) -> None:
    """From either chunk of a 64-K step (the lane's own, or a clamped one past the end), the
    lane of parity p reads packed words p, p + 2, p + 4, p + 6 of that step, each word 16-K
    block i's (position i), and the step's 4 scales as one aligned word; the two lanes
    together read the step's 32 bytes exactly once."""
    per_row = k // A_CHUNK_K
    first = 1000
    for local in range(m * per_row):
        src, sf, _ = chunk_addresses(first + local, first, k, lambda: BASES)
        row, kc = divmod(local, per_row)
        step = BASES[0] + row * (k // 2) + 32 * (kc // 2)
        read = []
        for p in range(2):
            step_at, scale = step_of_chunk(src, sf, kc % 2)
            base, offsets = half_step_addresses(step_at, p)
            assert all(isinstance(off, int) for off in offsets)  # immediates in the load
            words = [base + off for off in offsets]
            assert words == [step + 4 * (p + 2 * i) for i in range(4)]
            for i, w in enumerate(words):
                assert (w - step) * 2 // 16 == i  # the word's first K lies in block i
            read += [b for w in words for b in range(w, w + 4)]
            assert scale - BASES[1] == blocked_scale_offset(row, 4 * (kc // 2), k)
            assert scale % 4 == 0
            assert [scale - BASES[1] + j for j in range(4)] == [
                blocked_scale_offset(row, 4 * (kc // 2) + j, k) for j in range(4)]
        assert sorted(read) == list(range(step, step + 32))


def test_pair_stores_write_both_chunks_in_whole_sectors() -> None:
    """Two lanes (an even chunk and the next) exchange two vectors each and write both outputs
    in four stores, each store filling whole 32-byte sectors (staging.PAIR_STORES)."""
    from kernels.sm90.staging import PAIR_SEND, PAIR_STORES, pair_store_offset

    own = [{f"v{q}": ("chunk", p, q) for q in range(4)} for p in range(2)]  # lane p's vectors
    for p in range(2):  # what lane p receives is what its partner sends
        for r in range(2):
            own[p][f"r{r}"] = own[1 - p][PAIR_SEND[1 - p][r]]
    memory = {}
    for i in range(4):
        written = []
        for p in range(2):
            offset, name = PAIR_STORES[p][i]
            assert pair_store_offset(i, p) == offset
            at = 64 * p + offset  # the pair's outputs: chunk 0 at bytes 0..63, chunk 1 at 64..127
            assert at not in memory
            memory[at] = own[p][name]
            written.append(at)
        assert min(written) % 32 == 0 and sorted(written) == [min(written), min(written) + 16]
    # every 16 bytes hold the vector its chunk's own store order puts there
    assert memory == {64 * p + 16 * q: ("chunk", p, q) for p in range(2) for q in range(4)}
