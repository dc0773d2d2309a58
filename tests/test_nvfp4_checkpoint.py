"""CPU tests of the ModelOpt checkpoint helpers of runtime/nvfp4.py (issue 24: alpha).

ModelOpt stores per expert: weight uint8 (N, K // 2), weight_scale e4m3 (N, K // 16) plain,
weight_scale_2 fp32 = amax_w / (6 * 448) and input_scale fp32 = amax_x / (6 * 448), both DECODE
scales; the kernels' alpha is input_scale * weight_scale_2 and activations are quantized as
x / input_scale. Expected values are computed independently of the helpers under test: the
blocked layout from the offset formula, fp32 products from Python's exact double product
rounded once, the real product in float64 from the unquantized data.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from runtime.errors import InputError
from runtime.nvfp4 import (
    SF_VEC,
    ModelOptExperts,
    blocked_scale_numel,
    blocked_scale_offset,
    dequantize_nvfp4,
    from_blocked,
    from_modelopt,
    from_modelopt_experts,
    global_scale_for,
    pack_fp4,
    quantize_activation,
    quantize_nvfp4,
    reference_grouped_gemm,
    unpack_fp4,
)

E4M3 = torch.float8_e4m3fn
FP4 = getattr(torch, "float4_e2m1fn_x2", None)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def f32(v: float) -> float:
    """v rounded once to fp32 (Python floats are doubles; the product of two fp32 values is
    exact in a double, so f32(x * y) is the correctly rounded fp32 product)."""
    return float(torch.tensor(v, dtype=torch.float64).to(torch.float32))


def exact(msg: str):
    """pytest.raises for an InputError whose message is exactly `msg`."""
    return pytest.raises(InputError, match=f"^{re.escape(msg)}$")


def checkpoint(n: int, k: int, seed: int, scale: float = 0.02):
    """A ModelOpt-style checkpoint of a Gaussian weight (N, K): the standard recipe, weight_scale_2
    = amax / (6 * 448) in fp32, block scales e4m3(amax_block / (6 * weight_scale_2))."""
    w = torch.randn(n, k, generator=gen(seed)) * scale
    ws2 = global_scale_for(w)
    packed, sf = quantize_nvfp4(w, global_scale=ws2)
    return w, packed, sf, torch.tensor(ws2, dtype=torch.float32)


def expected_blocked_bytes(plain_u8: torch.Tensor, k: int) -> list[int]:
    rows, cols = plain_u8.shape
    out = [0] * blocked_scale_numel(rows, k)
    vals = plain_u8.tolist()
    for i in range(rows):
        for j in range(cols):
            out[blocked_scale_offset(i, j, k)] = vals[i][j]
    return out


# ------------------------------------------------------------------------------------------
# from_modelopt: round trip
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k", [(130, 96), (128, 256), (8, 16)])
def test_from_modelopt_round_trip(n, k):
    _, weight, weight_scale, ws2 = checkpoint(n, k, seed=n + k)
    input_scale = torch.tensor(0.0123456789, dtype=torch.float32)  # 0-d, as stored
    ex = from_modelopt(weight, weight_scale, ws2, input_scale)
    assert isinstance(ex, ModelOptExperts) and ex.shapes == [(n, k)]
    # b: the checkpoint's bytes, not a copy
    assert len(ex.b) == 1 and ex.b[0].dtype == torch.uint8 and ex.b[0].shape == (n, k // 2)
    assert ex.b[0].data_ptr() == weight.data_ptr() and torch.equal(ex.b[0], weight)
    # sfb: the blocked layout of weight_scale (offset formula of facts.md), and back
    assert len(ex.sfb) == 1 and ex.sfb[0].dtype == E4M3 and ex.sfb[0].dim() == 1
    assert ex.sfb[0].view(torch.uint8).tolist() == expected_blocked_bytes(
        weight_scale.view(torch.uint8), k)
    assert torch.equal(from_blocked(ex.sfb[0], n, k).view(torch.uint8),
                       weight_scale.view(torch.uint8))
    # alpha: exactly the fp32 product of the two decode scales
    for t in (ex.alpha, ex.input_scale, ex.weight_scale_2):
        assert t.dtype == torch.float32 and t.shape == (1,) and t.device == weight.device
    want = f32(input_scale.item() * ws2.item())
    assert ex.alpha.item() == want
    assert want != input_scale.item() * ws2.item()  # the fp32 rounding was really exercised
    assert ex.input_scale.item() == input_scale.item()
    assert ex.weight_scale_2.item() == ws2.item()


def test_from_modelopt_accepts_fp4_dtype_python_floats_and_one_element_tensors():
    _, weight, weight_scale, ws2 = checkpoint(128, 64, seed=1)
    ref = from_modelopt(weight, weight_scale, ws2, 0.5)
    got = from_modelopt(weight, weight_scale, ws2.reshape(1), torch.tensor([0.5]))
    assert got.alpha.item() == ref.alpha.item() == f32(ws2.item() * 0.5)
    if FP4 is not None:
        f4 = from_modelopt(weight.view(FP4), weight_scale, ws2.item(), 0.5)
        assert f4.b[0].dtype == torch.uint8 and f4.b[0].data_ptr() == weight.data_ptr()
        assert f4.alpha.item() == ref.alpha.item()


def test_from_modelopt_experts_stacked_and_lists_agree():
    e, n, k = 3, 128, 128
    parts = [checkpoint(n, k, seed=10 + i, scale=10.0 ** (i - 2)) for i in range(e)]
    weight = torch.stack([p[1] for p in parts])
    weight_scale = torch.stack([p[2] for p in parts])
    ws2 = torch.stack([p[3] for p in parts])
    ins = torch.tensor([0.25, 1.0e-3, 7.7], dtype=torch.float32)
    stacked = from_modelopt_experts(weight, weight_scale, ws2, ins)
    listed = from_modelopt_experts([p[1] for p in parts], [p[2] for p in parts],
                                   [p[3] for p in parts], [0.25, torch.tensor(1.0e-3), ins[2]])
    for ex in (stacked, listed):
        assert ex.shapes == [(n, k)] * e
        assert ex.alpha.dtype == torch.float32 and ex.alpha.shape == (e,)
        assert ex.alpha.tolist() == [f32(ins[i].item() * ws2[i].item()) for i in range(e)]
        assert ex.input_scale.tolist() == ins.tolist()
        assert ex.weight_scale_2.tolist() == ws2.tolist()
        for i in range(e):
            assert torch.equal(ex.b[i], parts[i][1])
            assert torch.equal(from_blocked(ex.sfb[i], n, k).view(torch.uint8),
                               parts[i][2].view(torch.uint8))
    for i in range(e):  # the stacked form hands out views of the checkpoint tensor
        assert stacked.b[i].data_ptr() == weight[i].data_ptr()


# ------------------------------------------------------------------------------------------
# The standard recipe on Gaussian data
# ------------------------------------------------------------------------------------------


def test_standard_recipe_on_gaussian_data_gives_the_real_product():
    """Per-operand NVFP4 error on Gaussian data, derived: a block of 16 N(0, s) values has
    amax ~ 2 s, so the scale maps s to ~3 e2m1 units; the rounding error variance is the sum over
    the grid's gaps (0.5 below 2, 1 below 4, 2 below 6) of P(gap) * gap^2 / 12 = 0.495 / 48 +
    0.322 / 12 + 0.183 / 3 ~= 0.098, i.e. a relative RMS error ~ sqrt(0.098) / 3 ~= 0.10 (0.096
    measured). The errors of A and W are independent of each other and of the data, so the
    product's relative Frobenius error is ~ sqrt(e_a^2 + e_w^2) ~= 0.14: bound 0.15, with each
    operand < 0.11 and the product within 10% of the combination. A missing or inverted alpha or
    input_scale is off by orders of magnitude."""
    groups = [(64, 256, 1024, 0.02, 3.0), (40, 128, 512, 5.0, 1e-3), (8, 384, 256, 1e-4, 40.0)]
    weights, scales, ws2s, inputs, xs, amax_x = [], [], [], [], [], []
    for i, (m, n, k, w_std, x_std) in enumerate(groups):
        w, packed, sf, ws2 = checkpoint(n, k, seed=30 + i, scale=w_std)
        assert ws2.item() == f32(w.abs().max().item() / (6 * 448))  # the recipe's definition
        x = (torch.randn(m, k, generator=gen(40 + i)) * x_std).to(torch.bfloat16)
        weights.append(packed)
        scales.append(sf)
        ws2s.append(ws2)
        xs.append(x)
        amax_x.append(x.float().abs().max().item())
        inputs.append(f32(amax_x[-1] / (6 * 448)))  # calibrated on these very activations
    ex = from_modelopt_experts(weights, scales, torch.stack(ws2s), torch.tensor(inputs))
    a, sfa = ex.quantize_inputs(xs)
    ref = ex.reference(a, sfa)
    unscaled = reference_grouped_gemm(a, ex.b, sfa, ex.sfb,
                                      [(m, n, k) for m, n, k, _, _ in groups])
    for i, (m, n, k, _, _) in enumerate(groups):
        x64 = xs[i].double()
        x_deq = dequantize_nvfp4(a[i], from_blocked(sfa[i], m, k)).double() * inputs[i]
        w_real = checkpoint(n, k, seed=30 + i, scale=groups[i][3])[0].double()
        w_deq = dequantize_nvfp4(weights[i], scales[i]).double() * ws2s[i].item()
        e_a = ((x_deq - x64).norm() / x64.norm()).item()
        e_w = ((w_deq - w_real).norm() / w_real.norm()).item()
        assert 0.0 < e_a < 0.11 and 0.0 < e_w < 0.11, (i, e_a, e_w)
        true = x64 @ w_real.T
        err = ((ref[i] - true).norm() / true.norm()).item()
        assert err < 0.15, (i, err)
        assert abs(err / math.hypot(e_a, e_w) - 1) < 0.1, (i, err, e_a, e_w)
        # the largest block scale of the activations sits on 448 (calibrated range)
        assert from_blocked(sfa[i], m, k).float().max().item() == 448.0
        # alpha is what makes the unscaled block-scaled product real
        assert torch.allclose(unscaled[i] * ex.alpha[i].item(), ref[i], rtol=1e-12, atol=0)
    # with the recipe's scales, the unscaled accumulators overflow fp16; alpha applied to the
    # float64 (fp32 in the kernels) accumulator before the cast keeps them finite
    assert torch.isinf(unscaled[0].half()).float().mean().item() > 0.9
    for t in ex.reference(a, sfa, out_dtype=torch.float16):
        assert t.dtype == torch.float16 and bool(torch.isfinite(t).all())
    assert all(torch.equal(h, r.half()) for h, r in
               zip(ex.reference(a, sfa, out_dtype=torch.float16), ref))


# ------------------------------------------------------------------------------------------
# quantize_activation
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_quantize_activation_recovers_on_grid_data_exactly(dtype):
    """x = input_scale * e2m1 * e4m3 with a 6 in every block: the codes and the scales come back
    and x == input_scale * dequant(a, sfa) exactly (power-of-two input_scale keeps x exact)."""
    m, k = 40, 128
    g = gen(5)
    codes = torch.randint(0, 16, (m, k), generator=g, dtype=torch.uint8)
    codes.view(m, k // SF_VEC, SF_VEC)[..., 3] = 7  # +6 in every block: the scale is amax / 6
    exps = torch.randint(-3, 4, (m, k // SF_VEC), generator=g)
    sf = torch.pow(2.0, exps.float()).to(E4M3)
    input_scale = 2.0**-7
    x = (dequantize_nvfp4(pack_fp4(codes), sf) * input_scale).to(dtype)
    assert torch.equal(x.float(), dequantize_nvfp4(pack_fp4(codes), sf) * input_scale)
    a, sfa = quantize_activation(x, torch.tensor(input_scale))
    assert a.dtype == torch.uint8 and a.shape == (m, k // 2)
    assert sfa.dtype == E4M3 and sfa.shape == (blocked_scale_numel(m, k),)
    plain = from_blocked(sfa, m, k)
    assert torch.equal(plain.view(torch.uint8), sf.view(torch.uint8))
    same = (unpack_fp4(a) == codes) | ((unpack_fp4(a) & 7) + (codes & 7) == 0)  # +0 == -0
    assert bool(same.all())
    assert torch.equal(dequantize_nvfp4(a, plain) * input_scale, x.float())


def test_quantize_activation_saturates_beyond_the_calibrated_range_and_takes_empty_m():
    x = torch.full((4, 32), 3.0)
    x[1, :16] = 1e4  # far beyond amax = 6 * 448 * input_scale
    a, sfa = quantize_activation(x, 3.0 / 2688)
    plain = from_blocked(sfa, 4, 32).float()
    assert plain[1, 0].item() == 448.0 and plain[0, 0].item() == 448.0
    d = dequantize_nvfp4(a, from_blocked(sfa, 4, 32))
    assert d[1, :16].tolist() == [2688.0] * 16  # clipped to the top of the grid
    a0, sfa0 = quantize_activation(torch.zeros(0, 64, dtype=torch.bfloat16), 0.5)
    assert a0.shape == (0, 32) and sfa0.numel() == 0


# ------------------------------------------------------------------------------------------
# Errors, with their exact messages
# ------------------------------------------------------------------------------------------


def good(n: int = 128, k: int = 128):
    return (torch.zeros(n, k // 2, dtype=torch.uint8), torch.ones(n, k // 16).to(E4M3),
            torch.tensor(0.01), torch.tensor(0.02))


def test_from_modelopt_errors():
    w, s, ws2, ins = good()
    with exact("weight must be a torch.Tensor, but got list"):
        from_modelopt([w], s, ws2, ins)
    with exact("weight must be uint8 or torch.float4_e2m1fn_x2 (packed e2m1 pairs), "
               "but got torch.float32"):
        from_modelopt(w.float(), s, ws2, ins)
    with exact("weight must be uint8 or torch.float4_e2m1fn_x2 (packed e2m1 pairs), "
               "but got torch.float8_e4m3fn"):
        from_modelopt(w.view(E4M3), s, ws2, ins)
    with exact("weight must be 2-D (N, K // 2), but got shape (2, 128, 64)"):
        from_modelopt(torch.stack([w, w]), s, ws2, ins)
    with exact("K (= 2 * weight.shape[-1]) must be a positive multiple of 16, but got 24"):
        from_modelopt(w[:, :12], s, ws2, ins)
    with exact("K (= 2 * weight.shape[-1]) must be a positive multiple of 16, but got 0"):
        from_modelopt(w[:, :0], s, ws2, ins)
    with exact("weight_scale must be a torch.Tensor, but got float"):
        from_modelopt(w, 1.0, ws2, ins)
    with exact("weight_scale must be torch.float8_e4m3fn, but got torch.float32"):
        from_modelopt(w, s.float(), ws2, ins)
    with exact("weight_scale must be torch.float8_e4m3fn, but got torch.uint8"):
        from_modelopt(w, s.view(torch.uint8), ws2, ins)
    with exact("weight_scale must have shape (N, K // 16) = (128, 8) (plain, not blocked), "
               "but got (1024,)"):
        from_modelopt(w, s.reshape(-1), ws2, ins)
    with exact("weight_scale must have shape (N, K // 16) = (128, 8) (plain, not blocked), "
               "but got (8, 128)"):
        from_modelopt(w, s.T, ws2, ins)
    with exact("weight_scale must be on weight's device cpu, but got meta"):
        from_modelopt(w, s.to("meta"), ws2, ins)
    corrupt = s.clone()
    corrupt.view(torch.uint8)[3, 1] = 0x7F  # e4m3fn NaN (0xFF too): NaN outputs, silently
    corrupt.view(torch.uint8)[5, 0] = 0xFF
    with exact("weight_scale must be finite e4m3 block scales, but weight_scale[3, 1] is NaN "
               "(2 NaN scales in all)"):
        from_modelopt(w, corrupt, ws2, ins)
    with exact("weight_scale_2 must be a scalar (one element), but got shape (2,)"):
        from_modelopt(w, s, torch.tensor([0.01, 0.01]), ins)
    with exact("input_scale must be a scalar (one element), but got shape (1, 2)"):
        from_modelopt(w, s, ws2, torch.tensor([[0.01, 0.01]]))
    with exact("input_scale must be float32, but got torch.bfloat16"):
        from_modelopt(w, s, ws2, ins.bfloat16())
    with exact("weight_scale_2 must be float32, but got torch.float64"):
        from_modelopt(w, s, ws2.double(), ins)
    with exact("input_scale must be a float32 tensor or a Python float, but got str"):
        from_modelopt(w, s, ws2, "0.1")
    with exact("input_scale must be a float32 tensor or a Python float, but got bool"):
        from_modelopt(w, s, ws2, True)
    with exact("input_scale must be positive and finite, but got 0.0"):
        from_modelopt(w, s, ws2, 0.0)
    with exact("weight_scale_2 must be positive and finite, but got -1.0"):
        from_modelopt(w, s, torch.tensor(-1.0), ins)
    with exact("weight_scale_2 must be positive and finite, but got nan"):
        from_modelopt(w, s, torch.tensor(float("nan")), ins)
    with exact("input_scale must be positive and finite, but got inf"):
        from_modelopt(w, s, ws2, math.inf)


def test_from_modelopt_experts_errors():
    w, s, _, _ = good()
    ws, ss = torch.stack([w] * 3), torch.stack([s] * 3)
    v3 = torch.full((3,), 0.01)
    with exact("weight must be 3-D (E, N, K // 2) or a sequence of 2-D tensors, "
               "but got shape (128, 64)"):
        from_modelopt_experts(w, ss, v3, v3)
    with exact("weight_scale must be 3-D (E, N, K // 16) or a sequence of 2-D tensors, "
               "but got shape (128, 8)"):
        from_modelopt_experts(ws, s, v3, v3)
    with exact("weight must be a torch.Tensor or a sequence of tensors, but got int"):
        from_modelopt_experts(3, ss, v3, v3)
    with exact("weight must hold at least one expert, but got 0"):
        from_modelopt_experts([], [], [], [])
    with exact("weight_scale must have 3 experts (one per weight), but got 2"):
        from_modelopt_experts(ws, ss[:2], v3, v3)
    with exact("weight_scale[1] must be torch.float8_e4m3fn, but got torch.float32"):
        from_modelopt_experts([w, w], [s, s.float()], [0.1, 0.1], [0.1, 0.1])
    with exact("K (= 2 * weight[0].shape[-1]) must be a positive multiple of 16, but got 120"):
        from_modelopt_experts([w[:, :60]], [s], [0.1], [0.1])
    with exact("weight[1] must be on weight[0]'s device cpu, but got meta"):
        from_modelopt_experts([w, w.to("meta")], [s, s.to("meta")], [0.1, 0.1], [0.1, 0.1])
    with exact("input_scale must have shape (E,) = (3,), but got (3, 2)"):
        from_modelopt_experts(ws, ss, v3, torch.full((3, 2), 0.01))
    with exact("weight_scale_2 must be float32, but got torch.float16"):
        from_modelopt_experts(ws, ss, v3.half(), v3)
    with exact("input_scale must have 3 entries (one per expert), but got 2"):
        from_modelopt_experts(ws, ss, v3, [0.1, 0.1])
    with exact("input_scale must have shape (3,) or 3 entries (one per expert), "
               "but got a scalar"):
        from_modelopt_experts(ws, ss, v3, 0.1)
    with exact("input_scale[1] must be a scalar (one element), but got shape (2,)"):
        from_modelopt_experts(ws, ss, v3, [0.1, torch.tensor([0.1, 0.1]), 0.1])
    with exact("weight_scale_2[2] must be positive and finite, but got 0.0"):
        from_modelopt_experts(ws, ss, torch.tensor([0.1, 0.1, 0.0]), v3)
    with exact("input_scale[0] must be positive and finite, but got -0.5"):
        from_modelopt_experts(ws, ss, v3, [-0.5, 0.1, 0.1])


def test_quantize_activation_and_expert_method_errors():
    x = torch.randn(8, 64)
    with exact("x must be a torch.Tensor, but got list"):
        quantize_activation([x], 0.1)
    with exact("x must be bfloat16, float16 or float32, but got torch.float64"):
        quantize_activation(x.double(), 0.1)
    with exact("x must be bfloat16, float16 or float32, but got torch.int8"):
        quantize_activation(x.to(torch.int8), 0.1)
    with exact("x must be 2-D (rows, K), but got shape (64,)"):
        quantize_activation(x[0], 0.1)
    with exact("K must be a positive multiple of 16, but got 24"):
        quantize_activation(x[:, :24], 0.1)
    with exact("input_scale must be a scalar (one element), but got shape (2,)"):
        quantize_activation(x, torch.tensor([0.1, 0.2]))
    with exact("input_scale must be positive and finite, but got inf"):
        quantize_activation(x, torch.tensor(math.inf))
    with exact("x must be finite, but it contains NaN or Inf"):
        quantize_activation(torch.full((1, 16), math.nan), 0.1)
    ex = from_modelopt(*good(n=128, k=64))
    with exact("x_list must have 1 entries (one per expert), but got 2"):
        ex.quantize_inputs([x, x])
    a, sfa = ex.quantize_inputs([x])
    with exact("a_list must have 1 entries (one per expert), but got 0"):
        ex.reference([], [])
    with exact("out_dtype must be torch.float16, torch.bfloat16 or None (float64), "
               "but got torch.float32"):
        ex.reference(a, sfa, out_dtype=torch.float32)
