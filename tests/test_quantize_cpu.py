"""runtime/quantize.py without a GPU: which calls the AOT quantizer takes (`fits`,
`quantizer_for`), the parameters and outputs of its launch (with a recording device runtime in
place of the driver), the torch path for every other call, and the torch ops' fakes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import runtime.quantize as rq
import runtime.torch_op  # noqa: F401 - registers the nvfp4 ops
from runtime import activations
from runtime.errors import InputError
from runtime.formats import blocked_scale_numel, scale_cols, sfa_rows_needed
from runtime.manifest import Param, Quantizer
from runtime.params import pack_params, role


def _param(i: int, name: str, kind: str) -> Param:
    offset = 8 * i if kind == "operand" else None
    return Param(name=name, kind=kind, offset=offset, size=8 if kind == "operand" else 4,
                 align=8 if kind == "operand" else 4,
                 operand=name if kind == "operand" else None,
                 value=name if kind == "scalar" else None)


def quantizer(layout: str, fills: bool = True, mask: bool = True) -> Quantizer:
    """A record with the shipped kernels' parameter lists (tests/test_shipped_kernels.py);
    fills=False: one built before the kernels wrote sfa's padding (no sfa_chunks); mask=False:
    a masked one built before it took masked_m (and quant_ctas)."""
    mask = mask and layout == "masked"
    ops = (["x", "offs", "scales", "a", "sfa"] if layout == "experts"
           else ["x", "scales"] + ["masked_m"] * mask + ["a", "sfa"])
    scalars = ["rows" if layout == "experts" else "max_m", "k", "experts", "blocks"]
    scalars += ["sfa_chunks"] * fills + ["quant_ctas"] * mask
    params = [_param(i, n, "operand") for i, n in enumerate(ops)]
    at = 8 * len(ops)
    params += [Param(name=n, kind="scalar", offset=at + 4 * i, size=4, align=4, value=n)
               for i, n in enumerate(scalars)]
    return Quantizer(key="k" * 64, name=f"act_quant_{layout}.sm_90a.{'k' * 12}", layout=layout,
                     arch="sm_90a", symbol="q", cubin="cubins/q.cubin", sha256="0" * 64,
                     cubin_bytes=1, block=(256, 1, 1), dynamic_smem=0,
                     max_experts=1024 if layout == "experts" or mask else 0,
                     params=tuple(params))


@pytest.mark.parametrize("shape,experts,ok", [
    ((512, 2048), 128, True),
    ((512, 2048), 1024, True),
    ((512, 2048), 1025, False),  # the kernel's shared-memory tables hold 1024
    # sfa's bytes reach Int32 first: (round_up(T, 128) + 128 E) rows of K / 16 bytes
    ((2 ** 23 - 128 * 8, 4096), 8, False),
    ((2 ** 23 - 128 * 9, 4096), 8, True),
])
def test_the_experts_kernel_takes_what_its_tables_and_int32_indices_hold(shape, experts, ok):
    assert rq.fits(quantizer("experts"), shape, experts) is ok


@pytest.mark.parametrize("mask", [True, False])
def test_the_masked_kernel_takes_any_expert_count_and_sfa_within_int32(mask):
    q = quantizer("masked", mask=mask)
    assert rq.fits(q, (4096, 16, 2048), 4096)
    # sfa: E * 128 rows * K / 16 bytes reaches 2^31 before the blocks do (K 16384).
    e = 2 ** 31 // blocked_scale_numel(1, 16384)
    assert rq.fits(q, (e - 1, 1, 16384), e - 1) and not rq.fits(q, (e, 1, 16384), e)


def test_a_grid_stride_masked_kernel_keeps_its_last_stride_within_int32():
    """The grid-stride kernel (masked_m) steps a thread's block index past the last block by
    up to its stride, at most one thread per block: 2^30 - 1024 blocks fit, 2^30 do not (the
    one-pass kernel built before takes them: its bound is blocks + 256)."""
    k = 2 ** 14  # 1024 blocks a row
    assert rq.fits(quantizer("masked"), (1, 2 ** 20 - 1, k), 1)
    assert not rq.fits(quantizer("masked"), (1, 2 ** 20, k), 1)
    assert rq.fits(quantizer("masked", mask=False), (1, 2 ** 20, k), 1)


class _Recorder:
    arch = "sm_90a"
    device = SimpleNamespace(sm_count=132)

    def __init__(self) -> None:
        self.launches: list = []

    def launch_quantizer(self, q, values, grid):
        pack_params(q.params, values)  # every role filled, every value in its slot's range
        self.launches.append((q.layout, dict(values), grid))


def _gg(*quantizers: Quantizer):
    rec = _Recorder()
    manifest = SimpleNamespace(quantizer=lambda layout, arch: next(
        (q for q in quantizers if (q.layout, q.arch) == (layout, arch)), None))
    return SimpleNamespace(store=SimpleNamespace(manifest=manifest),
                           _runtime=lambda ordinal: rec), rec


@pytest.fixture
def on_cuda(monkeypatch):
    """quantizer_for as on a CUDA device (these CPU tensors stand in for CUDA ones)."""
    monkeypatch.setattr(rq, "_KERNEL_DEVICE_TYPE", "cpu")


@pytest.mark.parametrize("fills", [True, False])
def test_an_experts_call_launches_one_kernel_over_every_block(on_cuda, monkeypatch, fills):
    """One launch: a CTA per 256 blocks, then (a filling kernel) one per 256 x
    FILL_CHUNKS_PER_THREAD of sfa's 16-byte chunks into an uninitialized sfa; a kernel built
    before gets a zeroed sfa and no more."""
    allocs = []
    monkeypatch.setattr(rq.torch, "zeros", lambda *a, **kw: allocs.append("zeros")
                        or torch.full(*a, 0, **kw))
    monkeypatch.setattr(rq.torch, "empty", lambda *a, **kw: allocs.append("empty")
                        or torch.full(*a, 0x5A, **kw))
    gg, rec = _gg(quantizer("experts", fills))
    x = torch.randn(300, 96).bfloat16()
    offs = torch.tensor([10, 10, 250], dtype=torch.int32)
    a, sfa = rq.quantize_experts(gg, x, offs, 0.5)
    assert a.shape == (300, 48) and a.dtype == torch.uint8
    assert sfa.dtype == torch.float8_e4m3fn
    assert sfa.numel() == sfa_rows_needed(300, 3) * scale_cols(96)
    # empty for a (and for sfa when the kernel fills it); zeros for sfa otherwise.
    assert allocs == ["empty", "empty" if fills else "zeros"]
    ((layout, values, grid),) = rec.launches
    blocks = 300 * 96 // 16
    chunks = sfa.numel() // 16
    fills_ctas = rq.fill_ctas(chunks, 256, 132) if fills else 0
    assert (layout, grid) == ("experts", math.ceil(blocks / 256) + fills_ctas)
    assert {k: values[k] for k in ("rows", "k", "experts", "blocks")} == {
        "rows": 300, "k": 96, "experts": 3, "blocks": blocks}
    assert values.get("sfa_chunks") == (chunks if fills else None)
    assert (values["x"], values["offs"], values["a"], values["sfa"]) == (
        x.data_ptr(), offs.data_ptr(), a.data_ptr(), sfa.data_ptr())
    assert set(values) == {role(p) for p in quantizer("experts", fills).params}


@pytest.mark.parametrize("fills", [True, False])
def test_a_call_with_no_tokens_still_fills_sfa(on_cuda, fills):
    """T = 0: no block to quantize, but sfa (128 rows per expert) must hold zeros: the filling
    kernel launches one CTA for it; a zeroed sfa needs no launch."""
    gg, rec = _gg(quantizer("experts", fills), quantizer("masked", fills))
    _, sfa = rq.quantize_experts(gg, torch.zeros(0, 64).bfloat16(),
                                 torch.tensor([0, 0], dtype=torch.int32), 1.0)
    assert sfa.numel() == 2 * 128 * 4
    assert rec.launches == ([("experts", rec.launches[0][1], 1)] if fills else [])
    if fills:
        assert (rec.launches[0][1]["blocks"], rec.launches[0][1]["sfa_chunks"]) == (0, 64)
    rec.launches.clear()
    _, sfa = rq.quantize_masked(gg, torch.zeros(3, 0, 64).bfloat16(), 1.0)
    assert sfa.shape == (3, 0) and rec.launches == []  # no rows, no scales: nothing to launch


def test_a_real_input_scale_is_filled_on_the_device_in_float32(on_cuda, monkeypatch):
    seen = []
    monkeypatch.setattr(rq, "_launch", lambda gg, q, x, values, ctas=None:
                        seen.append(values["scales"]))
    gg, _ = _gg(quantizer("experts"))
    rq.quantize_experts(gg, torch.randn(4, 32).bfloat16(), torch.tensor([4], dtype=torch.int32),
                        1 / 3)
    assert seen[0].dtype == torch.float32 and seen[0].tolist() == [
        torch.tensor(1 / 3, dtype=torch.float32).item()]
    with pytest.raises(InputError, match=r"input_scale must be positive and finite in float32, "
                                         r"but got 1e\+39 \(float32: inf\)"):
        rq.quantize_experts(gg, torch.randn(4, 32).bfloat16(),
                            torch.tensor([4], dtype=torch.int32), 1e39)


def test_a_misaligned_or_strided_x_is_copied_for_the_kernel(on_cuda):
    gg, rec = _gg(quantizer("masked"))
    buf = torch.randn(2 * 8 * 64 + 1).bfloat16()
    x = buf[1:].view(2, 8, 64)  # 2 bytes past an aligned start
    assert x.data_ptr() % 16 != 0
    rq.quantize_masked(gg, x, torch.ones(2))
    ((_, values, _),) = rec.launches
    assert values["x"] % 16 == 0 and values["x"] != x.data_ptr()
    assert (values["max_m"], values["experts"], values["blocks"]) == (8, 2, 2 * 8 * 64 // 16)
    rq.quantize_masked(gg, torch.randn(8, 2, 64).bfloat16().transpose(0, 1), torch.ones(2))
    assert rec.launches[-1][1]["x"] % 16 == 0


def test_calls_no_kernel_serves_take_the_torch_path_with_its_bits(on_cuda):
    gg, rec = _gg(quantizer("experts"))  # no masked quantizer
    x = (torch.randn(40, 64) * 3).bfloat16()
    offs = torch.tensor([5, 5, 30], dtype=torch.int32)
    scales = torch.tensor([0.1, 0.2, 0.3])
    for got, want in ((rq.quantize_experts(gg, x.float(), offs, scales),  # float32 x
                       activations.quantize_experts(x.float(), offs, scales)),
                      (rq.quantize_masked(gg, x.view(2, 20, 64), scales[:2]),
                       activations.quantize_masked(x.view(2, 20, 64), scales[:2]))):
        for g, w in zip(got, want):
            assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))
    assert rec.launches == []


def test_bad_input_is_refused_before_any_launch(on_cuda):
    gg, rec = _gg(quantizer("experts"), quantizer("masked"))
    x = torch.randn(8, 64).bfloat16()
    with pytest.raises(InputError, match="offs must be an int32 torch.Tensor, but got "
                                         "torch.int64"):
        rq.quantize_experts(gg, x, torch.tensor([8]), 1.0)
    with pytest.raises(InputError, match=r"input_scale must have shape \(E,\) = \(2,\), but "
                                         r"got \(3,\)"):
        rq.quantize_experts(gg, x, torch.tensor([4, 8], dtype=torch.int32), torch.ones(3))
    with pytest.raises(InputError, match="x must have at least one expert, but got E = 0"):
        rq.quantize_masked(gg, torch.empty(0, 4, 64).bfloat16(), 1.0)
    assert rec.launches == []


def test_the_ops_fakes_give_the_output_shapes_and_run_the_checks():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(300, 96, dtype=torch.bfloat16)
        offs = torch.empty(3, dtype=torch.int32)
        a, sfa = torch.ops.nvfp4.act_quant_experts(x, offs, torch.empty(3))
        assert tuple(a.shape) == (300, 48)
        assert tuple(sfa.shape) == (sfa_rows_needed(300, 3) * scale_cols(96),)
        am, sfam = torch.ops.nvfp4.act_quant_masked(x.view(3, 100, 96), torch.empty(3))
        assert tuple(am.shape) == (3, 100, 48)
        assert tuple(sfam.shape) == (3, blocked_scale_numel(100, 96))
        mask = torch.empty(3, dtype=torch.int32)
        am, sfam = torch.ops.nvfp4.act_quant_masked(x.view(3, 100, 96), torch.empty(3),
                                                     masked_m=mask)
        assert (tuple(am.shape), tuple(sfam.shape)) == ((3, 100, 48),
                                                        (3, blocked_scale_numel(100, 96)))
        with pytest.raises(InputError, match="masked_m must be None or an int32 torch.Tensor, "
                                             "but got torch.int64"):
            torch.ops.nvfp4.act_quant_masked(x.view(3, 100, 96), torch.empty(3),
                                             masked_m=torch.empty(3, dtype=torch.int64))
        with pytest.raises(InputError, match="input_scale must be float32, but got "
                                             "torch.float64"):
            torch.ops.nvfp4.act_quant_experts(x, offs, torch.empty(3, dtype=torch.float64))


@pytest.mark.parametrize("with_mask", [False, True])
def test_a_masked_call_passes_masked_m_and_caps_its_quantizing_ctas(on_cuda, with_mask):
    """Without masked_m: a null address and one quantizing CTA per 256 blocks (the one-pass
    plan); with it: its address and at most MASKED_CTAS_PER_SM per SM (grid-stride), the
    filling CTAs after them either way."""
    gg, rec = _gg(quantizer("masked"))
    experts, max_m, k = 4, 1024, 2048
    x = torch.zeros(experts, max_m, k, dtype=torch.bfloat16)
    mask = torch.tensor([3, 0, 1024, 70], dtype=torch.int32) if with_mask else None
    _, sfa = rq.quantize_masked(gg, x, 1.0, mask)
    ((layout, values, grid),) = rec.launches
    blocks = experts * max_m * k // 16
    quant = min(blocks // 256, 132 * rq.MASKED_CTAS_PER_SM) if with_mask else blocks // 256
    assert with_mask is (quant < blocks // 256)  # this call is large enough to be capped
    chunks = sfa.numel() // 16
    assert values["masked_m"] == (mask.data_ptr() if with_mask else 0)
    assert (values["blocks"], values["quant_ctas"], values["sfa_chunks"]) == (
        blocks, quant, chunks)
    assert grid == quant + rq.fill_ctas(chunks, 256, 132)
    assert set(values) == {role(p) for p in quantizer("masked").params}


def test_masked_m_with_a_masked_kernel_built_before_takes_the_torch_path(on_cuda):
    """A kernel built before masked_m would quantize (and write scales for) every row."""
    gg, rec = _gg(quantizer("masked", mask=False))
    x = (torch.randn(3, 20, 64) * 3).bfloat16()
    scales = torch.tensor([0.1, 0.2, 0.3])
    mask = torch.tensor([20, 4, 0], dtype=torch.int32)
    for got, want in zip(rq.quantize_masked(gg, x, scales, mask),
                         activations.quantize_masked(x, scales, mask)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert rec.launches == []
    rq.quantize_masked(gg, x, scales)  # without masked_m it serves the call
    assert len(rec.launches) == 1 and "masked_m" not in rec.launches[0][1]


def test_a_bad_masked_m_is_refused_before_any_launch(on_cuda):
    gg, rec = _gg(quantizer("masked"))
    with pytest.raises(InputError, match=r"^masked_m must have shape \(2,\) \(one row count "
                                         r"per expert of x\), but got \(3,\)$"):
        rq.quantize_masked(gg, torch.zeros(2, 4, 64).bfloat16(), 1.0,
                           torch.zeros(3, dtype=torch.int32))
    assert rec.launches == []


def test_the_filling_ctas_are_capped_per_sm():
    """One at least (a call with no rows still has padding), one per 256 x
    FILL_CHUNKS_PER_THREAD chunks, at most FILL_CTAS_PER_SM per SM (each derives the tables)."""
    per_cta = 256 * rq.FILL_CHUNKS_PER_THREAD
    assert rq.fill_ctas(0, 256, 132) == 1
    assert rq.fill_ctas(per_cta + 1, 256, 132) == 2
    assert rq.fill_ctas(10 ** 6, 256, 132) == 132 * rq.FILL_CTAS_PER_SM
    assert rq.fill_ctas(10 ** 6, 256, 1) == rq.FILL_CTAS_PER_SM


def test_a_masked_call_with_more_experts_than_its_table_takes_the_torch_path(on_cuda):
    """With masked_m the kernel keeps a table of E entries (max_experts); without, any E."""
    gg, rec = _gg(quantizer("masked"))
    q = quantizer("masked")
    assert q.max_experts == 1024
    assert rq.fits(q, (1025, 2, 64), 1025) and not rq.fits(q, (1025, 2, 64), 1025, masked=True)
    x = torch.zeros(1025, 2, 64, dtype=torch.bfloat16)
    mask = torch.ones(1025, dtype=torch.int32)
    for got, want in zip(rq.quantize_masked(gg, x, 1.0, mask),
                         activations.quantize_masked(x, 1.0, mask)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert rec.launches == []
