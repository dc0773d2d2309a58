"""NVFP4 quantization of MoE activations for the two serving layouts, reading no value on the
host: no device sync, so it runs inside a captured CUDA graph whose routing changes every replay.

    a, sfa = quantize_experts(x, offs, input_scale)  # for gg.scaled_grouped_mm(.., offs)
    a, sfa = quantize_masked(x, input_scale, masked_m)  # for gg.masked_grouped_mm(.., masked_m)

`input_scale` holds the experts' DECODE scales (ModelOpt's `input_scale`, runtime/nvfp4.py's
convention): rows of expert g are block-quantized as x / input_scale[g], so that
x ~= input_scale[g] * dequant(a, sfa), and the GEMM's alpha[g] = input_scale[g] *
weight_scale_2[g]. The arithmetic is `quantize_nvfp4`'s, bit for bit (float64 rounding
decisions), applied with each row's own expert scale: the same codes and scales as
`quantize_activation` on each expert's rows alone.

What the host cannot check without a sync is poisoned instead of refused: a block holding a NaN
or an infinity gets a NaN block scale, and so does every block of an expert whose input_scale is
not positive and finite, so the rows they feed come out NaN rather than silently wrong.

These are torch operations (a few dozen small kernels, float64 temporaries in chunks of
_CHUNK_ELEMENTS), a correct path for engines on Hopper, where no NVFP4 quantization kernel
exists; they are not a fast kernel.
"""

from __future__ import annotations

import math
import numbers
import struct
from typing import Any

import torch
from torch import Tensor

from .errors import InputError
from .formats import SF_VEC, blocked_scale_numel, scale_cols, sfa_rows_needed
from .nvfp4 import (
    _blocked_bytes,
    _blocked_grouped,
    _check_k,
    _pack_codes,
    _quantize_codes,
    _row_experts,
)

__all__ = ["quantize_experts", "quantize_masked"]

_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Elements per quantization chunk: about 50 bytes of float64 and int64 temporaries each, so a
# chunk peaks near 400 MiB whatever T is (a prefill call of 16,384 x 7,168 is 117 M elements).
_CHUNK_ELEMENTS = 1 << 23


