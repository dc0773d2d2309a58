"""CPU tests of runtime/nvfp4.py: format tables, packing, blocked scales, quantization, reference.

Expected values are computed independently of the module wherever it matters: e2m1 and e4m3 are
decoded from their bit definitions, the blocked layout from the explicit offset formula of
facts.md with Python loops, and the reference from a naive triple loop over bytes.
"""

from __future__ import annotations

import ast
import math
import sys

import pytest
import torch

from runtime import nvfp4
from runtime.errors import InputError
from runtime.nvfp4 import (
    E2M1_VALUES,
    SF_VEC,
    apply_alpha,
    as_uint8,
    blocked_scale_numel,
    blocked_scale_offset,
    check_close,
    dequantize_nvfp4,
    fp4_to_float,
    from_blocked,
    global_scale_for,
    make_grouped_problem,
    pack_fp4,
    quantize_grouped,
    quantize_nvfp4,
    random_nvfp4,
    reference_grouped_gemm,
    to_blocked,
    unpack_fp4,
)

E4M3 = torch.float8_e4m3fn
FP4 = getattr(torch, "float4_e2m1fn_x2", None)


# ------------------------------------------------------------------------------------------
# Independent decoders (bit definitions, no module code)
# ------------------------------------------------------------------------------------------


def e2m1_from_bits(code: int) -> float:
    """e2m1: 1 sign, 2 exponent (bias 1), 1 mantissa bit; exponent 0 is subnormal."""
    sign = -1.0 if code & 0x8 else 1.0
    exp, man = (code >> 1) & 0x3, code & 0x1
    mag = man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2)
    return sign * mag


