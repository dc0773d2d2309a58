"""NVFP4 -> fp16 conversion in registers for the Hopper kernel (device code helpers).

Two recipes: dequant_word (below, exact value * scale; activations) and dequant_word_w (the
weights' register fragments; fewer instructions, value * scale * 2^-7, undone in the epilogue).

One 32-bit word holds 8 e2m1 codes n0..n7 (n_i in bits 4i..4i+3, element 2j in the low nibble).
It becomes 4 fp16x2 words holding the pairs (n0, n4), (n1, n5), (n2, n6), (n3, n7): the K order
inside each group of 8 is permuted, which is harmless because BOTH operands get this same pair
order (both recipes), so every product still pairs the same k of A and B, and the 8 values share
one scale.

Per word: 1 AND, 1 SHR, 2 PRMT look up the fp16 high bytes of the 8 magnitudes (the low byte of
every e2m1 value in fp16 is zero), then per output pair 1 PRMT places two high bytes (its
sign-replicate selector nibble 8 yields a zero byte, since no magnitude byte has bit 7 set),
1 shift + 1 LOP3 move both sign bits to bits 15 and 31, and 1 HMUL2 applies the block scale.
Every step is exact: value * scale has at most 5 significant bits and lies in [2^-10, 2688]
(facts.md), inside fp16's range, so the product is representable and HMUL2 rounds nothing.
"""

from __future__ import annotations

from typing import Any

from cutlass import Uint32

from .ptx import e4m3x2_to_f16x2, mul_f16x2, mul_f16x2_by_half, prmt, select_bits, shl
from .fp4_bits import (LUT_HI, LUT_LO, PAIR_SELECTORS, SIGN_BITS, W_MAG_BITS, W_PAIRS,
                       W_SCALE_EXP, W_SCALE_F16X2, W_SIGNS)


def dequant_word(w: Any, scale2: Any) -> list[Uint32]:
    """8 e2m1 codes (one word) times a splatted fp16x2 scale -> 4 fp16x2 words (pairs i, i+4)."""
    w = Uint32(w)
    mags = w & Uint32(0x77777777)
    lo = prmt(LUT_LO, LUT_HI, mags)
    hi = prmt(LUT_LO, LUT_HI, mags >> Uint32(16))
    out = []
    for i in range(4):
        pair = prmt(lo, hi, PAIR_SELECTORS[i])
        # Sign of n_i sits at bit 4i+3 and of n_{i+4} at bit 4i+19: move both up by 12 - 4i.
        signs = (w << Uint32(12 - 4 * i)) if i < 3 else w
        out.append(mul_f16x2(pair | (signs & Uint32(SIGN_BITS)), scale2))
    return out


def scale_pair(two_scale_bytes: Any) -> tuple[Uint32, Uint32]:
    """Two e4m3 scale bytes (low 16 bits) -> each splatted into an fp16x2 word."""
    both = e4m3x2_to_f16x2(two_scale_bytes)
    return prmt(both, 0, 0x1010), prmt(both, 0, 0x3232)


def dequant_word_w(w: Any, scales: Any, half: int) -> list[Uint32]:
    """The weights' cheaper recipe (fp4_bits, shift form): 8 e2m1 codes times half `half` of a
    `scales_w` word -> 4 fp16x2 words, pairs (n0, n4), (n1, n5), (n2, n6), (n3, n7) as in
    dequant_word, each value * scale * 2^(W_SCALE_EXP - 14). 14 instructions per word against
    dequant_word's 20 (plus its 2 re-materialized LUT constants): 3 LOP3, 3 shifts, 4 PRMT,
    4 HMUL2, with the scale's splat folded into the HMUL2 operand."""
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