def _check_x(x: Any, dims: int, shape_text: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise InputError(f"x must be a torch.Tensor, but got {type(x).__name__}")
    if x.dtype not in _X_DTYPES:
        raise InputError(f"x must be bfloat16, float16 or float32, but got {x.dtype}")
    if x.dim() != dims:
        raise InputError(f"x must be {dims}-D {shape_text}, but got shape {tuple(x.shape)}")
    _check_k(x.shape[-1])
    return x


def _check_scales(input_scale: Any, experts: int,
                  device: torch.device) -> float | torch.Tensor:
    """input_scale checked without reading a device value: one real number, rounded to
    float32 on the host (as quantize_activation does, and as the GEMM's fp32 alpha holds it)
    and checked there, returned as a Python float; or a float32 (E,) tensor on x's device,
    returned as is (the quantizers poison the experts of its bad scales, module docstring)."""
    if isinstance(input_scale, numbers.Real) and not isinstance(input_scale, bool):
        try:
            value = struct.unpack("f", struct.pack("f", float(input_scale)))[0]
        except OverflowError:  # past float32's range (struct refuses to round it to inf)
            value = math.inf
        if not (value > 0 and math.isfinite(value)):
            raise InputError(f"input_scale must be positive and finite in float32, but got "
                             f"{repr(input_scale)[:40]} (float32: {value!r})")
        return value
    if not isinstance(input_scale, torch.Tensor):
        raise InputError(f"input_scale must be a float32 torch.Tensor (E,) or a real number, "
                         f"but got {type(input_scale).__name__}")
    if input_scale.dtype != torch.float32:
        raise InputError(f"input_scale must be float32, but got {input_scale.dtype}")
    if tuple(input_scale.shape) != (experts,):
        raise InputError(f"input_scale must have shape (E,) = ({experts},), but got "
                         f"{tuple(input_scale.shape)} (one scale for all: .expand({experts}))")
    if input_scale.device != device:
        raise InputError(f"input_scale must be on x's device {device}, but got "
                         f"{input_scale.device}")
    return input_scale


def _decode_scales(input_scale: Any, experts: int, device: torch.device) -> torch.Tensor:
    """input_scale (checked by _check_scales) as the float64 (E,) tensor of the torch path,
    its scales that are not positive and finite made NaN."""
    checked = _check_scales(input_scale, experts, device)
    if isinstance(checked, float):
        return torch.full((experts,), checked, dtype=torch.float64, device=device)
    s = checked.to(torch.float64)
    return torch.where((s > 0) & torch.isfinite(s), s, math.nan)


def _check_offs(offs: Any, device: torch.device) -> torch.Tensor:
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32:
        # int32 only: offs goes on to scaled_grouped_mm, which takes nothing else.
        raise InputError(f"offs must be an int32 torch.Tensor, but got "
                         f"{offs.dtype if isinstance(offs, torch.Tensor) else type(offs).__name__}")
    if offs.dim() != 1 or offs.numel() == 0:
        raise InputError(f"offs must be 1-D (E,) with E > 0, but got shape {tuple(offs.shape)}")
    if offs.device != device:
        raise InputError(f"offs must be on x's device {device}, but got {offs.device}")
    return offs


def _check_masked_x(x: Any) -> torch.Tensor:
    x = _check_x(x, 3, "(E, max_m, K)")
    if x.shape[0] == 0:
        raise InputError("x must have at least one expert, but got E = 0")
    return x


def _check_masked_m(masked_m: Any, experts: int, device: torch.device) -> torch.Tensor | None:
    """None, or masked_m as masked_grouped_mm takes it: int32 (E,) on x's device."""
    if masked_m is None:
        return None
    if not isinstance(masked_m, torch.Tensor) or masked_m.dtype != torch.int32:
        got = masked_m.dtype if isinstance(masked_m, torch.Tensor) else type(masked_m).__name__
        raise InputError(f"masked_m must be None or an int32 torch.Tensor, but got {got}")
    if tuple(masked_m.shape) != (experts,):
        raise InputError(f"masked_m must have shape ({experts},) (one row count per expert of "
                         f"x), but got {tuple(masked_m.shape)}")
    if masked_m.device != device:
        raise InputError(f"masked_m must be on x's device {device}, but got {masked_m.device}")
    return masked_m


def _quantize_rows(x: torch.Tensor, row_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, K) with a float64 decode scale per row (rows,) -> (packed uint8 (rows, K // 2),
    uint8 plain scales (rows, K // 16)), in chunks of rows; non-finite blocks get NaN scales."""
    rows, k = x.shape
    packed = torch.empty((rows, k // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((rows, k // SF_VEC), dtype=torch.uint8, device=x.device)
    step = max(1, _CHUNK_ELEMENTS // k)
    for r in range(0, rows, step):
        part = x[r:r + step]
        codes, scale = _quantize_codes(part, row_scale[r:r + step, None])
        finite = torch.isfinite(part.reshape(part.shape[0], -1, SF_VEC)).all(dim=-1)
        scale = torch.where(finite, scale.view(torch.uint8), 0x7F)  # 0x7F: e4m3fn NaN
        packed[r:r + step] = _pack_codes(codes)
        scales[r:r + step] = scale
    return packed, scales


@torch.no_grad()
def quantize_experts(x: torch.Tensor, offs: torch.Tensor,
                     input_scale: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations x (T, K) whose rows are grouped by expert (expert g owns rows
    offs[g-1] .. offs[g], int32 end offsets on x's device) for `gg.scaled_grouped_mm`:
    returns (a uint8 (T, K // 2), sfa float8_e4m3fn 1-D blocked with each expert's rows padded
    to 128, room for any routing: `to_blocked_grouped`'s layout).

    Row g's decode scale is input_scale[g] (float32 (E,) on x's device, or one real number).
    Rows past offs[-1] belong to no expert: their codes are 0 and their scales are dropped, as
    the kernel ignores them. offs is clamped and made non-decreasing, as the kernels do.
    """
    x = _check_x(x, 2, "(T, K)")
    offs = _check_offs(offs, x.device)
    scales_e = _decode_scales(input_scale, offs.numel(), x.device)
    return torch.ops.nvfp4.quantize_experts(x, offs, scales_e)


@torch.no_grad()
def quantize_masked(x: torch.Tensor, input_scale: torch.Tensor | float,
                    masked_m: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations x (E, max_m, K) in the masked layout for `gg.masked_grouped_mm`:
    returns (a uint8 (E, max_m, K // 2), sfa float8_e4m3fn (E, round_up(max_m, 128) *
    round_up(K / 16, 4)), each expert's scales in the blocked layout). Expert e's rows use
    decode scale input_scale[e] (float32 (E,) on x's device, or one real number).

    masked_m: None (every row is quantized) or the int32 (E,) row counts the GEMM will take
    (never read on the host; each clamped to [0, max_m] as masked_grouped_mm does). Then
    expert e's rows from masked_m[e] on are not quantized: their scales in sfa are 0 and their
    bytes of `a` are unspecified (the AOT kernel neither reads those rows of x nor writes
    them, which is the point under DeepEP low-latency, whose max_m is the worst case)."""
    x = _check_masked_x(x)
    masked_m = _check_masked_m(masked_m, x.shape[0], x.device)
    return torch.ops.nvfp4.quantize_masked(x, _decode_scales(input_scale, x.shape[0], x.device),
                                           masked_m)


# The work is one custom op per layout, opaque to torch.compile: Inductor must not fuse these
# float64 and bit operations into its own kernels (on the H200 its Triton compile of them
# failed, PassManager::run in make_llir, 2026-12-05). Inside a compiled or captured step each
# runs as its own eager torch ops, which read nothing on the host. `scales` is
# _decode_scales' float64 (E,): the checks are done before the op is called.


@torch.library.custom_op("nvfp4::quantize_experts", mutates_args=())
def _quantize_experts_op(x: Tensor, offs: Tensor, scales: Tensor) -> tuple[Tensor, Tensor]:
    experts = offs.numel()
    ends, expert = _row_experts(offs, x.shape[0])
    owned = expert < experts  # rows past offs[-1] have expert == E
    row_scale = torch.where(owned, scales[expert.clamp(max=experts - 1)], 1.0)
    packed, plain = _quantize_rows(x, row_scale)
    packed = torch.where(owned[:, None], packed, 0)
    return packed, _blocked_grouped(plain, ends, expert).view(torch.float8_e4m3fn)


@_quantize_experts_op.register_fake
def _quantize_experts_fake(x: Tensor, offs: Tensor, scales: Tensor) -> tuple[Tensor, Tensor]:
    t, k = x.shape
    return (x.new_empty((t, k // 2), dtype=torch.uint8),
            x.new_empty((sfa_rows_needed(t, offs.shape[0]) * scale_cols(k),),
                        dtype=torch.float8_e4m3fn))


@torch.library.custom_op("nvfp4::quantize_masked", mutates_args=())
def _quantize_masked_op(x: Tensor, scales: Tensor,
                        masked_m: Tensor | None = None) -> tuple[Tensor, Tensor]:
    experts, max_m, k = x.shape
    packed, plain = _quantize_rows(x.reshape(experts * max_m, k),
                                   scales.repeat_interleave(max_m))
    plain = plain.view(experts, max_m, k // SF_VEC)
    packed = packed.view(experts, max_m, k // 2)
    if masked_m is not None:  # rows past masked_m: scales 0 (codes too, unspecified for callers)
        valid = (torch.arange(max_m, device=x.device)[None, :]
                 < masked_m.to(torch.int64).clamp(0, max_m)[:, None])[..., None]
        plain = torch.where(valid, plain, 0)
        packed = torch.where(valid, packed, 0)
    return packed, _blocked_bytes(plain, 0).view(torch.float8_e4m3fn)


@_quantize_masked_op.register_fake
def _quantize_masked_fake(x: Tensor, scales: Tensor,
                          masked_m: Tensor | None = None) -> tuple[Tensor, Tensor]:
    experts, max_m, k = x.shape
    return (x.new_empty((experts, max_m, k // 2), dtype=torch.uint8),
            x.new_empty((experts, blocked_scale_numel(max_m, k)), dtype=torch.float8_e4m3fn))