def e4m3_from_bits(byte: int) -> float:
    """e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN, no infinities."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    if exp == 0xF and man == 0x7:
        return math.nan
    mag = man / 8 * 2.0**-6 if exp == 0 else 2.0 ** (exp - 7) * (1 + man / 8)
    return sign * mag


E4M3_POSITIVE = sorted(e4m3_from_bits(b) for b in range(0x7F))  # 0 .. 448, 127 values


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def canonical(codes: torch.Tensor) -> torch.Tensor:
    """Map -0 (code 8) to +0 (code 0): both decode to zero."""
    return torch.where(codes == 8, torch.zeros_like(codes), codes)


# ------------------------------------------------------------------------------------------
# E2M1 table, dtype views, packing
# ------------------------------------------------------------------------------------------


def test_e2m1_table_matches_bit_definition():
    assert len(E2M1_VALUES) == 16
    for code, value in enumerate(E2M1_VALUES):
        expected = e2m1_from_bits(code)
        assert value == expected, code
        assert math.copysign(1.0, value) == math.copysign(1.0, expected), code
    assert E2M1_VALUES[:8] == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    assert math.copysign(1.0, E2M1_VALUES[8]) == -1.0  # code 8 is -0.0


def test_e2m1_table_matches_torch_when_torch_can_convert():
    if FP4 is None:
        pytest.skip("torch has no float4_e2m1fn_x2")
    packed = torch.arange(256, dtype=torch.uint8)  # byte b holds codes (b & 15, b >> 4)
    try:
        converted = packed.view(FP4).to(torch.float32)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        pytest.skip(f"torch cannot convert float4_e2m1fn_x2 here ({exc}); checked against bits")
    expected = fp4_to_float(packed.view(1, 256)).reshape(256, 2)
    assert converted.numel() in (256, 512)
    if converted.numel() == 512:
        assert torch.equal(converted.reshape(256, 2), expected)


def test_as_uint8_views_without_copy():
    raw = torch.tensor([0x21, 0xF8, 0x00], dtype=torch.uint8)
    assert as_uint8(raw) is raw
    e4 = torch.tensor([1.0, 2.0, 0.5]).to(E4M3)
    v = as_uint8(e4)
    assert v.dtype == torch.uint8 and v.data_ptr() == e4.data_ptr()
    assert v.tolist() == [0x38, 0x40, 0x30]
    if FP4 is not None:
        f4 = raw.clone().view(FP4)
        v4 = as_uint8(f4)
        assert v4.dtype == torch.uint8 and v4.data_ptr() == f4.data_ptr()
        assert v4.tolist() == [0x21, 0xF8, 0x00]
    with pytest.raises(ValueError, match=r"must be .*, but got torch.float32"):
        as_uint8(torch.zeros(3))
    with pytest.raises(ValueError, match=r"must be .*, but got torch.int8"):
        as_uint8(torch.zeros(3, dtype=torch.int8), "sfa")


def test_pack_nibble_order():
    # element 0 -> low nibble, element 1 -> high nibble
    assert pack_fp4(torch.tensor([[1, 2]], dtype=torch.uint8)).tolist() == [[0x21]]
    assert pack_fp4(torch.tensor([[15, 0, 0, 15]], dtype=torch.uint8)).tolist() == [[0x0F, 0xF0]]
    assert unpack_fp4(torch.tensor([[0xAB, 0x10]], dtype=torch.uint8)).tolist() == [
        [0xB, 0xA, 0x0, 0x1]
    ]


def test_pack_unpack_round_trip_all_bytes():
    codes = torch.randint(0, 16, (7, 64), generator=gen(0), dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.shape == (7, 32)
    assert torch.equal(unpack_fp4(packed), codes)
    every_byte = torch.arange(256, dtype=torch.uint8).view(2, 128)
    assert torch.equal(pack_fp4(unpack_fp4(every_byte)), every_byte)


def test_pack_rejects_bad_codes():
    with pytest.raises(ValueError, match="0..15"):
        pack_fp4(torch.tensor([[16, 0]], dtype=torch.uint8))
    with pytest.raises(ValueError, match="even"):
        pack_fp4(torch.tensor([[1, 2, 3]], dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        pack_fp4(torch.tensor([[1, 2]], dtype=torch.int32))


def test_fp4_to_float_decodes_every_byte():
    packed = torch.arange(256, dtype=torch.uint8).view(4, 64)
    out = fp4_to_float(packed)
    assert out.dtype == torch.float32 and out.shape == (4, 128)
    flat = out.reshape(-1).tolist()
    for b in range(256):
        assert flat[2 * b] == e2m1_from_bits(b & 0xF)
        assert flat[2 * b + 1] == e2m1_from_bits(b >> 4)
    assert fp4_to_float(torch.tensor([[0x21, 0xF8]], dtype=torch.uint8)).tolist() == [
        [0.5, 1.0, -0.0, -6.0]
    ]
    if FP4 is not None:
        assert torch.equal(fp4_to_float(packed.view(FP4)), out)


# ------------------------------------------------------------------------------------------
# Blocked scale layout
# ------------------------------------------------------------------------------------------


def test_blocked_scale_offset_hand_values():
    assert blocked_scale_offset(0, 0, 64) == 0
    assert blocked_scale_offset(0, 1, 64) == 1
    assert blocked_scale_offset(0, 3, 64) == 3
    assert blocked_scale_offset(1, 0, 64) == 16
    assert blocked_scale_offset(31, 0, 64) == 496
    assert blocked_scale_offset(32, 0, 64) == 4
    assert blocked_scale_offset(127, 3, 64) == 511
    assert blocked_scale_offset(0, 4, 256) == 512
    assert blocked_scale_offset(128, 0, 256) == 4 * 512  # rest_k = 4 atoms per M block
    assert blocked_scale_offset(128, 0, 80) == 2 * 512  # rest_k = ceil(80 / 64) = 2


def test_blocked_scale_numel():
    assert blocked_scale_numel(1, 64) == 512
    assert blocked_scale_numel(40, 7168) == 128 * 112 * 4
    assert blocked_scale_numel(129, 64) == 256 * 4
    assert blocked_scale_numel(300, 768) == 384 * 48
    assert blocked_scale_numel(128, 80) == 128 * 8  # 5 scale columns padded to 8
    with pytest.raises(ValueError):
        blocked_scale_numel(8, 40)


def expected_blocked(scales_u8: torch.Tensor, k: int, pad: int) -> list[int]:
    rows, cols = scales_u8.shape
    out = [pad] * blocked_scale_numel(rows, k)
    vals = scales_u8.tolist()
    for i in range(rows):
        for j in range(cols):
            out[blocked_scale_offset(i, j, k)] = vals[i][j]
    return out


ROWS = [1, 40, 128, 129, 300]
KS = [64, 256, 768]


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", KS + [32, 80])
def test_to_blocked_matches_offset_formula(rows, k):
    raw = torch.randint(0, 0x7F, (rows, k // SF_VEC), generator=gen(rows * 1000 + k),
                        dtype=torch.uint8)  # fmt: skip
    scales = raw.view(E4M3)
    blocked = to_blocked(scales)
    assert blocked.dtype == E4M3 and blocked.dim() == 1
    assert blocked.numel() == blocked_scale_numel(rows, k)
    assert blocked.view(torch.uint8).tolist() == expected_blocked(raw, k, 0)
    # uint8 in, uint8 out, same bytes
    blocked_u8 = to_blocked(raw)
    assert blocked_u8.dtype == torch.uint8
    assert torch.equal(blocked_u8, blocked.view(torch.uint8))


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", KS + [32, 80])
def test_from_blocked_inverts_to_blocked(rows, k):
    raw = torch.randint(0, 256, (rows, k // SF_VEC), generator=gen(7 + rows + k),
                        dtype=torch.uint8)  # fmt: skip
    assert torch.equal(from_blocked(to_blocked(raw), rows, k), raw)
    back = from_blocked(to_blocked(raw.view(E4M3)), rows, k)
    assert back.dtype == E4M3 and back.shape == (rows, k // SF_VEC)
    assert torch.equal(back.view(torch.uint8), raw)
    # and the other way round, for a blocked buffer whose padding is the pad value
    blocked = to_blocked(raw, pad_value=0x5A)
    assert torch.equal(to_blocked(from_blocked(blocked, rows, k), pad_value=0x5A), blocked)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", KS + [80])
def test_padding_lands_only_in_padding(rows, k):
    cols = k // SF_VEC
    scales = torch.full((rows, cols), 1.5).to(E4M3)
    blocked = to_blocked(scales, pad_value=float("nan")).float()
    real = {blocked_scale_offset(i, j, k) for i in range(rows) for j in range(cols)}
    nan_pos = set(torch.isnan(blocked).nonzero().reshape(-1).tolist())
    assert nan_pos == set(range(blocked.numel())) - real
    assert all(blocked[p].item() == 1.5 for p in real)
    # a uint8 pad value is a byte
    u8 = to_blocked(torch.zeros((rows, cols), dtype=torch.uint8), pad_value=0xFF)
    assert set((u8 == 0xFF).nonzero().reshape(-1).tolist()) == set(range(u8.numel())) - real


def test_from_blocked_rejects_wrong_size():
    with pytest.raises(ValueError, match="1-D with 512 elements"):
        from_blocked(torch.zeros(1024, dtype=torch.uint8), 40, 64)


# ------------------------------------------------------------------------------------------
# Quantization
# ------------------------------------------------------------------------------------------


def on_grid_operand(rows: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random codes with a +-6 in every block (so amax / 6 is the scale) and random e4m3 scales;
    a few all-zero blocks with scale 0."""
    g = gen(seed)
    codes = torch.randint(0, 16, (rows, k), generator=g, dtype=torch.uint8)
    nb = k // SF_VEC
    where6 = torch.randint(0, SF_VEC, (rows, nb), generator=g)
    sign = torch.randint(0, 2, (rows, nb), generator=g, dtype=torch.uint8) * 8
    blocks = codes.view(rows, nb, SF_VEC)
    blocks.scatter_(2, where6[..., None], (7 + sign)[..., None])
    scale_bytes = torch.randint(1, 0x7F, (rows, nb), generator=g, dtype=torch.uint8)
    zero = torch.rand((rows, nb), generator=g) < 0.1
    blocks[zero] = 0
    scale_bytes[zero] = 0
    return pack_fp4(codes), scale_bytes.view(E4M3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_round_trip_exact_on_grid(dtype):
    packed, scales = on_grid_operand(24, 256, seed=3)
    x = dequantize_nvfp4(packed, scales)
    x_in = x.to(dtype)
    assert torch.equal(x_in.to(torch.float32), x)  # on-grid values are exact in bf16 / fp16
    q, s = quantize_nvfp4(x_in)
    assert q.dtype == torch.uint8 and q.shape == (24, 128)
    assert s.dtype == E4M3 and s.shape == (24, 16)
    assert torch.equal(s.view(torch.uint8), scales.view(torch.uint8))
    assert torch.equal(canonical(unpack_fp4(q)), canonical(unpack_fp4(packed)))
    assert torch.equal(dequantize_nvfp4(q, s), x)


@pytest.mark.parametrize("global_scale", [0.375, 3.1, 1e-3])
def test_quantize_round_trip_with_global_scale(global_scale):
    packed, scales = on_grid_operand(16, 128, seed=5)
    x = dequantize_nvfp4(packed, scales, global_scale)
    assert torch.allclose(x, dequantize_nvfp4(packed, scales) * global_scale)
    q, s = quantize_nvfp4(x, global_scale=global_scale)
    assert torch.equal(s.view(torch.uint8), scales.view(torch.uint8))
    assert torch.equal(canonical(unpack_fp4(q)), canonical(unpack_fp4(packed)))


def test_quantize_ties_go_to_even_code_and_saturate():
    # scale is 1 (amax 6); the other values sit exactly between two grid points
    row = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0,
           -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 0.0]  # fmt: skip
    q, s = quantize_nvfp4(torch.tensor([row]))
    assert s.float().tolist() == [[1.0]]
    expected = [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0,
                0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0, 0.0]  # fmt: skip
    assert fp4_to_float(q).tolist() == [expected]
    assert unpack_fp4(q)[0, 8].item() == 0  # rounds to +0, not -0
    # just off the midpoints round to the nearest point
    off = [6.0, 0.26, 0.74, 1.26, 1.74, 2.51, 3.49, 5.01, 5.99] + [0.0] * 7
    q, _ = quantize_nvfp4(torch.tensor([off]))
    assert fp4_to_float(q)[0, :9].tolist() == [6.0, 0.5, 0.5, 1.5, 1.5, 3.0, 3.0, 6.0, 6.0]


