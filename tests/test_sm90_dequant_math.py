"""The sm90 kernel's fp4 -> fp16 bit recipe, emulated exactly on the CPU (no DSL needed).

The device code in kernels/sm90/dequant.py is built from the constants tested here; this checks
that its shifts, LOP3 masks and PRMT selectors reproduce value * scale * 2^-7 for every e2m1
code, every position in a word, and every finite e4m3 scale, including the documented K-pair
permutation, and that products of two such operands unscale exactly in fp32.
"""

import math
import struct

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


def e4m3_values() -> list[tuple[int, float]]:
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return [(c, float(v)) for c, v in enumerate(codes.tolist()) if math.isfinite(v)]


def splat(scale: float) -> int:
    h = int(torch.tensor([scale], dtype=torch.float16).view(torch.int16)) & 0xFFFF
    return h | (h << 16)


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
    order = [0, 4, 1, 5, 2, 6, 3, 7]  # output pairs (n0, n4), (n1, n5), (n2, n6), (n3, n7)
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


def test_products_of_two_scaled_operands_unscale_exactly_in_fp32() -> None:
    """Both operands carry 2^-7 (A staged or converted per tile, B in registers): every product
    of two recipe outputs, accumulated in fp32 and multiplied by ACC_UNSCALE, equals the
    unscaled product, from the smallest to the largest magnitudes."""
    from kernels.sm90.fp4_bits import ACC_UNSCALE

    scales = sorted({abs(v) for _, v in e4m3_values() if v != 0})
    picks = [scales[0], scales[1], 1.0, scales[-2], scales[-1]]
    outs = []
    for scale in picks:
        for w in (0x76543210, 0xFEDCBA98):
            outs += [v for word in dequant_word_w(w, scales_w(scale, scale), 0)
                     for v in f16x2(word)]
    exact = [v for v in outs if v != 0.0]
    a = torch.tensor(exact, dtype=torch.float32)
    prods = torch.outer(a, a)
    assert float(prods.abs().min()) == 2.0 ** -34  # (0.5 * 2^-9 * 2^-7)^2: no fp32 subnormal
    from kernels.sm90.fp4_bits import W_UNSCALE

    values = a.double() * W_UNSCALE  # value * scale of each operand (the recipe undone)
    assert torch.equal((prods * ACC_UNSCALE).double(), torch.outer(values, values))
    # A power-of-two scale commutes with fp32 rounding: summing the scaled products in any
    # order and unscaling gives bit for bit the fp32 sum of the unscaled products.
    unscaled = (prods.double() * ACC_UNSCALE).float()
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        order = torch.randperm(prods.numel(), generator=gen)[:512]
        acc_scaled = acc_plain = torch.zeros((), dtype=torch.float32)
        for i in order.tolist():
            acc_scaled = acc_scaled + prods.view(-1)[i]
            acc_plain = acc_plain + unscaled.view(-1)[i]
        assert float(acc_scaled * ACC_UNSCALE) == float(acc_plain)
    assert ACC_UNSCALE == 2.0 ** 14
