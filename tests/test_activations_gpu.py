"""runtime.activations on the GPU: the same bits as on the CPU, no device sync, and quantized
activations fed to scaled_grouped_mm / masked_grouped_mm inside one CUDA graph replayed with new
tokens and routing, bit-exact against the float64 reference. The tokens are drawn so that
quantizing them must give back the codes and scales they were made from (every block holds a
+-6, decode scales are powers of two), with EXACT_DATA's scale ranges (every fp32 sum exact).

Skipped without a GPU or without a device-offsets / masked kernel in the artifacts.
"""

from __future__ import annotations

import random
import sys

import pytest
import torch
from test_runtime_gpu import ARTIFACTS, REPO, gg  # noqa: F401 - gg: the artifacts fixture

import runtime
import runtime.activations
from runtime.activations import quantize_experts, quantize_masked
from runtime.dispatch import dynamic_groups
from runtime.formats import SF_VEC
from runtime.nvfp4 import (
    EXACT_DATA,
    dequantize_nvfp4,
    pack_fp4,
    reference_grouped_gemm,
    to_blocked,
    to_blocked_grouped,
)
from runtime.quantize import quantizer_for

sys.path.insert(0, str(REPO / "scripts"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def tokens(rows: int, k: int, row_scale: torch.Tensor, gen: torch.Generator):
    """(x bf16 (rows, K), packed codes, plain e4m3 scales) with x = dequant * row_scale, such
    that quantizing x with decode scale row_scale gives back exactly these codes and scales:
    no -0 code, and each 16-block's first value is +-6."""
    dev = gen.device
    codes = torch.randint(0, 16, (rows, k), dtype=torch.uint8, generator=gen, device=dev)
    codes[codes == 8] = 0
    codes[:, ::SF_VEC] = 7 + 8 * (codes[:, ::SF_VEC] >= 8)
    lo, hi = EXACT_DATA["scale_exp"]
    exps = torch.randint(lo, hi + 1, (rows, k // SF_VEC), generator=gen, device=dev)
    plain = torch.pow(2.0, exps.to(torch.float32)).to(torch.float8_e4m3fn)
    packed = pack_fp4(codes)
    x = (dequantize_nvfp4(packed, plain) * row_scale[:, None]).to(torch.bfloat16)
    return x, packed, plain


def test_gpu_quantizers_give_the_cpu_bits_and_never_sync() -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    experts, k = 128, 512
    counts = [(0, 1, 37, 130, 0, 5)[g % 6] for g in range(experts)]
    t = sum(counts) + 9
    x = (torch.randn(t, k, generator=gen, device="cuda") * 5).to(torch.bfloat16)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    scales = (torch.rand(experts, generator=gen, device="cuda") + 0.1) * 0.01
    xm = x[: 4 * 48].reshape(4, 48, k)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = quantize_experts(x, offs, scales) + quantize_masked(xm, scales[:4])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    want = (quantize_experts(x.cpu(), offs.cpu(), scales.cpu())
            + quantize_masked(xm.cpu(), scales[:4].cpu()))
    for g, w in zip(got, want):
        assert torch.equal(g.cpu().view(torch.uint8), w.view(torch.uint8))


def _entry(gg: runtime.GroupedGemm, masked: bool):  # noqa: F811
    arch = gg.device_runtime(0).arch
    entries = [e for e in gg.kernels if e.arch == arch and e.takes_offsets
               and e.takes_masked == masked and e.out_dtype == "bfloat16" and e.takes_alpha]
    if not entries:
        pytest.skip(f"no bf16 {'masked' if masked else 'device-offsets'} kernel with alpha for "
                    f"{arch} in {ARTIFACTS}")

    def cost(e) -> int:
        nk, _ = dynamic_groups(e)
        return len(nk) * nk[0][0] * nk[0][1]

    e = min(entries, key=cost)
    nk, max_m = dynamic_groups(e)
    return e, len(nk), nk[0][0], nk[0][1], max_m


def _quantizers(gg: runtime.GroupedGemm, path: str) -> tuple:  # noqa: F811
    """(quantize_experts, quantize_masked) of `path`: runtime.activations' torch ops, or the
    artifacts' AOT kernels through gg (skipped where the artifacts have none for this GPU)."""
    if path == "torch":
        return quantize_experts, quantize_masked
    arch = gg.device_runtime(0).arch
    if None in (gg.store.manifest.quantizer("experts", arch),
                gg.store.manifest.quantizer("masked", arch)):
        pytest.skip(f"no quantizers for {arch} in {ARTIFACTS}")

    def experts(x, offs, scales):  # the kernel must serve it, not the torch fallback
        assert quantizer_for(gg, "experts", x, offs.numel()) is not None
        return gg.quantize_experts(x, offs, scales)

    def masked(x, scales, masked_m=None):
        assert quantizer_for(gg, "masked", x, x.shape[0], masked_m is not None) is not None
        return gg.quantize_masked(x, scales, masked_m)

    return experts, masked


@pytest.mark.parametrize("path", ["torch", "aot"])
def test_quantize_experts_then_scaled_grouped_mm_in_one_graph(gg, path) -> None:  # noqa: F811
    """One graph: quantize the static tokens with the static offsets, then the GEMM. Replayed
    with 10 routings (empty experts, all tokens on one expert, none): the quantizer returns the
    codes and scales the tokens were made from, and every owned output row is exact."""
    from serving_check import Weights

    quantize_experts, _ = _quantizers(gg, path)
    e, experts, n, k, max_m = _entry(gg, masked=False)
    t = min(256, max_m or 256)
    w = Weights(experts, n, k, seed=3)
    scales = torch.tensor([2.0 ** -(g % 5) for g in range(experts)], device="cuda")
    x = torch.zeros(t, k, dtype=torch.bfloat16, device="cuda")
    offs = torch.zeros(experts, dtype=torch.int32, device="cuda")
    out = torch.empty(t, n, dtype=torch.bfloat16, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(7)
    rng = random.Random(7)

    def step():
        a, sfa = quantize_experts(x, offs, scales)
        gg.scaled_grouped_mm(a, w.b, sfa, w.sfb, offs, alpha=scales, out=out)
        return a, sfa

    step()  # warm-up: the validated call before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a_static, sfa_static = step()
    for i in range(10):
        counts = [rng.choice([0, 0, 1, 3, 17]) for _ in range(experts)]
        if i == 1:
            counts = [0] * experts
            counts[experts - 1] = t
        if i == 2:
            counts = [0] * experts
        used = min(sum(counts), t)
        ends = torch.tensor(counts, dtype=torch.int64).cumsum(0).clamp(max=t)
        expert_of = torch.searchsorted(ends, torch.arange(t), right=True).clamp(max=experts - 1)
        row_scale = scales.cpu()[expert_of].cuda()
        xt, packed, plain = tokens(t, k, row_scale, gen)
        x.copy_(xt)
        offs.copy_(ends.to(torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(a_static[:used], packed[:used]), f"routing {i}: codes"
        assert (a_static[used:] == 0).all(), f"routing {i}: rows past offs[-1]"
        want_sfa = to_blocked_grouped(plain.view(torch.uint8), offs)
        assert torch.equal(sfa_static.view(torch.uint8), want_sfa), f"routing {i}: scales"
        start = 0
        for g, end in enumerate(ends.tolist()):
            if end > start:
                ref = reference_grouped_gemm(
                    [packed[start:end]], [w.b[g]], [to_blocked(plain[start:end])], [w.sfb[g]],
                    [(end - start, n, k)], alpha=[float(scales[g])], out_dtype=torch.bfloat16)[0]
                assert torch.equal(out[start:end], ref), f"{e.name} routing {i}: expert {g}"
            start = max(start, end)
        assert torch.isnan(out[used:].float()).all(), f"routing {i}: rows past offs[-1] written"


@pytest.mark.parametrize("path", ["torch", "aot"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_quantize_masked_then_masked_grouped_mm(gg, path, with_mask) -> None:  # noqa: F811
    """with_mask: the quantizer takes the GEMM's masked_m (rows past it skipped, their scales
    0): the valid rows' codes, scales and outputs are those of the unmasked call."""
    from serving_check import Weights

    _, quantize_masked = _quantizers(gg, path)
    e, experts, n, k, bound = _entry(gg, masked=True)
    max_m = min(48, bound or 48)  # within the kernel's max_m, so that it is the one chosen
    w = Weights(experts, n, k, seed=4)
    scales = torch.tensor([2.0 ** -(g % 3) for g in range(experts)], device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(8)
    xt, packed, plain = tokens(experts * max_m, k, scales.repeat_interleave(max_m), gen)
    counts = [min(c, max_m) for c in (0, 1, 48, 13)]
    counts = [counts[g % 4] for g in range(experts)]
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    if with_mask:
        a, sfa = quantize_masked(xt.view(experts, max_m, k), scales, masked_m)
    else:
        a, sfa = quantize_masked(xt.view(experts, max_m, k), scales)
        assert torch.equal(a.view(-1, k // 2), packed)
    out = gg.masked_grouped_mm(a, w.b, sfa, w.sfb, masked_m, alpha=scales)
    torch.cuda.synchronize()
    for g, m in enumerate(counts):
        rows = slice(g * max_m, g * max_m + m)
        want = plain[g * max_m:(g + 1) * max_m].view(torch.uint8).clone()
        if with_mask:
            want[m:] = 0
            assert torch.equal(a[g, :m], packed[rows])
        assert torch.equal(sfa[g].view(torch.uint8), to_blocked(want).view(torch.uint8))
        if m:
            ref = reference_grouped_gemm([packed[rows]], [w.b[g]], [to_blocked(plain[rows])],
                                         [w.sfb[g]], [(m, n, k)], alpha=[float(scales[g])],
                                         out_dtype=torch.bfloat16)[0]
            assert torch.equal(out[g, :m], ref), f"{e.name}: expert {g}"


@pytest.mark.parametrize("path,mode", [("torch", "default"), ("aot", "default"),
                                       ("aot", "reduce-overhead")])
def test_inductor_compiles_a_step_that_quantizes(gg, path, mode) -> None:  # noqa: F811
    """torch.compile's default backend (Inductor, Triton kernels on the GPU) on a function that
    quantizes and does torch work around it: the bits equal eager. Traced through, Inductor's
    Triton compile of the quantizer's float64 and bit operations failed on the H200
    (2026-12-05); the quantizers are opaque ops since. "aot": the artifacts' kernels through
    torch.ops.nvfp4.act_quant_*, also in reduce-overhead mode (CUDA graphs)."""
    quantize_experts, quantize_masked = _quantizers(gg, path)
    if path == "aot":
        import runtime.torch_op as nvfp4_op

        key = nvfp4_op.register(gg, "activations_gpu_test")
        quantize_experts(torch.zeros(2, 256, dtype=torch.bfloat16, device="cuda"),
                         torch.ones(16, dtype=torch.int32, device="cuda"),
                         torch.ones(16, device="cuda"))  # asserts the kernel serves the shapes

        def quantize_experts(x, offs, scales):
            return torch.ops.nvfp4.act_quant_experts(x, offs, scales, key)

        def quantize_masked(x, scales):
            return torch.ops.nvfp4.act_quant_masked(x, scales, key)

    gen = torch.Generator(device="cuda").manual_seed(4)
    experts, k = 16, 256
    x = (torch.randn(100, k, generator=gen, device="cuda") * 3).to(torch.bfloat16)
    offs = torch.tensor([6 * g + 3 for g in range(experts)], dtype=torch.int32, device="cuda")
    scales = torch.full((experts,), 0.02, device="cuda")

    def step(x, offs, scales):
        a, sfa = quantize_experts(torch.relu(x) * 2, offs, scales)
        am, sfam = quantize_masked((x[:96] + 1).reshape(experts, 6, k), scales)
        return a, sfa, am, sfam

    compiled = torch.compile(step, fullgraph=True, mode=mode)
    for _ in range(3):  # reduce-overhead records its graph on a later call
        got = [t.clone() for t in compiled(x, offs, scales)]
    # The reference: eager runtime.activations (the torch path), whatever path was compiled.
    want = (*runtime.activations.quantize_experts(torch.relu(x) * 2, offs, scales),
            *runtime.activations.quantize_masked((x[:96] + 1).reshape(experts, 6, k), scales))
    for g, w in zip(got, want):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))