def test_quantize_zero_tiny_and_huge_blocks():
    x = torch.zeros(3, 48)
    x[1, :16] = 1e-7  # amax / 6 rounds to e4m3 0 -> scale 0, codes 0
    x[1, 16:32] = torch.linspace(-1e-2, 1e-2, 16)  # scale 2^-9 (e4m3 subnormal)
    x[2, :16] = 1e6  # scale saturates at 448, values at 6
    x[2, 16:32] = -1e6
    q, s = quantize_nvfp4(x)
    sf = s.float()
    assert not torch.isnan(sf).any()
    assert sf[0].tolist() == [0.0, 0.0, 0.0]
    assert sf[1, 0].item() == 0.0 and sf[1, 1].item() == 2.0**-9
    assert sf[2, :2].tolist() == [448.0, 448.0]
    d = dequantize_nvfp4(q, s)
    assert torch.isfinite(d).all()
    assert d[0].abs().sum().item() == 0.0 and d[1, :16].abs().sum().item() == 0.0
    assert d[2, :16].tolist() == [2688.0] * 16 and d[2, 16:32].tolist() == [-2688.0] * 16


def test_quantize_off_grid_picks_nearest_scale_and_value():
    g = gen(11)
    rows, k = 8, 256
    mag = 10.0 ** torch.empty(rows, 1).uniform_(-2, 2, generator=g)
    x = torch.randn(rows, k, generator=g) * mag
    q, s = quantize_nvfp4(x)
    d = dequantize_nvfp4(q, s)
    assert not torch.isnan(d).any()
    blocks = x.double().view(rows, k // SF_VEC, SF_VEC)
    vals = fp4_to_float(q).double().view(rows, k // SF_VEC, SF_VEC)
    sf = s.double()
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    e4m3_grid = torch.tensor(E4M3_POSITIVE, dtype=torch.float64)
    for r in range(rows):
        for b in range(k // SF_VEC):
            target = blocks[r, b].abs().max().item() / 6
            best = (e4m3_grid - target).abs().min().item()
            assert abs(sf[r, b].item() - target) <= best + 1e-12 * target
            v = blocks[r, b] / sf[r, b]
            dist_chosen = (v - vals[r, b]).abs()
            dist_best = (v[:, None] - grid[None, :]).abs().min(dim=1).values
            assert torch.all(dist_chosen <= dist_best + 1e-9), (r, b)
    # error bound: half the widest e2m1 gap (1) times the scale, per element
    err = (x.double() - d.double()).view(rows, k // SF_VEC, SF_VEC).abs()
    assert torch.all(err <= sf[..., None] * 1.0 + 1e-12)
    rel = ((x - d).norm() / x.norm()).item()
    assert 0.0 < rel < 0.15


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="finite"):
        quantize_nvfp4(torch.tensor([[float("nan")] + [0.0] * 15]))
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4(torch.zeros(2, 24))
    with pytest.raises(ValueError, match="global_scale"):
        quantize_nvfp4(torch.zeros(2, 32), global_scale=0.0)


# Global scales that keep every on-grid value exact in the dtype: e2m1 x e4m3 has at most 5
# significant bits with its lowest set bit >= 2^-10 and its top <= 2688, so a power-of-two
# global scale keeps it exact as long as the dtype's range covers it (fp16: 2^-24 .. 65504).
EXACT_GLOBAL_SCALES = {
    torch.float32: (2.0**-40, 2.0**40),
    torch.bfloat16: (2.0**-40, 2.0**40),
    torch.float16: (2.0**-14, 2.0**4),
}


def every_code_operand(rows: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """on_grid_operand with each of the 16 codes present in every row."""
    packed, scales = on_grid_operand(rows, k, seed)
    codes = unpack_fp4(packed)
    codes[:, 16:32] = torch.tensor([7, *range(1, 7), 0, 8, *range(9, 16)], dtype=torch.uint8)
    scales = scales.view(torch.uint8).clone()
    scales[:, 1] = torch.randint(1, 0x7F, (rows,), generator=gen(seed + 1), dtype=torch.uint8)
    return pack_fp4(codes), scales.view(E4M3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("which", [0, 1])
def test_round_trip_every_code_with_global_scale_and_blocked_scales(dtype, which):
    """bf16/fp16/fp32 values on the e2m1 grid times e4m3 block scales times a global scale come
    back exactly: same codes, same scale bytes, and the blocked layout (kernels' input) maps
    back to the same plain scales."""
    gs = EXACT_GLOBAL_SCALES[dtype][which]
    rows, k = 40, 256
    packed, scales = every_code_operand(rows, k, seed=13)
    x = dequantize_nvfp4(packed, scales, gs)
    x_in = x.to(dtype)
    assert torch.equal(x_in.to(torch.float32), x), "the test data itself must be exact"
    q, s = quantize_nvfp4(x_in, global_scale=gs)
    assert torch.equal(s.view(torch.uint8), scales.view(torch.uint8))
    assert torch.equal(canonical(unpack_fp4(q)), canonical(unpack_fp4(packed)))
    blocked = to_blocked(s)
    assert blocked.numel() == blocked_scale_numel(rows, k)
    assert torch.equal(dequantize_nvfp4(q, from_blocked(blocked, rows, k), gs), x)
    # the grouped helper with explicit-scale-free quantization agrees with the plain path
    qg = quantize_grouped([x_in / gs], [x_in[:8] / gs])
    assert torch.equal(qg.a[0], q) and torch.equal(qg.sfa[0], blocked)
    assert qg.alpha.tolist() == [1.0] and qg.global_a == [1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("max_block_scale", [448.0, 1.0, 6.5])
def test_global_scale_for_puts_the_largest_block_scale_on_target(dtype, max_block_scale):
    x = (torch.randn(16, 256, generator=gen(4)) * 3).to(dtype)
    gs = global_scale_for(x, max_block_scale)
    assert float(torch.tensor(gs, dtype=torch.float32)) == gs  # an fp32 value: the kernels' alpha
    _, s = quantize_nvfp4(x, global_scale=gs)
    target = float(torch.tensor(max_block_scale).to(E4M3).float())  # 6.5 is no e4m3 value
    assert s.float().max().item() == target
    assert global_scale_for(torch.zeros(4, 32, dtype=dtype)) == 1.0
    with pytest.raises(ValueError, match="max_block_scale must be in"):
        global_scale_for(x, 500.0)
    with pytest.raises(ValueError, match="finite"):
        global_scale_for(torch.tensor([float("inf")]))


@pytest.mark.parametrize("dtype,big,small", [(torch.float32, 1e8, 1e-9),
                                             (torch.bfloat16, 1e8, 1e-9),
                                             (torch.float16, 5e3, 1e-4)])
def test_global_scale_extends_the_range_beyond_e4m3(dtype, big, small):
    """Without a global scale, block scales saturate at 448 (amax > 2688) or flush to 0
    (amax < 6 * 2^-10); with one, the usual NVFP4 error is back (< 15% relative)."""
    for mag in (big, small):
        x = (torch.randn(8, 256, generator=gen(5)) * mag).to(dtype)
        d0 = dequantize_nvfp4(*quantize_nvfp4(x))
        gs = global_scale_for(x)
        d1 = dequantize_nvfp4(*quantize_nvfp4(x, global_scale=gs), global_scale=gs)
        e0, e1 = (((x.double() - d.double()).norm() / x.double().norm()).item()
                  for d in (d0, d1))
        assert e0 > 0.5, (mag, e0)
        assert e1 < 0.15, (mag, e1)


def test_global_scale_for_an_amax_past_fp32_is_named():
    x = torch.full((1, 16), 1e300, dtype=torch.float64)
    with pytest.raises(InputError) as info:  # was inf, refused later as "global_scale ... inf"
        global_scale_for(x)
    assert str(info.value) == "x's amax 1e+300 is too large for an fp32 global scale"
    with pytest.raises(InputError) as info:
        quantize_nvfp4([[1.0] * 16])
    assert str(info.value) == "x must be a torch.Tensor, but got list"


def test_quantize_grouped_alpha_and_reference():
    g = gen(6)
    shapes = [(40, 128, 256), (8, 256, 512)]
    xs = [(torch.randn(m, k, generator=g) * 100).to(torch.bfloat16) for m, _, k in shapes]
    ws = [(torch.randn(n, k, generator=g) * 1e-3).half() for _, n, k in shapes]
    q = quantize_grouped(xs, ws, global_scale=True)
    assert q.shapes == shapes and q.alpha.dtype == torch.float32 and q.alpha.shape == (2,)
    for i in range(2):
        assert q.global_a[i] == global_scale_for(xs[i])
        assert q.global_b[i] == global_scale_for(ws[i])
        assert q.alpha[i].item() == float(torch.tensor(q.global_a[i] * q.global_b[i],
                                                       dtype=torch.float32))
        assert q.sfa[i].dtype == E4M3 and q.sfa[i].dim() == 1
    ref = q.reference()
    for i, (m, n, k) in enumerate(shapes):
        a = dequantize_nvfp4(q.a[i], from_blocked(q.sfa[i], m, k)).double() * q.global_a[i]
        b = dequantize_nvfp4(q.b[i], from_blocked(q.sfb[i], n, k)).double() * q.global_b[i]
        assert torch.allclose(ref[i], a @ b.T, rtol=1e-6, atol=0)  # alpha's fp32 rounding
        true = xs[i].double() @ ws[i].double().T
        assert ((ref[i] - true).norm() / true.norm()).item() < 0.2
    with pytest.raises(ValueError, match="same number of groups"):
        quantize_grouped(xs, ws[:1])
    with pytest.raises(ValueError, match="same K"):
        quantize_grouped(xs[:1], ws[1:])


def test_quantize_grouped_returns_the_kernels_alpha():
    """alpha is what the kernels take: float32 (G,) on the data's device, exactly the fp32 product
    of the two decode scales (the double product of two fp32 values is exact, rounded once)."""
    g = gen(16)
    shapes = [(16, 128, 256), (24, 256, 128), (8, 128, 512)]
    xs = [torch.randn(m, k, generator=g) * 10.0 ** (i - 1) for i, (m, _, k) in enumerate(shapes)]
    ws = [(torch.randn(n, k, generator=g) * 0.03).to(torch.bfloat16) for _, n, k in shapes]
    q = quantize_grouped(xs, ws, global_scale=True)
    assert isinstance(q.alpha, torch.Tensor)
    assert q.alpha.dtype == torch.float32 and q.alpha.shape == (3,)
    assert q.alpha.device == xs[0].device
    rounded = 0
    for i in range(3):
        ga, gb = q.global_a[i], q.global_b[i]
        assert float(torch.tensor(ga, dtype=torch.float32)) == ga  # fp32 values
        assert ga == float(torch.tensor(xs[i].abs().max().item() / 2688, dtype=torch.float32))
        want = float(torch.tensor(ga * gb, dtype=torch.float64).to(torch.float32))
        assert q.alpha[i].item() == want
        rounded += want != ga * gb
    assert rounded  # the fp32 rounding of the product was exercised
    # alpha times the unscaled block-scaled product is the real product (NVFP4 error)
    unscaled = reference_grouped_gemm(q.a, q.b, q.sfa, q.sfb, q.shapes)
    for i in range(3):
        true = xs[i].double() @ ws[i].double().T
        assert ((unscaled[i] * q.alpha[i].item() - true).norm() / true.norm()).item() < 0.15
    # without global scales: ones; zero groups: an empty float32 alpha
    q1 = quantize_grouped(xs, ws)
    assert q1.alpha.dtype == torch.float32 and q1.alpha.tolist() == [1.0, 1.0, 1.0]
    q0 = quantize_grouped([], [], global_scale=True)
    assert q0.alpha.dtype == torch.float32 and q0.alpha.shape == (0,)


def test_reference_alpha_tensor_and_out_dtype():
    p = make_grouped_problem([(8, 16, 64), (3, 8, 128)], seed=12)
    ref = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes)
    alpha = torch.tensor([0.1, 3.7], dtype=torch.float32)
    scaled = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes, alpha=alpha)
    for g in range(2):
        assert scaled[g].dtype == torch.float64
        assert torch.equal(scaled[g], ref[g] * alpha[g].item())  # the fp32 value, in float64
    for dt in (torch.float16, torch.bfloat16):
        got = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes, alpha=alpha, out_dtype=dt)
        for g in range(2):
            assert got[g].dtype == dt and torch.equal(got[g], scaled[g].to(dt))
        plain = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes, out_dtype=dt)
        assert all(torch.equal(x, r.to(dt)) for x, r in zip(plain, ref))
    # alpha is applied BEFORE the rounding: a product beyond fp16 comes back finite
    big = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes, alpha=[1e5, 1e5])
    assert any(bool(torch.isinf(t.half()).any()) for t in big)
    small = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes, alpha=[1e-5, 1e-5],
                                   out_dtype=torch.float16)
    assert torch.equal(small[0], (ref[0] * 1e-5).half())
    q = quantize_grouped([torch.randn(8, 64, generator=gen(1)) * 1e3],
                         [torch.randn(16, 64, generator=gen(2)) * 1e3], global_scale=True)
    assert torch.equal(q.reference(torch.bfloat16)[0], q.reference()[0].to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"^out_dtype must be torch.float16, torch.bfloat16 or "
                       r"None \(float64\), but got torch.float32$"):
        reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes, out_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"^alpha must be 1-D \(G,\), but got shape \(1, 2\)$"):
        reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes, alpha=alpha[None])
    with pytest.raises(ValueError, match=r"^alpha must have 2 entries, but got 3$"):
        reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes, alpha=torch.ones(3))


