"""The weights' path into wgmma registers (RS wgmma): a consumer thread's packed words and
scales of one 64-K step, read from shared memory and converted into its A-operand fragment. A
mixin of Sm90GroupedGemm (kernels/sm90/grouped_gemm.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from .dequant import dequant_word_w, scales_w
from .fp4_bits import fragment_word, thread_step_bytes
from .ptx import ld_shared_u8, ld_shared_v2, prmt
from .smem_layout import scale_word_offset
from .structure import PACKED_ROW_BYTES


class WeightFragments:
    """Weights dequantized straight into wgmma A-operand registers."""

    @cute.jit
    def _dequant_b_fragment(self, words: cute.Tensor, ct: Int32, s: int, packed: Int32,
                            scales: Int32, scale_row0: Int32 = 0) -> None:
        """Dequantize sub-step `s` of this thread's B rows straight into its wgmma A fragment.

        The fragment of thread (warp w, lane l) holds rows r0 = 16 w + l / 4 (+ 64 per
        warpgroup) and r1 = r0 + 8 at K positions 2c, 2c+1, 2c+8, 2c+9 of each k16 block
        (c = l % 4); word index 4 kb + 2 khalf + rowhalf. The K order inside a 64-K step is
        ours to choose (both operands follow it, fp4_bits): thread c reads packed bytes
        8c..8c+7 of each of its rows (one 8-byte load, 16 K of one scale block), word 2c feeding
        blocks 0 and 1 and word 2c + 1 blocks 2 and 3.
        """
        self._convert_b_step(words, self._load_b_step(ct, s, packed, scales, scale_row0))

    @cute.jit
    def _load_b_step(self, ct: Int32, s: int, packed: Int32, scales: Int32,
                     scale_row0: Int32) -> tuple:
        """The shared-memory words of sub-step `s` (_dequant_b_fragment): for rows r0 and
        r0 + 8, packed words 2c and 2c + 1 and the scale byte of their 16-K block c."""
        t = ct % 128
        c = t % 4
        row0 = (ct // 128) * 64 + (t // 32) * 16 + (t % 32) // 4
        chunk, byte = thread_step_bytes(s, c)  # the same bytes of both rows
        loaded = []
        for half in cutlass.range_constexpr(2):
            row = row0 + 8 * half
            lo, hi = ld_shared_v2(packed + row * PACKED_ROW_BYTES
                                  + ((chunk ^ (row % 8)) * 16) + byte)
            scale = ld_shared_u8(scale_word_offset(row, s, self.scale_blocks, scale_row0,
                                                   base=scales) + c)
            loaded.append((lo, hi, scale))
        return tuple(loaded)

    @cute.jit
    def _convert_b_step(self, words: cute.Tensor, loaded: tuple) -> None:
        """Convert both rows' loaded words (_load_b_step) into the fragment slots: one scale
        conversion for the two rows (_row_scales)."""
        both = self._row_scales(loaded)
        for half in cutlass.range_constexpr(2):
            lo, hi, _ = loaded[half]
            d_lo = dequant_word_w(lo, both, half)
            d_hi = dequant_word_w(hi, both, half)
            for q in cutlass.range_constexpr(4):
                words[fragment_word(q, half, 0)] = d_lo[q]
                words[fragment_word(q, half, 1)] = d_hi[q]

    @staticmethod
    def _row_scales(loaded: tuple) -> Uint32:
        """Both rows' scale bytes (_load_b_step) as one scales_w word: half 0 row r0's, half 1
        row r0 + 8's (selector 0x0040: byte 0 of the first, then byte 0 of the second)."""
        return scales_w(prmt(loaded[0][2], loaded[1][2], Uint32(0x0040)))
