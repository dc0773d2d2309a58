"""NVFP4 -> fp16 conversion in registers for the Hopper kernel (device code helpers).

One recipe (dequant_word_w, the shift form of fp4_bits) for both operands: the weights into
wgmma register fragments, the activations into the fp16 staging area (phase 1). Each value
leaves it as value * scale * 2^-7, so every product carries 2^-14, which the epilogue undoes
(fp4_bits.ACC_UNSCALE).

One 32-bit word holds 8 e2m1 codes n0..n7 (n_i in bits 4i..4i+3, element 2j in the low nibble).
It becomes 4 fp16x2 words holding the pairs (n0, n4), (n1, n5), (n2, n6), (n3, n7): the K order
inside each group of 8 is permuted, which is harmless because BOTH operands get this same pair
order, so every product still pairs the same k of A and B, and the 8 values share one scale.
Every step is exact, so HMUL2 rounds nothing (fp4_bits.W_SCALE_EXP's comment).
"""

from __future__ import annotations

from typing import Any

from cutlass import Uint32

from .fp4_bits import W_MAG_BITS, W_PAIRS, W_SCALE_F16X2, W_SIGNS
from .ptx import e4m3x2_to_f16x2, mul_f16x2, mul_f16x2_by_half, prmt, select_bits, shl


def dequant_word_w(w: Any, scales: Any, half: int) -> list[Uint32]:
    """8 e2m1 codes times half `half` of a `scales_w` word -> 4 fp16x2 words, pairs (n0, n4),
    (n1, n5), (n2, n6), (n3, n7), each value * scale * 2^(W_SCALE_EXP - 14). 14 instructions
    per word: 3 LOP3, 3 shifts, 4 PRMT, 4 HMUL2 (the scale's splat folded into the operand)."""
    w = Uint32(w)
    signs = w & Uint32(W_SIGNS)
    # Byte j of `even` is the fp16 high byte of n_2j: magnitude from w << 1, sign from bit 8j+3.
    even = select_bits(w << Uint32(1), shl(signs, 4), Uint32(W_MAG_BITS))
    odd = select_bits(w >> Uint32(3), signs, Uint32(W_MAG_BITS))
    sources = (even, odd)
    return [mul_f16x2_by_half(prmt(sources[src], Uint32(0), Uint32(sel)), scales, half)
            for src, sel in W_PAIRS]


def scales_w(two_scale_bytes: Any) -> Uint32:
    """Two e4m3 scales (low 16 bits) -> fp16x2, each times 2^W_SCALE_EXP (exact: 448 * 128 <
    65504), for dequant_word_w's `scales` (which picks one half)."""
    return mul_f16x2(e4m3x2_to_f16x2(two_scale_bytes), Uint32(W_SCALE_F16X2))


def dequant_chunk(words: Any, two_scale_bytes: Any) -> list[list[Uint32]]:
    """Four words (32 K) whose two 16-K blocks' scales are the two bytes: words 0, 1 take the
    first scale (half 0), words 2, 3 the second. One dequant_word_w list per word."""
    both = scales_w(two_scale_bytes)
    return [dequant_word_w(words[i], both, i // 2) for i in range(4)]
