"""The staged-A kernel's epilogue: the accumulator to C in 16-byte rows, through a small
per-warp shared-memory buffer (a mixin of Sm90GroupedGemm, kernels/sm90/grouped_gemm.py).

A thread's accumulator holds pairs of C rows for one C column (wgmma M walks C's columns, the
weights), so a direct store writes 2 bytes at a time. stmatrix .trans turns four 8x8 blocks of
the fragment into 8 C rows x 8 consecutive C columns each, and every lane then stores 16 bytes.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .fp4_bits import W_UNSCALE
from .ptx import ld_shared_v4, pack_f16x2, st_global_v4, stmatrix_x4_trans
from .structure import WARPGROUP

EPILOGUE_BYTES_PER_WARP = 512  # four 8x8 fp16 blocks


class VectorStores:
    """C written 16 bytes per lane (v3; v2 keeps grouped_gemm._store_tile)."""

    @cute.jit
    def _store_tile_vec(self, acc, c_address: Int64, m: Int32, n: Int32, row0: Int32,
                        col0: Int32, ct: Int32, epilogue: Int32) -> None:
        """acc (this thread's share of its warpgroup's 64 x tile_m block: value i = v0 + 2 v1
        + 4 j at wgmma (M, N) = (16 w + lane / 4 + 8 v1, 2 (lane % 4) + v0 + 8 j), the SM90
        64xN accumulator layout) -> C[row0 + N, col0 + 64 warpgroup + M] as fp16; rows >= m and
        columns >= n untouched. `epilogue` is the shared address of the consumers' buffers."""
        lane = ct % 32
        buf = epilogue + (ct // 32) * EPILOGUE_BYTES_PER_WARP + lane * 16
        # After the transpose lane L holds row L % 8 of block L // 8: blocks are (v1, j) with
        # v1 = block % 2 and j = j0 + block // 2.
        block = lane // 8
        col = col0 + (ct // WARPGROUP) * 64 + ((ct % WARPGROUP) // 32) * 16 + 8 * (block % 2)
        c_row = row0 + 8 * (block // 2) + lane % 8
        for j0 in cutlass.range_constexpr(0, cute.size(acc) // 4, 2):
            regs = []
            for b in cutlass.range_constexpr(4):
                i = 2 * (b % 2) + 4 * (j0 + b // 2)
                # Register weights leave dequant_word_w scaled by 2^-7 (fp4_bits.W_SCALE_EXP).
                regs.append(pack_f16x2(acc[i] * Float32(W_UNSCALE),
                                       acc[i + 1] * Float32(W_UNSCALE)))
            cute.arch.sync_warp()  # the previous round's reads of the buffer are done
            stmatrix_x4_trans(buf, *regs)
            cute.arch.sync_warp()
            words = ld_shared_v4(buf)
            row = c_row + 8 * j0
            if row < m and col < n:
                st_global_v4(c_address + (Int64(row) * Int64(n) + Int64(col)) * 2, *words)
