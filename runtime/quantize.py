"""The activation quantizers of an artifact directory (manifest `quantizers`; kernels/sm90/
act_quant.py), launched for `gg.quantize_experts` and `gg.quantize_masked`:

    a, sfa = gg.quantize_experts(x, offs, input_scale)   # for gg.scaled_grouped_mm(.., offs)
    a, sfa = gg.quantize_masked(x, input_scale[, masked_m])  # for gg.masked_grouped_mm(..)

The same arguments, results and bits as runtime.activations' functions of those names (their
docstrings hold the contract: decode scales, NaN poisoning, rows past offs[-1]), in one AOT
kernel (its last CTAs write sfa's padding zeros; a quantizer built before 2026-12-07 needs
a memset of sfa first) instead of some 65 torch kernels: 8-22 us at 512 rows against 171-496 us
(H200, bench/RESULTS.md). Nothing is read on the host, so both capture into CUDA
graphs that replay every routing.

The kernel serves a call when the manifest holds a quantizer of the layout for x's device, x
is bfloat16 and the call fits the kernel: at most `max_experts` experts (its tables live in
shared memory), and its 16-element blocks and sfa bytes in Int32. Any other call (float16 or
float32 x, a device or artifacts with no quantizer, a larger call) takes runtime.activations'
torch path, which gives the same bits, slowly; `quantizer_for` says which one a call gets.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from .activations import (
    _check_masked_m,
    _check_masked_x,
    _check_offs,
    _check_scales,
    _check_x,
)
from .activations import quantize_experts as _torch_experts
from .activations import quantize_masked as _torch_masked
from .formats import INT32_LIMIT, SF_VEC, blocked_scale_numel, scale_cols, sfa_rows_needed
from .manifest import Quantizer

__all__ = ["quantize_experts", "quantize_masked", "quantizer_for"]

# The device type the kernels run on (the CPU tests set "cpu" to plan launches without a GPU).
_KERNEL_DEVICE_TYPE = "cuda"


def quantizer_for(gg: Any, layout: str, x: torch.Tensor, experts: int,
                  masked: bool = False) -> Quantizer | None:
    """The quantizer that serves a call of `layout` on x (bf16, on a CUDA device) with
    `experts` experts (`masked`: and a masked_m), or None when the call takes the torch path
    (module docstring)."""
    if x.dtype != torch.bfloat16 or x.device.type != _KERNEL_DEVICE_TYPE:
        return None
    q = gg.store.manifest.quantizer(layout, gg._runtime(x.device.index).arch)
    if q is None or (masked and not _traits(q).takes_mask):
        return None  # a masked kernel built before 2026-12-07 quantizes every row
    return q if fits(q, tuple(x.shape), experts, masked) else None


def fits(q: Quantizer, shape: tuple[int, ...], experts: int, masked: bool = False) -> bool:
    """Whether quantizer q can take x of `shape` ((T, K) or (E, max_m, K)) with `experts`
    experts (`masked`: and a masked_m): its tables hold them (the experts layout's always, the
    masked layout's with masked_m), and it indexes the 16-element blocks, plus the stride of a
    grid-stride kernel (Quantizer.takes_mask: at most one thread per block) or one CTA of
    threads, and sfa's bytes in Int32."""
    # A masked record's max_experts of 0: no table (built before the valid-block walk).
    if (q.layout == "experts" or (masked and q.max_experts)) and experts > q.max_experts:
        return False
    k = shape[-1]
    blocks = math.prod(shape) // SF_VEC
    threads = q.block[0]
    past = -(-blocks // threads) * threads if _traits(q).takes_mask else threads
    sfa_bytes = (sfa_rows_needed(shape[0], experts) * scale_cols(k) if q.layout == "experts"
                 else experts * blocked_scale_numel(shape[1], k))
    return blocks + past < INT32_LIMIT and sfa_bytes < INT32_LIMIT


def _scales32(input_scale: Any, experts: int, device: torch.device) -> torch.Tensor:
    """The kernel's float32 (E,) decode scales: a checked real number filled on the device
    (no host-to-device copy, so capture-safe), or the caller's checked tensor."""
    checked = _check_scales(input_scale, experts, device)
    if isinstance(checked, float):
        return torch.full((experts,), checked, dtype=torch.float32, device=device)
    return checked.contiguous()


def _kernel_input(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel reads it: contiguous, 16-byte aligned (16-byte vector loads)."""
    x = x.contiguous()
    return x if x.data_ptr() % 16 == 0 else x.clone()


# The filling CTAs (each takes an equal run of sfa's 16-byte chunks: any count is correct):
# FILL_CHUNKS_PER_THREAD chunks a thread, at most FILL_CTAS_PER_SM CTAs per SM. Every CTA
# derives the expert tables first, so DeepSeek-V3 gate-up's 14.9 MB sfa at 4 chunks a thread
# (910 CTAs) took 13.2 us where 16 (228 CTAs) took 11.4, while the small sfas of decode calls
# were 1-5 us slower at 16 than at 4 (H100, 2026-12-07, docs/lab_notebook.md).
FILL_CHUNKS_PER_THREAD = 4
FILL_CTAS_PER_SM = 2
# A masked call's quantizing CTAs per SM at most (the kernel is grid-stride, so any count is
# correct): under DeepEP low-latency most of x's rows are masked, and one CTA per 256 blocks
# would launch tens of thousands of CTAs that only find their rows masked.
MASKED_CTAS_PER_SM = 4


class _Traits(NamedTuple):
    fills_sfa: bool  # Quantizer.fills_sfa
    takes_mask: bool  # Quantizer.takes_mask


_TRAITS: dict[int, tuple[Quantizer, _Traits]] = {}


def _traits(q: Quantizer) -> _Traits:
    """q's launch traits, read once per record (each property scans its parameters, about
    0.8 us, and a call asks up to four times: the serving hot path)."""
    hit = _TRAITS.get(id(q))
    if hit is None or hit[0] is not q:
        hit = _TRAITS[id(q)] = (q, _Traits(q.fills_sfa, q.takes_mask))
    return hit[1]


def _new_sfa(fills: bool, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """sfa for the quantizer to write: uninitialized when it writes its padding too (`fills`,
    Quantizer.fills_sfa), else zeroed (one built before writes only the scales of real rows)."""
    new = torch.empty if fills else torch.zeros
    return new(shape, dtype=torch.uint8, device=device)


def _launch(gg: Any, q: Quantizer, x: torch.Tensor, values: dict[str, Any],
            ctas_per_sm: int | None = None) -> None:
    """Launch q over x's 16-element blocks, then (Quantizer.fills_sfa) the CTAs that zero
    sfa's padding; `values` holds the tensors (kept alive here until the launch is enqueued:
    a temporary contiguous copy must not be freed before), ints and None for a null address.
    The quantizing CTAs: one per THREADS blocks, at most `ctas_per_sm` per SM when given (a
    grid-stride kernel, Quantizer.takes_mask, which is told their count)."""
    fills, takes_mask = _traits(q)
    blocks = x.numel() // SF_VEC
    chunks = values["sfa"].numel() // 16
    if not blocks and not (fills and chunks):
        return
    args = {k: v.data_ptr() if isinstance(v, torch.Tensor) else (0 if v is None else v)
            for k, v in values.items()}
    args["blocks"] = blocks
    threads = q.block[0]
    # A CUDA tensor's own ordinal: no device lookup (as scaled_grouped_mm).
    rt = gg._runtime(x.device.index)
    grid = -(-blocks // threads)
    if ctas_per_sm is not None:
        grid = min(grid, rt.device.sm_count * ctas_per_sm)
    if takes_mask:
        args["quant_ctas"] = grid
    if fills:
        args["sfa_chunks"] = chunks
        grid += fill_ctas(chunks, threads, rt.device.sm_count)
    rt.launch_quantizer(q, args, grid)


def fill_ctas(chunks: int, threads: int, sms: int) -> int:
    """The filling CTAs for sfa's `chunks` 16-byte chunks: at least one (it also writes the
    padding of a call with no rows)."""
    return max(1, min(-(-chunks // (threads * FILL_CHUNKS_PER_THREAD)), sms * FILL_CTAS_PER_SM))


@torch.no_grad()
def quantize_experts(gg: Any, x: torch.Tensor, offs: torch.Tensor,
                     input_scale: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """runtime.activations.quantize_experts through gg's quantizer where one serves the call
    (module docstring): (a uint8 (T, K // 2), sfa float8_e4m3fn, 1-D, room for any routing)."""
    x = _check_x(x, 2, "(T, K)")
    offs = _check_offs(offs, x.device)
    experts = offs.numel()
    q = quantizer_for(gg, "experts", x, experts)
    if q is None:
        return _torch_experts(x, offs, input_scale)
    scales = _scales32(input_scale, experts, x.device)
    x = _kernel_input(x)
    t, k = x.shape
    a = torch.empty((t, k // 2), dtype=torch.uint8, device=x.device)
    sfa = _new_sfa(_traits(q).fills_sfa, (sfa_rows_needed(t, experts) * scale_cols(k),),
                   x.device)
    _launch(gg, q, x, {"x": x, "offs": offs.contiguous(), "scales": scales, "a": a, "sfa": sfa,
                       "rows": t, "k": k, "experts": experts})
    return a, sfa.view(torch.float8_e4m3fn)


@torch.no_grad()
def quantize_masked(gg: Any, x: torch.Tensor, input_scale: torch.Tensor | float,
                    masked_m: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """runtime.activations.quantize_masked through gg's quantizer where one serves the call:
    (a uint8 (E, max_m, K // 2), sfa float8_e4m3fn (E, round_up(max_m, 128) *
    round_up(K / 16, 4))); with masked_m, the rows past masked_m[e] are neither read nor
    written (their scales are zeros, their codes unspecified)."""
    x = _check_masked_x(x)
    experts, max_m, k = x.shape
    masked_m = _check_masked_m(masked_m, experts, x.device)
    q = quantizer_for(gg, "masked", x, experts, masked=masked_m is not None)
    if q is None:
        return _torch_masked(x, input_scale, masked_m)
    scales = _scales32(input_scale, experts, x.device)
    x = _kernel_input(x)
    a = torch.empty((experts, max_m, k // 2), dtype=torch.uint8, device=x.device)
    traits = _traits(q)
    sfa = _new_sfa(traits.fills_sfa, (experts, blocked_scale_numel(max_m, k)), x.device)
    values = {"x": x, "scales": scales, "a": a, "sfa": sfa, "max_m": max_m, "k": k,
              "experts": experts}
    if traits.takes_mask:
        values["masked_m"] = None if masked_m is None else masked_m.contiguous()
    _launch(gg, q, x, values, None if masked_m is None else MASKED_CTAS_PER_SM)
    return a, sfa.view(torch.float8_e4m3fn)
