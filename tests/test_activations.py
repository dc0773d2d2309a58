"""runtime.activations on the CPU: the sync-free activation quantizers give, bit for bit, what
quantize_activation / quantize_nvfp4 give on each expert's rows alone, in the layouts of
scaled_grouped_mm and masked_grouped_mm, and read no tensor value on the host."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import runtime.activations as activations
from runtime.activations import quantize_experts, quantize_masked
from runtime.errors import InputError
from runtime.formats import blocked_scale_numel
from runtime.nvfp4 import (
    blocked_scale_offset,
    from_blocked,
    quantize_activation,
    quantize_nvfp4,
    to_blocked,
    to_blocked_grouped,
)
from runtime.serving import sfa_rows_needed

E4M3 = torch.float8_e4m3fn


def routed(counts: list[int], k: int, pad: int, dtype: torch.dtype, seed: int):
    """x (T, K) with rows grouped by expert (counts[g] rows for g, `pad` rows past the last),
    int32 end offsets and per-expert decode scales of very different sizes."""
    gen = torch.Generator().manual_seed(seed)
    t = sum(counts) + pad
    x = (torch.randn(t, k, generator=gen) * 4).to(dtype)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    scales = (2.0 ** torch.randint(-12, -2, (len(counts),), generator=gen)
              * (1 + torch.rand(len(counts), generator=gen))).to(torch.float32)
    return x, offs, scales


def reference_experts(x, offs, scales):
    """quantize_activation on each expert's rows alone, then to_blocked_grouped of their plain
    scales; rows past offs[-1] get codes 0."""
    a = torch.zeros(x.shape[0], x.shape[1] // 2, dtype=torch.uint8)
    plain = torch.zeros(x.shape[0], x.shape[1] // 16, dtype=E4M3)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            a[start:end], _ = quantize_activation(x[start:end], scales[g:g + 1].clone())
            _, plain[start:end] = quantize_nvfp4(x[start:end], float(scales[g]))
        start = max(start, end)
    return a, to_blocked_grouped(plain, offs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("counts,pad", [
    ([0, 1, 37, 130, 0, 5], 0),  # empty experts, one expert past 128 rows
    ([3, 0, 0, 9], 11),  # rows past offs[-1]
    ([200], 0),  # one expert
    ([0, 0, 0], 7),  # no expert has a row
    ([0, 0], 0),  # T = 0
])
def test_quantize_experts_is_quantize_activation_per_expert(dtype, counts, pad) -> None:
    x, offs, scales = routed(counts, 96, pad, dtype, seed=len(counts) + pad)
    a, sfa = quantize_experts(x, offs, scales)
    ref_a, ref_sfa = reference_experts(x, offs, scales)
    assert a.dtype == torch.uint8 and tuple(a.shape) == (x.shape[0], 48)
    assert sfa.dtype == E4M3
    assert sfa.numel() == sfa_rows_needed(x.shape[0], len(counts)) * 8  # 96 / 16 -> 8 columns
    assert torch.equal(a, ref_a)
    assert torch.equal(sfa.view(torch.uint8), ref_sfa.view(torch.uint8))


def test_quantize_experts_chunks_give_the_same_bits(monkeypatch) -> None:
    x, offs, scales = routed([5, 0, 70, 3], 128, 4, torch.bfloat16, seed=9)
    whole = quantize_experts(x, offs, scales)
    monkeypatch.setattr(activations, "_CHUNK_ELEMENTS", 3 * 128)  # 3 rows per chunk
    chunked = quantize_experts(x, offs, scales)
    assert all(torch.equal(u.view(torch.uint8), v.view(torch.uint8))
               for u, v in zip(whole, chunked))


def test_quantize_experts_takes_offs_as_the_kernels_do() -> None:
    """Decreasing offsets and ends past T are clamped and made non-decreasing (cummax), as the
    kernels read them: the same result as the repaired offsets."""
    x, _, scales = routed([4, 4, 4], 64, 0, torch.float32, seed=2)
    bad = torch.tensor([6, 2, 99], dtype=torch.int32)
    fixed = torch.tensor([6, 6, 12], dtype=torch.int32)
    a, _ = quantize_experts(x, bad, scales)
    b, _ = quantize_experts(x, fixed, scales)
    assert torch.equal(a, b)
    assert torch.equal(a, reference_experts(x, fixed, scales)[0])


def test_a_float_input_scale_is_that_scale_for_every_expert() -> None:
    x, offs, _ = routed([3, 9, 1], 64, 2, torch.bfloat16, seed=4)
    one = quantize_experts(x, offs, 0.0123)
    per_expert = quantize_experts(x, offs, torch.full((3,), 0.0123))
    assert all(torch.equal(u.view(torch.uint8), v.view(torch.uint8))
               for u, v in zip(one, per_expert))


@pytest.mark.parametrize("max_m", [0, 5, 128, 130])
def test_quantize_masked_is_quantize_nvfp4_and_to_blocked_per_expert(max_m) -> None:
    gen = torch.Generator().manual_seed(max_m)
    experts, k = 3, 80
    x = (torch.randn(experts, max_m, k, generator=gen) * 3).to(torch.bfloat16)
    scales = torch.tensor([0.5, 2.0 ** -9, 0.013], dtype=torch.float32)
    a, sfa = quantize_masked(x, scales)
    assert tuple(a.shape) == (experts, max_m, k // 2) and a.dtype == torch.uint8
    assert tuple(sfa.shape) == (experts, blocked_scale_numel(max_m, k)) and sfa.dtype == E4M3
    for e in range(experts):
        ref_a, ref_s = quantize_nvfp4(x[e], float(scales[e]))
        assert torch.equal(a[e], ref_a)
        assert torch.equal(sfa[e].view(torch.uint8), to_blocked(ref_s).view(torch.uint8))


@pytest.mark.parametrize("max_m,masked", [
    (5, [0, 3, 5]),  # an expert with no row, one partly and one wholly valid
    (130, [129, 130, 1]),  # rows past the first 128-row block
    (6, [-4, 7, 2**31 - 1]),  # clamped to [0, max_m], as masked_grouped_mm reads it
])
def test_quantize_masked_with_masked_m_zeroes_the_scales_of_rows_past_it(max_m, masked) -> None:
    """Rows below masked_m[e] get the unmasked bits; every scale of a row past it is 0 (so the
    GEMM's padding rows multiply zeros); the codes of those rows are unspecified."""
    gen = torch.Generator().manual_seed(max_m)
    experts, k = 3, 80
    x = (torch.randn(experts, max_m, k, generator=gen) * 3).to(torch.bfloat16)
    x[0, -1, 3] = float("nan")  # a masked row's NaN poisons nothing
    scales = torch.tensor([0.5, 2.0 ** -9, 0.013], dtype=torch.float32)
    a, sfa = quantize_masked(x, scales, torch.tensor(masked, dtype=torch.int32))
    full_a, full_sfa = quantize_masked(x, scales)
    for e, m in enumerate(masked):
        valid = min(max(m, 0), max_m)
        assert torch.equal(a[e, :valid], full_a[e, :valid])
        got = from_blocked(sfa[e], max_m, k).view(torch.uint8)
        want = from_blocked(full_sfa[e], max_m, k).view(torch.uint8)
        assert torch.equal(got[:valid], want[:valid])
        assert not got[valid:].any()
        # The blocked padding (rows past max_m, columns past K / 16) stays 0 as before.
        assert sfa[e].view(torch.uint8).sum() == got.sum(dtype=torch.int64)


@pytest.mark.parametrize("masked_m,message", [
    ([1, 2], "masked_m must be None or an int32 torch.Tensor, but got list"),
    (torch.tensor([1, 2]), "masked_m must be None or an int32 torch.Tensor, but got torch.int64"),
    (torch.tensor([1, 2, 3], dtype=torch.int32),
     r"masked_m must have shape \(2,\) \(one row count per expert of x\), but got \(3,\)"),
    (torch.tensor([[1, 2]], dtype=torch.int32),
     r"masked_m must have shape \(2,\) \(one row count per expert of x\), but got \(1, 2\)"),
    (torch.zeros(2, dtype=torch.int32, device="meta"),
     "masked_m must be on x's device cpu, but got meta"),
])
def test_a_bad_masked_m_is_refused(masked_m, message) -> None:
    with pytest.raises(InputError, match=f"^{message}$"):
        quantize_masked(torch.zeros(2, 4, 64), 1.0, masked_m)


def test_blocks_with_nan_or_inf_get_nan_scales_and_others_stay_exact() -> None:
    x, offs, scales = routed([8, 8], 64, 0, torch.float32, seed=6)
    x[2, 5] = float("nan")  # row 2, block 0 (expert 0)
    x[12, 40] = float("inf")  # row 12, block 2 (expert 1)
    _, sfa = quantize_experts(x, offs, scales)
    clean = x.clone()
    clean[2, 5] = clean[12, 40] = 0.0
    _, sfa_clean = quantize_experts(clean, offs, scales)
    # (blocked row, scale column): expert 1's rows start at blocked row 128.
    offsets = {blocked_scale_offset(i, j, 64) for i, j in ((2, 0), (128 + 4, 2))}
    got, want = sfa.view(torch.uint8), sfa_clean.view(torch.uint8)
    for o in offsets:
        assert got[o] == 0x7F, o
    keep = torch.ones_like(got, dtype=torch.bool)
    keep[list(offsets)] = False
    assert torch.equal(got[keep], want[keep])


def test_no_tensor_value_is_read_on_the_host(monkeypatch) -> None:
    """On a GPU any of these would synchronize the stream (and break graph capture): the
    quantizers must never call them. (The GPU test checks the same with sync debug mode.)"""
    x, offs, scales = routed([3, 0, 20, 1], 64, 5, torch.bfloat16, seed=1)
    xm = x[:24].reshape(4, 6, 64)

    def refuse(*_a, **_k):
        raise AssertionError("a tensor value was read on the host")

    for name in ("__bool__", "__float__", "__int__", "__index__", "item", "tolist", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    quantize_experts(x, offs, scales)
    quantize_masked(xm, scales)
    quantize_masked(xm, scales, torch.tensor([6, 0, 2, 9], dtype=torch.int32))


@pytest.mark.parametrize("args,message", [
    (("x", "offs", "s"), "x must be a torch.Tensor, but got str"),
    ((torch.zeros(4, 64, dtype=torch.float64), "offs", "s"),
     "x must be bfloat16, float16 or float32, but got torch.float64"),
    ((torch.zeros(4, 4, 64), "offs", "s"), r"x must be 2-D \(T, K\), but got shape \(4, 4, 64\)"),
    ((torch.zeros(4, 40), "offs", "s"), "K must be a positive multiple of 16, but got 40"),
    ((torch.zeros(4, 64), [4], "s"), "offs must be an int32 torch.Tensor, but got list"),
    ((torch.zeros(4, 64), torch.tensor([4.0]), "s"),
     "offs must be an int32 torch.Tensor, but got torch.float32"),
    ((torch.zeros(4, 64), torch.tensor([4]), "s"),
     "offs must be an int32 torch.Tensor, but got torch.int64"),
    ((torch.zeros(4, 64), torch.zeros(0, dtype=torch.int32), "s"),
     r"offs must be 1-D \(E,\) with E > 0, but got shape \(0,\)"),
    ((torch.zeros(4, 64), torch.tensor([4], dtype=torch.int32), "s"),
     "input_scale must be a float32 torch.Tensor \\(E,\\) or a real number, but got str"),
    ((torch.zeros(4, 64), torch.tensor([4], dtype=torch.int32), torch.ones(1).double()),
     "input_scale must be float32, but got torch.float64"),
    ((torch.zeros(4, 64), torch.tensor([2, 4], dtype=torch.int32), torch.ones(1)),
     r"input_scale must have shape \(E,\) = \(2,\), but got \(1,\) \(one scale for all: "
     r"\.expand\(2\)\)"),
    ((torch.zeros(4, 64), torch.tensor([4], dtype=torch.int32), 0.0),
     r"input_scale must be positive and finite in float32, but got 0.0 \(float32: 0.0\)"),
    ((torch.zeros(4, 64), torch.tensor([4], dtype=torch.int32), -3),
     r"input_scale must be positive and finite in float32, but got -3 \(float32: -3.0\)"),
    ((torch.zeros(4, 64), torch.tensor([4], dtype=torch.int32), 1e-60),
     r"input_scale must be positive and finite in float32, but got 1e-60 \(float32: 0.0\)"),
    ((torch.zeros(4, 64), torch.tensor([4], dtype=torch.int32), 10**400),
     r"input_scale must be positive and finite in float32, but got 1" + "0" * 39
     + r" \(float32: inf\)"),  # the repr cut at 40 characters
    ((torch.zeros(4, 64), torch.tensor([4], dtype=torch.int32), True),
     "input_scale must be a float32 torch.Tensor \\(E,\\) or a real number, but got bool"),
])
def test_quantize_experts_errors(args, message) -> None:
    with pytest.raises(InputError, match=f"^{message}$"):
        quantize_experts(*args)


@pytest.mark.parametrize("x,scale,message", [
    (torch.zeros(8, 64), 1.0, r"x must be 3-D \(E, max_m, K\), but got shape \(8, 64\)"),
    (torch.zeros(0, 4, 64), 1.0, "x must have at least one expert, but got E = 0"),
    (torch.zeros(2, 4, 64), torch.ones(3), r"input_scale must have shape \(E,\) = \(2,\), but "
     r"got \(3,\) \(one scale for all: \.expand\(2\)\)"),
    (torch.zeros(2, 4, 64), float("nan"),
     r"input_scale must be positive and finite in float32, but got nan \(float32: nan\)"),
])
def test_quantize_masked_errors(x, scale, message) -> None:
    with pytest.raises(InputError, match=f"^{message}$"):
        quantize_masked(x, scale)


def test_offs_and_input_scale_on_another_device_are_refused(monkeypatch) -> None:
    """Device mismatches are named (meta tensors stand in for a second device on the CPU)."""
    x = torch.zeros(4, 64)
    with pytest.raises(InputError, match=r"^offs must be on x's device cpu, but got meta$"):
        quantize_experts(x, torch.zeros(1, dtype=torch.int32, device="meta"), 1.0)
    with pytest.raises(InputError, match=r"^input_scale must be on x's device cpu, but got meta$"):
        quantize_experts(x, torch.tensor([4], dtype=torch.int32),
                         torch.ones(1, device="meta"))


def test_both_quantizers_trace_whole_under_torch_compile() -> None:
    """fullgraph=True fails on any graph break, which a host read of a value would cause: the
    quantizers fit inside a compiled serving step, with the eager bits."""
    x, offs, scales = routed([3, 0, 17, 4], 64, 2, torch.bfloat16, seed=3)
    xm = x[:24].reshape(4, 6, 64)
    mask = torch.tensor([6, 0, 2, 9], dtype=torch.int32)
    for fn, args in ((quantize_experts, (x, offs, scales)), (quantize_masked, (xm, scales)),
                     (quantize_masked, (xm, scales, mask))):
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        for got, want in zip(compiled(*args), fn(*args)):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_each_quantizer_is_one_opaque_op_in_a_compiled_graph() -> None:
    """Inductor sees one nvfp4 op per call and none of its float64 and bit operations: on the
    H200 its Triton compile of them failed (2026-12-05), so compiling a serving step that
    quantizes would crash if they were traced through. The fake gives the eager shapes and
    dtypes, also for sizes it was not traced with (dynamic shapes)."""
    seen: list[set] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    x, offs, scales = routed([3, 0, 17, 4], 64, 2, torch.bfloat16, seed=3)
    xm = x[:24].reshape(4, 6, 64)
    for fn, args, op in ((quantize_experts, (x, offs, scales), "nvfp4.quantize_experts"),
                         (quantize_masked, (xm, scales), "nvfp4.quantize_masked")):
        seen.clear()
        compiled = torch.compile(fn, fullgraph=True, backend=record)
        for got, want in zip(compiled(*args), fn(*args)):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        ops = set().union(*seen)
        assert any(t.startswith(op) for t in ops), ops
        assert not any("bitwise" in t or "bucketize" in t or "amax" in t for t in ops), ops
    for t, k, e in ((7, 32, 3), (300, 96, 5)):
        x = torch.zeros(t, k, dtype=torch.bfloat16)
        offs = torch.full((e,), t, dtype=torch.int32)
        mode = torch._subclasses.fake_tensor.FakeTensorMode()
        fx, foffs, fxm = (mode.from_tensor(v) for v in (x, offs, x.view(1, t, k)))
        with mode:
            fa, fsfa = quantize_experts(fx, foffs, 1.0)
            fm, fmsfa = quantize_masked(fxm, 1.0)
        for fake, real in zip((fa, fsfa, fm, fmsfa),
                              quantize_experts(x, offs, 1.0) + quantize_masked(x.view(1, t, k), 1.0)):
            assert (fake.shape, fake.dtype) == (real.shape, real.dtype)


def test_a_real_number_input_scale_is_rounded_to_float32_as_quantize_activation_does() -> None:
    """2^-4 (1 - 2^-40) is 2^-4 in float32. With 2^-4, 0.15625 = 2.5 * 2^-4 is a tie that goes
    to the even code 4 (2.0): first byte 7 | 4 << 4 = 71. The unrounded number would push it
    past the tie to code 5 (byte 87)."""
    s = 2.0 ** -4 * (1 - 2.0 ** -40)
    x = torch.zeros(1, 16, dtype=torch.bfloat16)
    x[0, 0], x[0, 1] = 0.375, 0.15625  # 6 and 2.5 times 2^-4
    offs = torch.tensor([1], dtype=torch.int32)
    want_a, want_sfa = quantize_activation(x, s)
    assert int(want_a[0, 0]) == 71
    for got_a, got_sfa in (quantize_experts(x, offs, s),
                           quantize_experts(x, offs, torch.tensor([s])),
                           quantize_masked(x.view(1, 1, 16), s)):
        assert torch.equal(got_a.reshape(1, 8), want_a)
        assert torch.equal(got_sfa.view(torch.uint8).reshape(-1)[:16],
                           want_sfa.view(torch.uint8)[:16])


def test_an_expert_with_a_bad_input_scale_gets_nan_scales_and_zero_codes() -> None:
    """Checking the scales would read them on the host (a sync), so a scale that is not
    positive and finite poisons its expert's rows instead; the other experts are untouched."""
    x, offs, scales = routed([4, 4, 4, 4, 4], 64, 0, torch.bfloat16, seed=8)
    bad = scales.clone()
    bad[1], bad[2], bad[3] = 0.0, float("nan"), -1.0
    a, sfa = quantize_experts(x, offs, bad)
    want_a, want_sfa = quantize_experts(x, offs, scales)
    assert (a[4:16] == 0).all()
    assert torch.equal(a[:4], want_a[:4]) and torch.equal(a[16:], want_a[16:])
    rows = sfa_rows_needed(20, 5)  # expert g's 4 rows start at blocked row 128 g
    plain = from_blocked(sfa.view(torch.uint8), rows, 64)
    want = from_blocked(want_sfa.view(torch.uint8), rows, 64)
    for g in range(5):
        if g in (1, 2, 3):
            assert (plain[128 * g:128 * g + 4] == 0x7F).all(), g
        else:
            assert torch.equal(plain[128 * g:128 * g + 4], want[128 * g:128 * g + 4]), g
    am, sm = quantize_masked(x.view(5, 4, 64), bad)
    assert (am[1:4] == 0).all()
    for g in range(5):
        masked_plain = from_blocked(sm[g].view(torch.uint8), 4, 64)
        assert ((masked_plain == 0x7F).all() == (g in (1, 2, 3))), g


def test_no_host_to_device_copy_in_the_quantizers(monkeypatch) -> None:
    """torch.tensor / as_tensor of host values would be a host-to-device copy on a GPU (a sync,
    and refused under graph capture); the quantizers build every constant on the device."""
    x, offs, scales = routed([3, 0, 20, 1], 64, 5, torch.bfloat16, seed=1)

    def refuse(*_a, **_k):
        raise AssertionError("a tensor was built from host values")

    monkeypatch.setattr(torch, "tensor", refuse)
    monkeypatch.setattr(torch, "as_tensor", refuse)
    quantize_experts(x, offs, scales)
    quantize_experts(x, offs, 0.01)
    quantize_masked(x[:24].reshape(4, 6, 64), scales)


def test_inputs_that_require_grad_build_no_autograd_graph() -> None:
    x, offs, scales = routed([3, 5], 32, 0, torch.float32, seed=2)
    x.requires_grad_(True)
    scales.requires_grad_(True)
    a, sfa = quantize_experts(x, offs, scales)
    am, sm = quantize_masked(x.view(2, 4, 32), scales)
    assert all(t.grad_fn is None and not t.requires_grad for t in (a, sfa, am, sm))
