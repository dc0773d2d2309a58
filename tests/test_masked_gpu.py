"""The masked layout on the GPU (issue 27): every masked-layout kernel of this GPU's arch through
gg.masked_grouped_mm, bit for bit against the float64 reference rounded to the output type:
masked_m with empty experts, full experts (masked_m = max_m) and values past max_m (clamped);
rows past masked_m[e] keep their poison; one CUDA graph captured once and replayed with new
masked_m and tokens written into the same buffers. EXACT_DATA values (every fp32 sum exact).

Skipped without a GPU, without artifacts ($NVFP4_ARTIFACTS, default <repo>/artifacts) or
without a masked kernel for this GPU.
"""

from __future__ import annotations

import random
import sys

import pytest
import torch
from test_runtime_gpu import ARTIFACTS, REPO, gg  # noqa: F401 - gg: the artifacts fixture

import runtime
from runtime.dispatch import dynamic_groups
from runtime.formats import blocked_scale_numel
from runtime.nvfp4 import EXACT_DATA, reference_grouped_gemm, to_blocked
from runtime.validate import OUT_TORCH_DTYPES

sys.path.insert(0, str(REPO / "scripts"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_masked_kernels_are_exact_eager_and_in_a_graph(gg: runtime.GroupedGemm) -> None:  # noqa: F811
    from serving_check import Weights, draw_nvfp4

    arch = gg.device_runtime(0).arch
    entries = [e for e in gg.kernels if e.arch == arch and e.takes_masked]
    if not entries:
        pytest.skip(f"no masked-layout kernel for {arch} in {ARTIFACTS}")
    rng = random.Random(27)
    for entry in entries:
        nk, _ = dynamic_groups(entry)
        e, (n, k) = len(nk), nk[0]
        max_m = 48
        dtype = OUT_TORCH_DTYPES[entry.out_dtype]
        w = Weights(e, n, k, seed=3)
        gen = torch.Generator(device="cuda").manual_seed(5)
        a = torch.zeros(e, max_m, k // 2, dtype=torch.uint8, device="cuda")
        sfa = torch.zeros(e, blocked_scale_numel(max_m, k), dtype=torch.uint8, device="cuda")
        masked_m = torch.zeros(e, dtype=torch.int32, device="cuda")
        out = torch.empty(e, max_m, n, dtype=dtype, device="cuda")
        alpha_vals = [2.0 ** (g % 3 - 1) for g in range(e)]
        alpha = torch.tensor(alpha_vals, device="cuda")

        def load(counts: list[int]) -> None:
            x, s = draw_nvfp4(e * max_m, k, gen, EXACT_DATA["scale_exp"])
            a.copy_(x.view(e, max_m, k // 2))
            for g in range(e):
                sfa[g] = to_blocked(s.view(torch.uint8)[g * max_m:(g + 1) * max_m])
            masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
            out.fill_(float("nan"))

        def check(counts: list[int], what: str) -> None:
            torch.cuda.synchronize()
            for g, m in enumerate(counts):
                m = min(max(m, 0), max_m)
                if m:
                    ref = reference_grouped_gemm(
                        [a[g, :m]], [w.b[g]], [sfa[g][:blocked_scale_numel(m, k)]], [w.sfb[g]],
                        [(m, n, k)], alpha=[alpha_vals[g]], out_dtype=dtype)[0]
                    assert torch.equal(out[g, :m], ref), f"{entry.name} {what}: expert {g}"
                assert torch.isnan(out[g, m:].float()).all(), \
                    f"{entry.name} {what}: expert {g} rows past masked_m written"

        def counts_for(i: int) -> list[int]:
            c = [rng.choice([0, 1, 7, 31, max_m]) for _ in range(e)]
            if i == 1:
                c[0] = max_m + 100  # clamped to max_m
            return c

        for i in range(3):
            c = counts_for(i)
            load(c)
            gg.masked_grouped_mm(a, b=w.b, sfa=sfa, sfb=w.sfb, masked_m=masked_m,
                                 expected_m=8, alpha=alpha, out=out)
            check(c, f"eager {i}")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gg.masked_grouped_mm(a, w.b, sfa, w.sfb, masked_m, expected_m=8, alpha=alpha,
                                 out=out)
        for i in range(3):
            c = counts_for(i + 3)
            load(c)
            graph.replay()
            check(c, f"replay {i}")