def test_apply_alpha():
    outs = [torch.tensor([[1.0, -2.0]], dtype=torch.float16), torch.ones(2, 3, dtype=torch.float16)]
    got = apply_alpha(outs, torch.tensor([0.5, 3.0]))
    assert got[0].dtype == torch.float16 and got[0].tolist() == [[0.5, -1.0]]
    assert got[1].tolist() == [[3.0] * 3] * 2
    assert apply_alpha(outs, [1.0, 1.0])[1].tolist() == outs[1].tolist()
    with pytest.raises(ValueError, match="alpha must have 2 entries"):
        apply_alpha(outs, [1.0])


# ------------------------------------------------------------------------------------------
# Random inputs and grouped problems
# ------------------------------------------------------------------------------------------


def test_random_nvfp4_full():
    a, s = random_nvfp4(64, 512, generator=gen(1))
    assert a.dtype == torch.uint8 and a.shape == (64, 256)
    assert s.dtype == E4M3 and s.shape == (64, 32)
    assert set(unpack_fp4(a).unique().tolist()) == set(range(16))
    assert set(s.float().unique().tolist()) == {2.0**e for e in range(-6, 7)}
    a2, s2 = random_nvfp4(64, 512, generator=gen(1))
    assert torch.equal(a, a2) and torch.equal(s.view(torch.uint8), s2.view(torch.uint8))
    a3, _ = random_nvfp4(64, 512, generator=gen(2))
    assert not torch.equal(a, a3)
    _, s4 = random_nvfp4(8, 512, generator=gen(1), scale_exp=(-2, -1))
    assert set(s4.float().unique().tolist()) == {0.25, 0.5}
    with pytest.raises(ValueError, match="scale_exp"):
        random_nvfp4(8, 64, generator=gen(1), scale_exp=(-6, 9))


