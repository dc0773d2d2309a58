"""Repeated identical calls give identical, exact results (a race shows as a call that differs).

The weight ring's release race (docs/lab_notebook.md, twenty-second session) gave a few wrong
columns in about 1 call in 40 of the Qwen3-235B E128 gate-up decode kernel with inline_a, and
never a wrong result in a single call of the other GPU tests. This repeats one routing 300
times through the kernel scaled_grouped_mm picks for it and requires every expert result of
every call to equal the float64 reference: with the race (the artifacts of that session's runs
1-2) 5 of the 300 calls failed on the H200.

Skipped without a GPU, without artifacts ($NVFP4_ARTIFACTS, default <repo>/artifacts) or without
a bf16 serving kernel for that layer on this GPU.
"""

from __future__ import annotations

import random
import sys

import pytest
import torch
from test_runtime_gpu import ARTIFACTS, REPO, gg  # noqa: F401 - gg: the artifacts fixture

import runtime
from runtime.errors import NoKernelError
from runtime.serving import select_serving

sys.path.insert(0, str(REPO / "scripts"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# Qwen3-235B-A22B gate-up at 500 tokens routed over 128 experts: experts of 17-29 rows, two
# tile_m-16 m-tiles whose CTAs load the same weight tiles together (where the race showed).
E, N, K, T = 128, 3072, 4096, 500
CALLS = 300


def test_repeated_calls_on_one_routing_are_all_exact(gg: runtime.GroupedGemm) -> None:  # noqa: F811
    from serving_check import Layer, Weights, repeated_calls, routing

    arch = gg.device_runtime(0).arch
    try:
        entry = select_serving(gg.kernels, arch, E, N, K, T, "bfloat16")
    except NoKernelError:
        pytest.skip(f"no bf16 serving kernel for {E} x ({N}, {K}) in {ARTIFACTS} ({arch})")
    layer = Layer(Weights(E, N, K), T)
    layer.load(routing(random.Random(7), T, E, "skewed"), seed=100)
    wrong = [(i, g, m) for i, g, m, *_ in repeated_calls(gg, layer, CALLS)]
    assert not wrong, (f"{entry.name}: {len(wrong)} wrong expert results in {CALLS} calls "
                       f"(call, expert, m): {wrong[:10]}")
