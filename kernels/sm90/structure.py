"""Layout facts of the sm_90a kernel that its parts share (kernels/sm90/grouped_gemm.py and the
role mixins: staged.py, producer.py, consumer.py, weights.py, ...)."""

from __future__ import annotations

from .config import K_TILE, SUB_K

PACKED_ROW_BYTES = K_TILE // 2  # one 128-byte (swizzle-128B) row of packed fp4 per operand row
SUB_STEPS = K_TILE // SUB_K
# One 128-row block's scales of a stage as (256 bytes, 8) for TMA (box dims <= 256).
SCALE_BOX = (256, 2 * K_TILE // 64)
# Warpgroup 0: producer (warp 0 issues TMA); one consumer warpgroup per 64 weight rows of the tile.
WARPGROUP = 128
# Operand order inside a descriptor set of tma.MAPS_PER_SET maps (OP_A: the fp16 copy of A). The
# fourth map (A's scales) is never patched: phase 1 reads them with plain loads. Its slot stays,
# so the descriptor addresses (and the cubins) did not change when v2, which used it, went.
OP_B, OP_A, OP_SFB = range(3)