def test_random_nvfp4_benchmark():
    a, s = random_nvfp4(64, 512, generator=gen(1), values="benchmark")
    vals = set(fp4_to_float(a).unique().tolist())
    assert vals == {0.0, 0.5, 1.0, 1.5, -0.5, -1.0, -1.5}
    assert set(s.float().unique().tolist()) == {1.0, 2.0}
    with pytest.raises(ValueError, match="values"):
        random_nvfp4(8, 64, generator=gen(1), values="nope")


def test_make_grouped_problem():
    groups = [(40, 128, 256), (1, 256, 64), (129, 128, 768)]
    p = make_grouped_problem(groups, seed=4)
    assert p.shapes == groups
    for g, (m, n, k) in enumerate(groups):
        assert p.a[g].dtype == torch.uint8 and p.a[g].shape == (m, k // 2)
        assert p.b[g].dtype == torch.uint8 and p.b[g].shape == (n, k // 2)
        assert p.sfa[g].dtype == E4M3 and p.sfa[g].shape == (blocked_scale_numel(m, k),)
        assert p.sfb[g].dtype == E4M3 and p.sfb[g].shape == (blocked_scale_numel(n, k),)
        assert p.sfa_plain[g].shape == (m, k // 16) and p.sfb_plain[g].shape == (n, k // 16)
        assert torch.equal(p.sfa[g].view(torch.uint8), to_blocked(p.sfa_plain[g]).view(torch.uint8))
        assert torch.equal(p.sfb[g].view(torch.uint8), to_blocked(p.sfb_plain[g]).view(torch.uint8))
    q = make_grouped_problem(groups, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(p.a + p.b, q.a + q.b))
    r = make_grouped_problem(groups, seed=5)
    assert not torch.equal(p.a[0], r.a[0])


# ------------------------------------------------------------------------------------------
# Reference
# ------------------------------------------------------------------------------------------


def naive_reference(a_u8, b_u8, sfa_blocked_u8, sfb_blocked_u8, m, n, k) -> list[list[float]]:
    """Triple loop over bytes with the bit decoders and the explicit offset formula."""
    a, b = a_u8.tolist(), b_u8.tolist()
    sfa, sfb = sfa_blocked_u8.tolist(), sfb_blocked_u8.tolist()

    def elem(rows, sf, r, kk):
        byte = rows[r][kk // 2]
        code = byte & 0xF if kk % 2 == 0 else byte >> 4
        return e2m1_from_bits(code) * e4m3_from_bits(sf[blocked_scale_offset(r, kk // 16, k)])

    c = [[0.0] * n for _ in range(m)]
    for i in range(m):
        for j in range(n):
            acc = 0.0
            for kk in range(k):
                acc += elem(a, sfa, i, kk) * elem(b, sfb, j, kk)
            c[i][j] = acc
    return c


def test_reference_equals_naive_triple_loop():
    groups = [(3, 5, 32), (1, 2, 64), (4, 3, 48), (2, 2, 128)]
    p = make_grouped_problem(groups, seed=9)
    ref = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes)
    assert len(ref) == len(groups)
    for g, (m, n, k) in enumerate(groups):
        assert ref[g].dtype == torch.float64 and ref[g].shape == (m, n)
        naive = naive_reference(p.a[g], p.b[g], p.sfa[g].view(torch.uint8),
                                p.sfb[g].view(torch.uint8), m, n, k)  # fmt: skip
        assert ref[g].tolist() == naive, g
        assert any(v != 0.0 for row in naive for v in row)


def test_reference_accepts_semantic_dtypes_and_alpha():
    p = make_grouped_problem([(8, 16, 64), (3, 8, 128)], seed=2)
    ref = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes)
    if FP4 is not None:
        a4 = [t.view(FP4) for t in p.a]
        b4 = [t.view(FP4) for t in p.b]
        ref4 = reference_grouped_gemm(a4, b4, p.sfa, p.sfb, p.shapes)
        assert all(torch.equal(x, y) for x, y in zip(ref, ref4))
    su8 = [t.view(torch.uint8) for t in p.sfa]
    ref_u8 = reference_grouped_gemm(p.a, p.b, su8, p.sfb, p.shapes)
    assert all(torch.equal(x, y) for x, y in zip(ref, ref_u8))
    scaled = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes, alpha=[0.5, 4.0])
    assert torch.equal(scaled[0], ref[0] * 0.5) and torch.equal(scaled[1], ref[1] * 4.0)
    # the reference reads the blocked scales, not the plain ones: dequantize agrees
    a0 = dequantize_nvfp4(p.a[0], p.sfa_plain[0]).double()
    b0 = dequantize_nvfp4(p.b[0], p.sfb_plain[0]).double()
    assert torch.equal(ref[0], a0 @ b0.T)


def test_reference_rejects_inconsistent_inputs():
    p = make_grouped_problem([(8, 16, 64)], seed=2)
    with pytest.raises(ValueError, match="same number of groups"):
        reference_grouped_gemm(p.a, p.b, p.sfa, [], p.shapes)
    with pytest.raises(ValueError, match="shape"):
        reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, [(8, 16, 128)])
    with pytest.raises(ValueError, match="elements"):
        reference_grouped_gemm(p.a, p.b, [p.sfa[0][:100]], p.sfb, p.shapes)


def test_exactness_claim_benchmark_values():
    """facts.md: with benchmark inputs every partial sum is a multiple of 0.25 below 2^16, so an
    fp32 accumulation in ANY order equals the float64 reference exactly and a correct kernel's fp16
    output is exactly fp16(reference)."""
    groups = [(40, 256, 7168), (16, 128, 2048)]
    p = make_grouped_problem(groups, seed=21, values="benchmark")
    ref = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, p.shapes)
    for g, (m, n, k) in enumerate(groups):
        r = ref[g]
        assert torch.equal(r * 4, torch.round(r * 4))  # multiples of 0.25
        assert r.abs().max().item() < 2**16
        a32 = dequantize_nvfp4(p.a[g], p.sfa_plain[g])
        b32 = dequantize_nvfp4(p.b[g], p.sfb_plain[g])
        assert torch.equal((a32 @ b32.T).double(), r)  # fp32 matmul: exact
        # a different summation order (reversed K, chunked) is exact too
        c = torch.zeros(m, n)
        for kk in range(k - 256, -1, -256):
            c += a32[:, kk : kk + 256] @ b32[:, kk : kk + 256].T
        assert torch.equal(c.double(), r)
        ok, report = check_close(r.half(), r)
        assert ok, report
    # fp16 holds the float64 result itself when |C| <= 512 (11 significant bits at 0.25 steps):
    # guaranteed for K <= 56 since |product| <= 9
    small = make_grouped_problem([(64, 128, 48)], seed=3, values="benchmark")
    r = small.reference()[0]
    assert r.abs().max().item() <= 512
    assert torch.equal(r.half().double(), r)


# ------------------------------------------------------------------------------------------
# check_close
# ------------------------------------------------------------------------------------------


def test_check_close_passes_equal_and_within_tolerance():
    ref = torch.randn(16, 32, generator=gen(0), dtype=torch.float64)
    ok, report = check_close(ref.clone(), ref)
    assert ok and "mismatched 0/512" in report and "NaN 0" in report
    ok, _ = check_close((ref * (1 + 5e-4)).half(), ref)
    assert ok


def test_check_close_detects_nan():
    ref = torch.randn(16, 32, generator=gen(0), dtype=torch.float64)
    out = ref.half()
    out[5, 9] = float("nan")
    ok, report = check_close(out, ref)
    assert not ok
    assert "NaN 1" in report and "mismatched 1/512" in report
    assert "first bad index (5, 9)" in report


def test_check_close_detects_single_flipped_element():
    ref = torch.randn(16, 32, generator=gen(0), dtype=torch.float64) + 3.0
    out = ref.half()
    bits = out.view(torch.int16)
    bits[3, 7] ^= 0x0200  # flip one high mantissa bit: ~25% relative change
    ok, report = check_close(out, ref)
    assert not ok, report
    assert "mismatched 1/512" in report and "first bad index (3, 7)" in report
    out = ref.half()
    out[12, 30] = -out[12, 30]  # sign flip
    ok, report = check_close(out, ref)
    assert not ok and "first bad index (12, 30)" in report and "NaN 0" in report


def test_check_close_shapes_and_lists():
    ref = torch.zeros(4, 4, dtype=torch.float64)
    ok, report = check_close(torch.zeros(4, 5), ref)
    assert not ok and "shape" in report
    bad = torch.zeros(4, 4)
    bad[2, 1] = 1.0
    ok, report = check_close([torch.zeros(4, 4), bad], [ref, ref])
    assert not ok and "group 0: OK" in report and "group 1: FAIL" in report
    ok, _ = check_close([torch.zeros(4, 4)], [ref])
    assert ok


def test_module_imports_only_torch_and_stdlib():
    with open(nvfp4.__file__) as f:
        tree = ast.parse(f.read())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    allowed = {"__future__", "torch", *sys.stdlib_module_names}
    assert roots <= allowed, roots - allowed
