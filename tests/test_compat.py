"""runtime.compat.scaled_grouped_mm: torch's NVFP4 2D x 3D call mapped onto
GroupedGemm.scaled_grouped_mm (a recording stand-in here; scripts/serving_check.py runs the real
one), and every form it refuses."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.nn.functional import ScalingType, SwizzleType

from runtime import compat
from runtime.errors import InputError

E, N, K, T = 4, 256, 512, 64
NVFP4 = [ScalingType.BlockWise1x16, ScalingType.TensorWise]
SW = SwizzleType.SWIZZLE_32_4_4


class Recording:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def scaled_grouped_mm(self, a, b, sfa, sfb, offs, *, alpha=None, out=None,
                          out_dtype=torch.bfloat16):
        self.calls.append(dict(a=a, b=b, sfa=sfa, sfb=sfb, offs=offs, alpha=alpha,
                               out_dtype=out_dtype))
        return "out"


@pytest.fixture()
def rec():
    r = Recording()
    compat.use(r)
    yield r
    compat.use(None)


def args():
    weights = torch.zeros(E, N, K // 2, dtype=torch.uint8)
    return dict(mat_a=torch.zeros(T, K // 2, dtype=torch.uint8),
                mat_b=weights.transpose(-2, -1),
                scale_a=[torch.zeros(10, dtype=torch.uint8), torch.tensor(0.5)],
                scale_recipe_a=NVFP4,
                scale_b=[torch.zeros(E, 8, dtype=torch.uint8),
                         torch.tensor([1.0, 2.0, 4.0, 8.0])],
                scale_recipe_b=NVFP4, swizzle_a=SW, swizzle_b=SW,
                offs=torch.zeros(E, dtype=torch.int32))


def test_signature_is_torchs() -> None:
    assert (inspect.signature(compat.scaled_grouped_mm).parameters.keys()
            == inspect.signature(torch.nn.functional.scaled_grouped_mm).parameters.keys())


def test_nvfp4_call_maps_onto_the_serving_api(rec) -> None:
    a = args()
    assert compat.scaled_grouped_mm(**a, output_dtype=torch.float16) == "out"
    (call,) = rec.calls
    assert call["a"] is a["mat_a"] and call["offs"] is a["offs"]
    assert call["b"].shape == (E, N, K // 2) and call["b"].is_contiguous()
    assert call["sfa"] is a["scale_a"][0] and call["sfb"] is a["scale_b"][0]
    assert call["alpha"].tolist() == [0.5, 1.0, 2.0, 4.0]  # global_a * global_b per expert
    assert call["alpha"].dtype == torch.float32 and call["out_dtype"] == torch.float16


@pytest.mark.parametrize("edit,message", [
    (dict(scale_recipe_a=[ScalingType.RowWise]),
     "scale_recipe_a must be [ScalingType.BlockWise1x16, ScalingType.TensorWise] (NVFP4), but "
     "got [ScalingType.RowWise]; for other recipes call "
     "torch.nn.functional.scaled_grouped_mm"),
    (dict(swizzle_b=SwizzleType.NO_SWIZZLE),
     "swizzle_b must be SwizzleType.SWIZZLE_32_4_4 (the blocked 128x4 scale layout), but got "
     "[SwizzleType.NO_SWIZZLE]"),
    (dict(bias=torch.zeros(N)), "bias must be None (not supported by the NVFP4 kernels), but "
                                "got a tensor"),
    (dict(offs=None), "offs must be the (E,) int32 end offsets of the 2D x 3D MoE form, but got "
                      "None"),
    (dict(contraction_dim=(1,)), "contraction_dim must be () (K is the last dim of mat_a and "
                                 "the middle dim of mat_b), but got (1,)"),
    (dict(scale_a=torch.zeros(3)), "scale_a must be [blocked e4m3 block scales, fp32 global "
                                   "scale] (torch's NVFP4 form), but got a torch.float32 tensor "
                                   "of shape (3,)"),
    (dict(scale_b=[torch.zeros(8, dtype=torch.uint8), torch.ones(3)]),
     "scale_b[1] must be a float32 global scale, one value or one per expert (4), but got a "
     "torch.float32 tensor of shape (3,)"),
    (dict(mat_b=torch.zeros(E, K // 2, N, dtype=torch.uint8)),
     "mat_b must be the transpose(-2, -1) view of contiguous (E, N, K/2) weights, but its "
     f"strides are ({K // 2 * N}, {N}, 1)"),
    (dict(mat_b=torch.zeros(E, N, K // 4, dtype=torch.uint8).transpose(-2, -1)),
     f"mat_b must be (E, K/2, N) with mat_a's K/2 = {K // 2} in dim 1, but got shape "
     f"({E}, {K // 4}, {N})"),
    # A global scale elsewhere than mat_a (here the meta device; on a GPU, a CPU scalar).
    (dict(scale_a=[torch.zeros(10, dtype=torch.uint8), torch.tensor(0.5, device="meta")]),
     "scale_a[1] must be on mat_a's device cpu, but got a tensor on meta"),
])
def test_other_forms_are_refused(rec, edit, message) -> None:
    with pytest.raises(InputError) as info:
        compat.scaled_grouped_mm(**{**args(), **edit})
    assert str(info.value) == message
    assert rec.calls == []


def test_the_runtimes_errors_say_which_argument_of_the_callers_they_name() -> None:
    class Refusing:
        def scaled_grouped_mm(self, *args, **kwargs):
            raise InputError("sfa must have at least 1024 elements, but got 10")

    compat.use(Refusing())
    try:
        with pytest.raises(InputError) as info:
            compat.scaled_grouped_mm(**args())
    finally:
        compat.use(None)
    assert str(info.value) == (
        "sfa must have at least 1024 elements, but got 10 (in runtime.compat.scaled_grouped_mm: "
        "a is mat_a, b is mat_b.transpose(-2, -1), sfa is scale_a[0], sfb is scale_b[0], alpha "
        "is scale_a[1] * scale_b[1], out_dtype is output_dtype)")
