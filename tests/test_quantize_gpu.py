"""The artifacts' AOT activation quantizers on the GPU (runtime/quantize.py): bit-equal to
runtime.activations' torch path on skewed routings with empty experts and rows past offs[-1],
E up to 1024, K 16..7168, the edge blocks of tests/test_act_quant_kernel.py (ties, near-ties,
saturation, subnormals, NaN / inf, bad decode scales) and bad offs; no device sync. The graph
replay with new routing feeding the GEMMs and the torch ops under torch.compile are in
tests/test_activations_gpu.py (parametrized over both paths).

Skipped without a GPU or without a quantizer for the device's arch in the artifacts.
"""

from __future__ import annotations

import pytest
import torch
from test_act_quant_kernel import edge_blocks
from test_runtime_gpu import gg  # noqa: F401 - the artifacts fixture

import runtime
from runtime import activations
from runtime.quantize import quantizer_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _require(gg: runtime.GroupedGemm, layout: str) -> None:  # noqa: F811
    arch = gg.device_runtime(0).arch
    if gg.store.manifest.quantizer(layout, arch) is None:
        pytest.skip(f"no {layout} quantizer for {arch} in the artifacts")


def _dirty() -> None:
    """Leave non-zero bytes in the caching allocator's free blocks (small and large pools), so
    an sfa byte the kernel fails to write (its padding: it takes sfa uninitialized) shows."""
    for size in (1 << 20, 256 << 20):
        junk = torch.full((size,), 0xAB, dtype=torch.uint8, device="cuda")
        del junk


def _dirty_no_sync(call) -> tuple:
    """call() on a dirtied allocator (_dirty) with any device sync an error."""
    _dirty()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return call()
    finally:
        torch.cuda.set_sync_debug_mode(0)


def _same(got: tuple, want: tuple, what: str) -> None:
    for name, g, w in zip(("codes", "scales"), got, want):
        bad = int((g.view(torch.uint8) != w.view(torch.uint8)).sum())
        assert g.shape == w.shape and bad == 0, f"{what}: {bad} {name} bytes differ"


def _routing(experts: int, tokens: int, skew: bool, gen: torch.Generator) -> torch.Tensor:
    weights = (torch.arange(experts, 0, -1).float() ** 3 if skew else torch.ones(experts))
    counts = torch.multinomial(weights, tokens, replacement=True,
                               generator=gen).bincount(minlength=experts)
    counts[::7] = 0  # empty experts
    return counts.cumsum(0).to(torch.int32)


EXPERTS_CASES = [(1, 16, 37, False), (8, 48, 300, False), (128, 2048, 512, True),
                 (256, 7168, 64, True), (32, 2048, 4096, False), (128, 768, 1, False),
                 (1000, 64, 3000, True), (1024, 32, 20000, False)]


@pytest.mark.parametrize("experts,k,tokens,skew", EXPERTS_CASES,
                         ids=[f"E{e}-K{k}-T{t}" for e, k, t, _ in EXPERTS_CASES])
def test_the_experts_kernel_gives_the_torch_bits_and_never_syncs(gg, experts, k, tokens,  # noqa: F811
                                                                 skew) -> None:
    _require(gg, "experts")
    gen = torch.Generator().manual_seed(experts + k)
    offs = _routing(experts, tokens, skew, gen).cuda()
    t = int(offs[-1]) + 5  # rows past offs[-1]
    scales = (torch.rand(experts, generator=gen) * 0.05 + 1e-4).cuda()
    for mag in (1e-3, 1.0, 1e3):
        x = (torch.randn(t, k, generator=gen) * mag).to(torch.bfloat16).cuda()
        assert quantizer_for(gg, "experts", x, experts) is not None
        got = _dirty_no_sync(lambda: gg.quantize_experts(x, offs, scales))
        _same(got, activations.quantize_experts(x, offs, scales), f"x ~ {mag:g}")


def test_edge_blocks_and_bad_offs_give_the_torch_bits(gg) -> None:  # noqa: F811
    _require(gg, "experts")
    _require(gg, "masked")
    for seed in range(3):
        blocks, gs = edge_blocks(seed)  # one expert of one row per block, K = 16
        blocks, gs = blocks.cuda(), gs.cuda()
        for i in range(0, len(blocks), 1024):
            part = blocks[i:i + 1024]
            offs = torch.arange(1, len(part) + 1, dtype=torch.int32, device="cuda")
            assert quantizer_for(gg, "experts", part, len(part)) is not None
            _dirty()
            _same(gg.quantize_experts(part, offs, gs[i:i + 1024]),
                  activations.quantize_experts(part, offs, gs[i:i + 1024]),
                  f"edge blocks seed {seed} rows {i}+")
        assert quantizer_for(gg, "masked", blocks.view(-1, 1, 16), len(blocks)) is not None
        _dirty()
        _same(gg.quantize_masked(blocks.view(-1, 1, 16), gs),
              activations.quantize_masked(blocks.view(-1, 1, 16), gs), f"masked seed {seed}")
    gen = torch.Generator().manual_seed(9)
    # Negative, decreasing and past-T ends across the table scan's thread boundaries.
    for offs in (torch.tensor([10, 5, 900, 3], dtype=torch.int32),
                 torch.randint(-50, 700, (777,), generator=gen, dtype=torch.int32)):
        x = torch.randn(600, 48, generator=gen).bfloat16().cuda()
        offs = offs.cuda()
        scales = torch.full((offs.numel(),), 0.02, device="cuda")
        _dirty()
        _same(gg.quantize_experts(x, offs, scales),
              activations.quantize_experts(x, offs, scales), f"bad offs E {offs.numel()}")


