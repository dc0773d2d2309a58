"""NVFP4 -> fp16 conversion in registers for the Hopper kernel (device code helpers).

One 32-bit word holds 8 e2m1 codes n0..n7 (n_i in bits 4i..4i+3, element 2j in the low nibble).
It becomes 4 fp16x2 words holding the pairs (n0, n4), (n1, n5), (n2, n6), (n3, n7): the K order
inside each group of 8 is permuted, which is harmless because BOTH operands go through this same
function, so every product still pairs the same k of A and B, and the 8 values share one scale.

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

from .ptx import e4m3x2_to_f16x2, mul_f16x2, prmt
from .fp4_bits import LUT_HI, LUT_LO, PAIR_SELECTORS, SIGN_BITS


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
