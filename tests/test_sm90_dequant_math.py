"""The sm90 kernel's fp4 -> fp16 bit recipe, emulated exactly on the CPU (no DSL needed).

The device code in kernels/sm90/dequant.py is built from the constants tested here; this checks
that LUT bytes, PRMT selectors and sign shifts reproduce value * scale for every e2m1 code, every
position in a word, and every finite e4m3 scale, including the documented K-pair permutation.
"""

import struct

import math

import torch

from runtime.nvfp4 import E2M1_VALUES


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 default mode: bytes {b, a}; selector nibble bit 3 = replicate sign bit."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = src[nib & 7]
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0x00
        out |= byte << (8 * i)
    return out


def f16x2(word: int) -> tuple[float, float]:
    lo, hi = struct.unpack("<ee", struct.pack("<I", word))
    return float(lo), float(hi)


def _halves(word: int) -> torch.Tensor:
    return torch.tensor([word & 0xFFFF, word >> 16], dtype=torch.int32).to(torch.int16).view(
        torch.float16)


def mul_f16x2(a: int, b: int) -> int:
    """HMUL2 with round-to-nearest: torch multiplies fp16 exactly, then rounds once."""
    p = (_halves(a).float() * _halves(b).float()).half().view(torch.int16).int() & 0xFFFF
    return int(p[0]) | (int(p[1]) << 16)


def dequant_word(w: int, scale2: int) -> list[int]:
    from kernels.sm90.fp4_bits import LUT_HI, LUT_LO, PAIR_SELECTORS, SIGN_BITS

    mags = w & 0x77777777
    lo = prmt(LUT_LO, LUT_HI, mags)
    hi = prmt(LUT_LO, LUT_HI, mags >> 16)
    out = []
    for i in range(4):
        pair = prmt(lo, hi, PAIR_SELECTORS[i])
        signs = (w << (12 - 4 * i)) & 0xFFFFFFFF if i < 3 else w
        out.append(mul_f16x2(pair | (signs & SIGN_BITS), scale2))
    return out


def e4m3_values() -> list[tuple[int, float]]:
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return [(c, float(v)) for c, v in enumerate(codes.tolist()) if math.isfinite(v)]


def splat(scale: float) -> int:
    h = int(torch.tensor([scale], dtype=torch.float16).view(torch.int16)) & 0xFFFF
    return h | (h << 16)


def test_every_code_at_every_position_unit_scale() -> None:
    one = splat(1.0)
    for pos in range(8):
        for code in range(16):
            w = code << (4 * pos)
            vals = [v for word in dequant_word(w, one) for v in f16x2(word)]
            # output order: pairs (n0, n4), (n1, n5), (n2, n6), (n3, n7)
            order = [0, 4, 1, 5, 2, 6, 3, 7]
            expect = [E2M1_VALUES[code] if order[i] == pos else 0.0 for i in range(8)]
            assert vals == expect, (pos, code, vals)
            if code == 8:  # -0.0 keeps its sign
                assert math.copysign(1.0, vals[order.index(pos)]) == -1.0


def test_every_code_times_every_finite_e4m3_scale_is_exact() -> None:
    for _, scale in e4m3_values():
        s2 = splat(scale)
        w = 0x76543210  # codes 0..7 at positions 0..7
        got = [v for word in dequant_word(w, s2) for v in f16x2(word)]
        want = [E2M1_VALUES[c] * scale for c in (0, 4, 1, 5, 2, 6, 3, 7)]
        assert got == want, scale
        w = 0xFEDCBA98  # codes 8..15 (negative)
        got = [v for word in dequant_word(w, s2) for v in f16x2(word)]
        want = [E2M1_VALUES[c] * scale for c in (8, 12, 9, 13, 10, 14, 11, 15)]
        assert got == want, scale


def test_e4m3_to_fp16_is_exact() -> None:
    # cvt.rn.f16x2.e4m3x2 is exact because fp16 covers e4m3's range and precision.
    for _, v in e4m3_values():
        assert float(torch.tensor([v]).half()) == v


# ---------------------------------------------------------------- the weights' shift-form recipe


def select_bits(a: int, b: int, mask: int) -> int:
    """lop3 0xE4: (a & mask) | (b & ~mask)."""
    return ((a & mask) | (b & ~mask)) & 0xFFFFFFFF


def scales_w(scale_lo: float, scale_hi: float) -> int:
    from kernels.sm90.fp4_bits import W_SCALE_EXP

    pair = (splat(scale_lo) & 0xFFFF) | (splat(scale_hi) & 0xFFFF0000)
    return mul_f16x2(pair, splat(2.0 ** W_SCALE_EXP))


def dequant_word_w(w: int, scales: int, half: int) -> list[int]:
    """Emulates kernels/sm90/dequant.dequant_word_w instruction by instruction."""
    from kernels.sm90.fp4_bits import W_MAG_BITS, W_PAIRS, W_SIGNS

    signs = w & W_SIGNS
    even = select_bits((w << 1) & 0xFFFFFFFF, (signs << 4) & 0xFFFFFFFF, W_MAG_BITS)
    odd = select_bits(w >> 3, signs, W_MAG_BITS)
    lane = (scales >> (16 * half)) & 0xFFFF
    scale2 = lane | (lane << 16)
    return [mul_f16x2(prmt((even, odd)[src], 0, sel), scale2) for src, sel in W_PAIRS]


def test_shift_form_every_code_at_every_position() -> None:
    from kernels.sm90.fp4_bits import W_SCALE_EXP

    scales = scales_w(1.0, 1.0)
    order = [0, 4, 1, 5, 2, 6, 3, 7]  # the same pair order as dequant_word
    for pos in range(8):
        for code in range(16):
            w = code << (4 * pos)
            vals = [v for word in dequant_word_w(w, scales, 0) for v in f16x2(word)]
            expect = [E2M1_VALUES[code] * 2.0 ** (W_SCALE_EXP - 14) if order[i] == pos else 0.0
                      for i in range(8)]
            assert vals == expect, (pos, code, vals)
            if code == 8:
                assert math.copysign(1.0, vals[order.index(pos)]) == -1.0


def test_shift_form_times_every_finite_e4m3_scale_is_exact_after_unscaling() -> None:
    from kernels.sm90.fp4_bits import W_UNSCALE

    other = 3.0  # the half not picked must not leak in
    for _, scale in e4m3_values():
        for half in (0, 1):
            scales = scales_w(scale, other) if half == 0 else scales_w(other, scale)
            for w, codes in ((0x76543210, (0, 4, 1, 5, 2, 6, 3, 7)),
                             (0xFEDCBA98, (8, 12, 9, 13, 10, 14, 11, 15))):
                got = [v * W_UNSCALE for word in dequant_word_w(w, scales, half)
                       for v in f16x2(word)]
                assert got == [E2M1_VALUES[c] * scale for c in codes], (scale, half)


def test_shift_form_constants() -> None:
    from kernels.sm90.fp4_bits import W_SCALE_EXP, W_SCALE_F16X2, W_UNSCALE

    assert 448.0 * 2 ** W_SCALE_EXP <= 65504.0  # the largest scaled scale is a finite fp16
    assert W_UNSCALE * 2.0 ** (W_SCALE_EXP - 14) == 1.0
    assert f16x2(W_SCALE_F16X2) == (2.0 ** W_SCALE_EXP, 2.0 ** W_SCALE_EXP)