@pytest.mark.parametrize("experts,max_m,k", [(1, 1, 16), (8, 48, 2048), (32, 129, 7168),
                                             (256, 16, 768)])
def test_the_masked_kernel_gives_the_torch_bits(gg, experts, max_m, k) -> None:  # noqa: F811
    _require(gg, "masked")
    gen = torch.Generator().manual_seed(experts)
    scales = (torch.rand(experts, generator=gen) * 0.05 + 1e-4).cuda()
    x = (torch.randn(experts, max_m, k, generator=gen) * 3).to(torch.bfloat16).cuda()
    assert quantizer_for(gg, "masked", x, experts) is not None
    got = _dirty_no_sync(lambda: gg.quantize_masked(x, scales))
    _same(got, activations.quantize_masked(x, scales), f"E {experts} max_m {max_m} K {k}")


def _same_masked(got: tuple, want: tuple, mask: torch.Tensor, what: str) -> None:
    """sfa whole; a on the valid rows only (the kernel leaves the others unwritten)."""
    _same(got[1:], want[1:], what)
    for e, m in enumerate(mask.clamp(0, got[0].shape[1]).tolist()):
        bad = int((got[0][e, :m] != want[0][e, :m]).sum())
        assert bad == 0, f"{what}: expert {e}: {bad} code bytes differ"


@pytest.mark.parametrize("experts,max_m,k", [(8, 48, 2048), (32, 1024, 7168), (256, 16, 768),
                                             (37, 20, 256), (1024, 4, 64)])
def test_masked_m_skips_the_masked_rows_with_the_torch_bits(gg, experts, max_m,  # noqa: F811
                                                            k) -> None:
    """With masked_m (DeepEP low-latency's (32, 1024, 7168) among the cases; E 37 and 1024 for
    the table's partial and full thread groups): the valid rows' codes and every scale byte as
    the torch path (masked rows' scales 0), no sync, and one captured graph replayed with new
    masked_m (the grid-stride plan is fixed at capture)."""
    _require(gg, "masked")
    gen = torch.Generator().manual_seed(experts + max_m)
    scales = (torch.rand(experts, generator=gen) * 0.05 + 1e-4).cuda()
    x = (torch.randn(experts, max_m, k, generator=gen) * 3).to(torch.bfloat16).cuda()
    masks = [torch.randint(0, 40, (experts,), generator=gen, dtype=torch.int32),
             torch.randint(-5, max_m + 5, (experts,), generator=gen, dtype=torch.int32),
             torch.zeros(experts, dtype=torch.int32)]
    masks[0][0] = max_m
    mask = masks[0].cuda()
    assert quantizer_for(gg, "masked", x, experts, masked=True) is not None
    got = _dirty_no_sync(lambda: gg.quantize_masked(x, scales, mask))
    _same_masked(got, activations.quantize_masked(x, scales, mask), mask, "eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = gg.quantize_masked(x, scales, mask)
    for i, m in enumerate(masks):
        mask.copy_(m)
        _dirty()
        graph.replay()
        torch.cuda.synchronize()
        _same_masked(got, activations.quantize_masked(x, scales, mask), mask, f"replay {i}")


def test_a_first_call_inside_a_graph_capture_loads_the_kernel_and_replays_exact() -> None:
    """No eager warm-up: a fresh GroupedGemm's first quantize is captured, so the quantizer's
    library load happens under a global-mode capture (it must be allowed, as for the GEMMs);
    the replay gives the torch path's bits, for new tokens written into the same buffers."""
    from test_runtime_gpu import ARTIFACTS

    if not (ARTIFACTS / "manifest.json").is_file():
        pytest.skip(f"no artifacts at {ARTIFACTS}")
    fresh = runtime.load(ARTIFACTS)
    _require(fresh, "experts")
    _require(fresh, "masked")
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.zeros(300, 512, dtype=torch.bfloat16, device="cuda")
    offs = torch.tensor([0, 40, 40, 290], dtype=torch.int32, device="cuda")
    scales = torch.full((4,), 0.03, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = (*fresh.quantize_experts(x, offs, scales),
               *fresh.quantize_masked(x[:256].view(4, 64, 512), scales))
    for _ in range(2):
        x.copy_((torch.randn(300, 512, generator=gen, device="cuda") * 4).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        _same(got[:2], activations.quantize_experts(x, offs, scales), "captured experts")
        _same(got[2:], activations.quantize_masked(x[:256].view(4, 64, 512), scales),
              "captured masked")
