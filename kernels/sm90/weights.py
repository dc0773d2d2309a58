"""The weights' path into wgmma registers (RS wgmma): a consumer thread's packed words and
scales of one 64-K step, read from shared memory and converted into its A-operand fragment. A
mixin of Sm90GroupedGemm (kernels/sm90/grouped_gemm.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from .dequant import dequant_word_w, scales_w
from .fp4_bits import fragment_word
from .ptx import ld_shared_u32, prmt
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
        ours to choose (both operands follow it): packed word c of a row (8 e2m1) feeds blocks
        0 and 1 of thread c, word c + 4 blocks 2 and 3, so each thread reads 2 words per row.
        """
        for half in cutlass.range_constexpr(2):
            self._convert_b_half(words, ct, half,
                                 self._load_b_half(ct, s, half, packed, scales, scale_row0))

    @cute.jit
    def _load_b_half(self, ct: Int32, s: int, half: int, packed: Int32, scales: Int32,
                     scale_row0: Int32) -> tuple:
        """The shared-memory words of row r0 + 8 half for sub-step `s` (_dequant_b_fragment):
        its packed words c and c + 4, and its 4 scales of the step."""
        t = ct % 128
        c = t % 4
        row = (ct // 128) * 64 + (t // 32) * 16 + (t % 32) // 4 + 8 * half
        base = packed + row * PACKED_ROW_BYTES
        lo = ld_shared_u32(base + (((2 * s) ^ (row % 8)) * 16) + 4 * c)
        hi = ld_shared_u32(base + (((2 * s + 1) ^ (row % 8)) * 16) + 4 * c)
        four = ld_shared_u32(scale_word_offset(row, s, self.scale_blocks, scale_row0,
                                               base=scales))
        return lo, hi, four

    @cute.jit
    def _convert_b_half(self, words: cute.Tensor, ct: Int32, half: int, loaded: tuple) -> None:
        """Convert one row's loaded words (_load_b_half) into its fragment slots."""
        lo, hi, four = loaded
        c = (ct % 128) % 4
        # Word c uses scale column c // 2 and word c + 4 column 2 + c // 2.
        sel = Uint32(c // 2) | (Uint32(2 + c // 2) << Uint32(4))
        both = scales_w(prmt(four, 0, sel))
        d_lo = dequant_word_w(lo, both, 0)
        d_hi = dequant_word_w(hi, both, 1)
        for q in cutlass.range_constexpr(4):
            words[fragment_word(q, half, 0)] = d_lo[q]
            words[fragment_word(q, half, 1)] = d_hi[q]
