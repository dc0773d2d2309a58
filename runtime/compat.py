"""`torch.nn.functional.scaled_grouped_mm`'s NVFP4 form, on Hopper: swap one import.

    from runtime.compat import scaled_grouped_mm      # instead of torch.nn.functional's
    out = scaled_grouped_mm(mat_a, mat_b, [sfa, global_a], [BlockWise1x16, TensorWise],
                            [sfb, global_b], [BlockWise1x16, TensorWise],
                            swizzle_a=SWIZZLE_32_4_4, swizzle_b=SWIZZLE_32_4_4, offs=offs,
                            output_dtype=torch.bfloat16)

The signature is torch's (torch 2.13). The accepted form is torch's NVFP4 2D x 3D MoE call:
mat_a (T, K/2) float4_e2m1fn_x2 with rows grouped by expert; mat_b (E, K/2, N), the
`.transpose(-2, -1)` view of contiguous (E, N, K/2) weights; each scale a list [blocked e4m3 block
scales (torch's `to_blocked` layout, SWIZZLE_32_4_4), fp32 global decode scale]; recipes
[BlockWise1x16, TensorWise]; offs (E,) int32 end offsets. The per-expert alpha is global_a *
global_b (global_a a scalar or one per expert, global_b one per expert), computed on the device.
It runs through `GroupedGemm.scaled_grouped_mm` (runtime/serving.py) with the artifacts that
`runtime.torch_op` serves under its "default" key (`use(gg)` sets them). Anything else (other
recipes, bias, contraction_dim, no offs) raises InputError, naming torch's own function for it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.functional import ScalingType, SwizzleType

from .errors import InputError

__all__ = ["scaled_grouped_mm", "use"]

NVFP4_RECIPE = [ScalingType.BlockWise1x16, ScalingType.TensorWise]
_RUNTIME_NAMES = ("in runtime.compat.scaled_grouped_mm: a is mat_a, b is mat_b.transpose(-2, -1), "
                  "sfa is scale_a[0], sfb is scale_b[0], alpha is scale_a[1] * scale_b[1], "
                  "out_dtype is output_dtype")
_gg: Any = None


def use(gg: Any) -> None:
    """Serve calls with this GroupedGemm (else: runtime.torch_op's "default" key)."""
    global _gg
    _gg = gg


def _serving() -> Any:
    if _gg is not None:
        return _gg
    from .torch_op import lookup

    return lookup()


def _pair(name: str, scale: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if (not isinstance(scale, (list, tuple)) or len(scale) != 2
            or not all(isinstance(s, torch.Tensor) for s in scale)):
        raise InputError(f"{name} must be [blocked e4m3 block scales, fp32 global scale] "
                         f"(torch's NVFP4 form), but got {_describe(scale)}")
    return scale[0], scale[1]


def _describe(x: Any) -> str:
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_describe(v) for v in x) + "]"
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return repr(x)


def _names(values: list) -> str:
    """[ScalingType.RowWise, ...] as torch's users write them (its enum classes are private)."""
    return "[" + ", ".join(f"{type(v).__name__.lstrip('_')}.{v.name}" if hasattr(v, "name")
                           else repr(v) for v in values) + "]"


def _recipe(name: str, recipe: Any) -> None:
    got = list(recipe) if isinstance(recipe, (list, tuple)) else [recipe]
    if got != NVFP4_RECIPE:
        raise InputError(f"{name} must be [ScalingType.BlockWise1x16, ScalingType.TensorWise] "
                         f"(NVFP4), but got {_names(got)}; for other recipes call "
                         f"torch.nn.functional.scaled_grouped_mm")


def _swizzle(name: str, swizzle: Any) -> None:
    got = list(swizzle) if isinstance(swizzle, (list, tuple)) else [swizzle]
    if not got or got[0] != SwizzleType.SWIZZLE_32_4_4 or any(
            s not in (SwizzleType.NO_SWIZZLE, None) for s in got[1:]):
        raise InputError(f"{name} must be SwizzleType.SWIZZLE_32_4_4 (the blocked 128x4 scale "
                         f"layout), but got {_names(got)}")


def scaled_grouped_mm(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scale_a: torch.Tensor | list[torch.Tensor],
    scale_recipe_a: ScalingType | list[ScalingType],
    scale_b: torch.Tensor | list[torch.Tensor],
    scale_recipe_b: ScalingType | list[ScalingType],
    swizzle_a: SwizzleType | list[SwizzleType] | None = None,
    swizzle_b: SwizzleType | list[SwizzleType] | None = None,
    bias: torch.Tensor | None = None,
    offs: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = torch.bfloat16,
    contraction_dim: list[int] | tuple[int, ...] = (),
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """torch.nn.functional.scaled_grouped_mm for NVFP4 2D x 3D on the AOT kernels (module
    docstring). use_fast_accum is accepted and has no effect: accumulation is always fp32."""
    _recipe("scale_recipe_a", scale_recipe_a)
    _recipe("scale_recipe_b", scale_recipe_b)
    _swizzle("swizzle_a", swizzle_a)
    _swizzle("swizzle_b", swizzle_b)
    if bias is not None:
        raise InputError("bias must be None (not supported by the NVFP4 kernels), but got a "
                         "tensor")
    if tuple(contraction_dim):
        raise InputError(f"contraction_dim must be () (K is the last dim of mat_a and the "
                         f"middle dim of mat_b), but got {tuple(contraction_dim)}")
    if offs is None:
        raise InputError("offs must be the (E,) int32 end offsets of the 2D x 3D MoE form, but "
                         "got None")
    if not isinstance(mat_b, torch.Tensor) or mat_b.dim() != 3:
        raise InputError(f"mat_b must be (E, K/2, N) (the transpose(-2, -1) view of (E, N, "
                         f"K/2) weights), but got {_describe(mat_b)}")
    if isinstance(mat_a, torch.Tensor) and mat_a.dim() == 2 and mat_b.shape[1] != mat_a.shape[1]:
        raise InputError(f"mat_b must be (E, K/2, N) with mat_a's K/2 = {mat_a.shape[1]} in "
                         f"dim 1, but got shape {tuple(mat_b.shape)}")
    sfa, global_a = _pair("scale_a", scale_a)
    sfb, global_b = _pair("scale_b", scale_b)
    experts = mat_b.shape[0]
    for name, g in (("scale_a[1]", global_a), ("scale_b[1]", global_b)):
        if g.dtype != torch.float32 or g.numel() not in (1, experts):
            raise InputError(f"{name} must be a float32 global scale, one value or one per "
                             f"expert ({experts}), but got {_describe(g)}")
        if isinstance(mat_a, torch.Tensor) and g.device != mat_a.device:
            # The kernel reads alpha = global_a * global_b on the device, never on the host.
            raise InputError(f"{name} must be on mat_a's device {mat_a.device}, but got a "
                             f"tensor on {g.device}")
    b = mat_b.transpose(-2, -1)
    if not b.is_contiguous():
        raise InputError(f"mat_b must be the transpose(-2, -1) view of contiguous (E, N, K/2) "
                         f"weights, but its strides are {mat_b.stride()}")
    alpha = (global_a.reshape(-1) * global_b.reshape(-1)).expand(experts).contiguous()
    try:
        return _serving().scaled_grouped_mm(
            mat_a, b, sfa, sfb, offs, alpha=alpha,
            out_dtype=torch.bfloat16 if output_dtype is None else output_dtype)
    except InputError as err:
        # The runtime's checks name its own arguments: say which of the caller's they are.
        raise InputError(f"{err} ({_RUNTIME_NAMES})") from None
