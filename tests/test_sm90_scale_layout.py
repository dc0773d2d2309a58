"""The weight tile's scale addresses in shared memory (kernels/sm90/smem_layout.py) against an
emulation of what the scale TMA box loads: for every row of a 128- or 192-row tile, wherever the
tile starts, the word the consumer reads must hold that row's 4 scales of the sub-step."""

from __future__ import annotations

import pytest

from kernels.sm90.config import SCALE_STAGE_BYTES, scale_blocks
from kernels.sm90.smem_layout import scale_word_offset


def blocked_offset(row: int, kblock: int, scale_k: int) -> int:
    """Byte of scale (row, 16-K block) in the blocked layout of facts.md (scale_k = K / 64)."""
    return (((row // 128) * scale_k + kblock // 4) * 512 + (row % 32) * 16
            + ((row % 128) // 32) * 4 + kblock % 4)


def tma_stage(row0: int, kt: int, blocks: int, scale_k: int, num_blocks: int) -> list:
    """Which global byte each byte of the stage holds when the kernel's scale box (256 B, 8,
    blocks) loads at (0, 8 kt, row0 // 128) of the (256, 2 scale_k, 128-row blocks) view:
    a global offset, or None where the box is past the last block (TMA writes zeros)."""
    out = []
    for b in range(blocks):
        blk = row0 // 128 + b
        for i in range(8):
            start = blk * scale_k * 512 + (8 * kt + i) * 256
            out += list(range(start, start + 256)) if blk < num_blocks else [None] * 256
    assert len(out) == blocks * SCALE_STAGE_BYTES
    return out


@pytest.mark.parametrize("tile_n", [128, 192, 256])
def test_every_row_reads_its_own_scales(tile_n: int) -> None:
    n, k = 1000, 512  # 8 blocks of 128 rows (padded), 2 K tiles
    scale_k, num_blocks = k // 64, -(-n // 128)
    blocks = scale_blocks(tile_n)
    for t in range(-(-n // tile_n)):
        row0 = t * tile_n
        for kt in range(k // 256):
            stage = tma_stage(row0, kt, blocks, scale_k, num_blocks)
            for row in range(tile_n):
                r = row0 + row
                for s in range(4):
                    at = scale_word_offset(row, s, blocks, row0 % 128)
                    assert at % 4 == 0 and at + 4 <= len(stage)
                    if r < num_blocks * 128:
                        want = [blocked_offset(r, 16 * kt + 4 * s + c, scale_k) for c in range(4)]
                    else:  # past the last block: the box reads zeros (and C is not stored)
                        want = [None] * 4
                    assert stage[at:at + 4] == want, (tile_n, t, row, s)


def test_one_block_form_ignores_the_offset_and_matches_the_general_form() -> None:
    for row in range(128):
        for s in range(4):
            one = scale_word_offset(row, s, 1)
            assert one == scale_word_offset(row, s, 1, 64) == scale_word_offset(row, s, 2, 0)
            assert scale_word_offset(row, s, 1, base=1000) == 1000 + one
