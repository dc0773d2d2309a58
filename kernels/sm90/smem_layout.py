"""Where the weight tile's block scales sit in shared memory (no DSL import: CPU tests check the
same formula the kernel traces, on Python ints).

The scale TMA box of one stage is `blocks` 128-row blocks (config.scale_blocks) of the blocked
layout (facts.md), each SCALE_STAGE_BYTES long: K_TILE // 64 atoms of 512 bytes, one per 64-K
sub-step, an atom holding its 128 rows x 4 scales as (row % 32) * 16 + (row % 128 // 32) * 4 +
column. A tile of 192 weight rows starts `scale_row0` = 0 or 64 rows into its first block.
"""

from __future__ import annotations

from typing import Any

from .config import SCALE_ATOM_BYTES, SCALE_STAGE_BYTES


def scale_word_offset(row: Any, s: int, blocks: int, scale_row0: Any = 0, base: Any = 0) -> Any:
    """Byte offset (from `base`, the stage's first scale byte) of the aligned word holding the
    4 scales of tile row `row` for sub-step `s`. With one block the tile starts at a block
    boundary (scale_row0 is 0 and unused, and the expression stays as short as the kernel had
    it); terms are added to `base` left to right, as the kernel's code generation expects."""
    if blocks == 1:
        return base + s * SCALE_ATOM_BYTES + (row % 32) * 16 + (row // 32) * 4
    sr = row + scale_row0
    return (base + (sr // 128) * SCALE_STAGE_BYTES + s * SCALE_ATOM_BYTES + (sr % 32) * 16
            + ((sr % 128) // 32) * 4)
