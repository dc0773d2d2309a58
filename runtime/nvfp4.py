"""NVFP4 format helpers: packing, the blocked scale layout, quantization, inputs and a reference.

Everything here is plain torch + stdlib so that tests and benchmarks can build inputs and check
kernel outputs on any machine (CPU in CI, CUDA on the GPU host) without the CuTe DSL. The format
and the scale layout are those of `shared/facts.md`:

- an NVFP4 tensor of logical shape (rows, K) is stored as uint8 (rows, K // 2): element 2j in
  the LOW nibble of byte j, element 2j + 1 in the HIGH nibble (`torch.float4_e2m1fn_x2` order);
- every 16 consecutive K elements share one fp8 e4m3 scale: the plain scale layout is
  (rows, K // 16); kernels take the blocked layout of `to_blocked` instead.

Exactness: an e2m1 value times an e4m3 scale has at most 5 significant bits, so dequantized
values are exact in float32 (and bf16/fp16), and the float64 reference below is exact for every
shape of the benchmark (see `reference_grouped_gemm`).

Global scales and alpha: "decode scale, multiplied"
---------------------------------------------------
Every global scale in this module is a DECODE scale: real ~= e2m1 * block_scale * global_scale.
The kernels take one float32 `alpha[g]` per group and multiply the group's fp32 accumulator
by it before rounding to bf16/fp16 (`gg.grouped_gemm(..., alpha=alpha)`), so

    alpha[g] = global_a[g] * global_b[g]     (the product of the two decode scales, in fp32)

- PyTorch `torch.nn.functional.scaled_grouped_mm`, NVFP4 recipe `[BlockWise1x16, TensorWise]`:
  `scale_a = [blocked e4m3 scales, fp32 global_a]`, same for b; the global scales are decode
  scales and its epilogue multiplies by `global_a * global_b` per group: the same convention.
- NVIDIA ModelOpt checkpoints: `weight_scale_2` (= amax_w / (6 * 448)) and `input_scale`
  (= amax_x / (6 * 448)) are decode scales, so alpha = input_scale * weight_scale_2 per expert,
  and activations are quantized with the ENCODE scale 1 / input_scale (x / input_scale is
  block-quantized): see `from_modelopt`, `from_modelopt_experts`, `quantize_activation`.
- compressed-tensors checkpoints store the reciprocals, encode scales:
  `weight_global_scale` = 1 / weight_scale_2 (and `input_global_scale` = 1 / input_scale).
  Invert them first: alpha = 1 / (input_global_scale * weight_global_scale).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import InputError
from .formats import SF_VEC, sfa_rows_needed
from .formats import blocked_scale_numel as _blocked_scale_numel

__all__ = [
    "E2M1_VALUES",
    "E4M3_MAX",
    "SF_VEC",
    "GroupedProblem",
    "ModelOptExperts",
    "QuantizedGroups",
    "apply_alpha",
    "as_uint8",
    "blocked_scale_numel",
    "blocked_scale_offset",
    "check_close",
    "dequantize_nvfp4",
    "fp4_to_float",
    "from_blocked",
    "from_modelopt",
    "from_modelopt_experts",
    "global_scale_for",
    "make_grouped_problem",
    "pack_fp4",
    "quantize_activation",
    "quantize_grouped",
    "quantize_nvfp4",
    "random_nvfp4",
    "reference_grouped_gemm",
    "to_blocked",
    "unpack_fp4",
]

# Value of each 4-bit e2m1 code. Codes 0..7 are the magnitudes, bit 3 is the sign; code 8 is -0.0.
E2M1_VALUES: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)  # fmt: skip
E2M1_MAX = 6.0
# Largest finite float8_e4m3fn value: block scales saturate here instead of becoming NaN.
E4M3_MAX = 448.0

# Rounding boundaries between consecutive e2m1 magnitudes (midpoints of the grid).
_E2M1_MIDPOINTS: tuple[float, ...] = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
# Codes of the "benchmark" value set {0, +-0.5, +-1, +-1.5} of the public benchmark.
_BENCHMARK_CODES: tuple[int, ...] = (0, 1, 2, 3, 9, 10, 11)
# Exponent range whose powers of two are exact e4m3 values (2^-9 subnormal .. 2^8 = 256).
_E4M3_POW2_EXP = (-9, 8)

_FP4_DTYPE: torch.dtype | None = getattr(torch, "float4_e2m1fn_x2", None)
_E4M3_DTYPE: torch.dtype = torch.float8_e4m3fn
_BYTE_DTYPES = tuple(d for d in (_FP4_DTYPE, _E4M3_DTYPE) if d is not None)


# --------------------------------------------------------------------------------------------
# dtype views and fp4 packing
# --------------------------------------------------------------------------------------------


def as_uint8(t: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """View a packed fp4 or e4m3 tensor as uint8 bytes without copying.

    Kernels and layout helpers work on bytes; callers may hold the same storage under the
    semantic dtypes `torch.float4_e2m1fn_x2` / `torch.float8_e4m3fn` (both one byte per element).
    """
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, but got {type(t).__name__}")
    if t.dtype == torch.uint8:
        return t
    if t.dtype in _BYTE_DTYPES:
        return t.view(torch.uint8)
    raise InputError(
        f"{name} must be uint8, torch.float4_e2m1fn_x2 or torch.float8_e4m3fn, but got {t.dtype}"
    )


def _e2m1_table(device: torch.device | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=device)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes (..., K) into bytes (..., K // 2): element 2j low nibble, 2j + 1 high.

    This is the byte order of `torch.float4_e2m1fn_x2` and of the kernels' fp4 operands.
    """
    if codes.dtype != torch.uint8:
        raise InputError(f"codes must be uint8, but got {codes.dtype}")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise InputError(
            f"codes must have an even last dimension, but got shape {tuple(codes.shape)}"
        )
    if codes.numel() and int(codes.max()) > 15:
        raise InputError(f"codes must be in 0..15, but got a maximum of {int(codes.max())}")
    return _pack_codes(codes)


def _pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """pack_fp4 without its checks (which read values on the host): codes known to be 0..15."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_fp4`: bytes (..., K // 2) -> uint8 codes 0..15 of shape (..., K)."""
    p = as_uint8(packed, "packed")
    if p.dim() == 0:
        raise InputError("packed must have at least one dimension, but got a scalar")
    return torch.stack((p & 0x0F, p >> 4), dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)


def fp4_to_float(packed: torch.Tensor) -> torch.Tensor:
    """Decode packed fp4 (..., K // 2) to float32 (..., K) on the tensor's own device (exact)."""
    codes = unpack_fp4(packed)
    return _e2m1_table(codes.device)[codes.long()]


# --------------------------------------------------------------------------------------------
# The blocked scale layout
# --------------------------------------------------------------------------------------------


def _check_k(k: int) -> None:
    if k <= 0 or k % SF_VEC:
        raise InputError(f"K must be a positive multiple of {SF_VEC}, but got {k}")


def blocked_scale_offset(i: int, j: int, k: int) -> int:
    """Byte offset of the scale of row `i`, scale column `j` (= K index // 16), for K = `k`.

    This is the formula of facts.md, kept as scalar code so tests can check `to_blocked` against
    it independently: 512-byte atoms of 128 rows x 4 scale columns, M-block outer, K-block inner.
    """
    rest_k = -(-k // (4 * SF_VEC))  # ceil(K / 64)
    return ((i // 128) * rest_k + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + (j % 4)


def blocked_scale_numel(rows: int, k: int) -> int:
    """Bytes of the blocked scales of a (rows, K) operand: rows padded to 128, K to 64
    (runtime.formats owns the formula; this checks K first)."""
    _check_k(k)
    return _blocked_scale_numel(rows, k)


def _pad_byte(pad_value: float, dtype: torch.dtype) -> int:
    """The byte that `pad_value` is in `dtype` (a value of that dtype, not a raw byte for e4m3)."""
    if dtype == torch.uint8:
        if not 0 <= int(pad_value) <= 255:
            raise InputError(f"pad_value must be a byte for uint8 scales, but got {pad_value}")
        return int(pad_value)
    return int(torch.tensor(float(pad_value)).to(dtype).view(torch.uint8))


def to_blocked(scales: torch.Tensor, pad_value: float = 0) -> torch.Tensor:
    """Reorder plain scales (rows, K // 16) into the 1-D blocked layout the kernels read.

    Returns a new contiguous 1-D tensor of `blocked_scale_numel(rows, K)` elements, same dtype
    and device as `scales`. Padding rows (>= rows) and padding scale columns (>= K // 16) hold
    `pad_value`, given as a value of the tensor's dtype (e.g. float('nan') poisons e4m3 padding).
    """
    s = as_uint8(scales, "scales")
    if s.dim() != 2:
        raise InputError(f"scales must be 2-D (rows, K // 16), but got shape {tuple(s.shape)}")
    rows, cols = s.shape
    if cols == 0:
        raise InputError("scales must have at least one scale column, but got 0")
    blocked = _blocked_bytes(s, _pad_byte(pad_value, scales.dtype))
    return blocked if scales.dtype == torch.uint8 else blocked.view(scales.dtype)


def _blocked_bytes(s: torch.Tensor, pad: int) -> torch.Tensor:
    """to_blocked's reordering of uint8 plain scales (..., rows, cols) -> (..., blocked bytes),
    padding with byte `pad`; leading dimensions (one per expert, say) are kept apart."""
    *lead, rows, cols = s.shape
    m_blocks = -(-rows // 128)
    k_blocks = -(-cols // 4)
    padded = torch.full((*lead, m_blocks * 128, k_blocks * 4), pad, dtype=torch.uint8,
                        device=s.device)
    padded[..., :rows, :cols] = s
    # row i = mb*128 + i4*32 + i32, column j = kb*4 + j4  ->  (mb, kb, i32, i4, j4)
    n = len(lead)
    order = (*range(n), *(n + d for d in (0, 3, 2, 1, 4)))
    return padded.view(*lead, m_blocks, 4, 32, k_blocks, 4).permute(order).reshape(*lead, -1)


def _row_experts(offs: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' reading of end offsets for t rows, on the device: (ends, clamped to 0..t and
    made non-decreasing, int64 (E,); each row's expert, E past offs[-1], int64 (t,))."""
    ends = _clamped_ends(offs, t)
    rows = torch.arange(t, device=offs.device)
    return ends, torch.searchsorted(ends, rows, right=True)


def _clamped_ends(offs: torch.Tensor, t: int) -> torch.Tensor:
    """End offsets as the kernels read them: clamped to 0..t, made non-decreasing, int64."""
    return torch.cummax(offs.to(torch.int64).clamp(0, t), dim=0).values


def to_blocked_grouped(scales: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """scaled_grouped_mm's `sfa` from plain scales (T, K // 16) of rows grouped by expert
    (expert g owns rows offs[g-1] .. offs[g], int32 end offsets): the blocked layout with each
    expert's rows padded to 128, in a 1-D buffer of round_up(T, 128) + 128 * E blocked rows
    (room for any routing, as runtime/serving.py asks).

    Torch ops only, and none reads offs on the host: no sync, so it runs under CUDA-graph
    capture with the routing of each step. Rows past offs[-1] are dropped; the offsets are
    clamped and made non-decreasing as the kernels do."""
    s = as_uint8(scales, "scales")
    if s.dim() != 2 or s.shape[1] == 0:
        raise InputError(f"scales must be 2-D (T, K // 16), but got shape {tuple(s.shape)}")
    if not isinstance(offs, torch.Tensor) or offs.dtype not in (torch.int32, torch.int64):
        raise InputError(f"offs must be an int32 or int64 torch.Tensor, but got "
                         f"{offs.dtype if isinstance(offs, torch.Tensor) else type(offs).__name__}")
    if offs.device != s.device:
        raise InputError(f"offs must be on scales' device {s.device}, but got {offs.device}")
    if offs.dim() != 1 or offs.numel() == 0:
        raise InputError(f"offs must be 1-D (E,) with E > 0, but got shape {tuple(offs.shape)}")
    blocked = _blocked_grouped(s, *_row_experts(offs, s.shape[0]))
    return blocked if scales.dtype == torch.uint8 else blocked.view(scales.dtype)


def _expert_starts(ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From _row_experts' ends: each expert's first row, and its first blocked scale row (the
    rows before it, each expert's padded to 128)."""
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    padded = (ends - starts + 127) // 128 * 128
    return starts, torch.cumsum(padded, 0) - padded


def _blocked_grouped(s: torch.Tensor, ends: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """to_blocked_grouped's bytes from uint8 plain scales (T, cols) and _row_experts' (ends,
    g): each expert's rows scattered to their 128-padded place, then blocked at once."""
    t, cols = s.shape
    experts = ends.numel()
    starts, padded_start = _expert_starts(ends)
    gc = g.clamp(max=experts - 1)
    total = sfa_rows_needed(t, experts)
    # Dropped rows go to one spare row past the buffer, cut off below (no boolean indexing:
    # that would sync).
    rows = torch.arange(t, device=s.device)
    dest = torch.where(g < experts, padded_start[gc] + rows - starts[gc], total)
    plain = torch.zeros(total + 1, cols, dtype=torch.uint8, device=s.device)
    plain[dest] = s
    return _blocked_bytes(plain[:total], 0)


def from_blocked(blocked: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """Exact inverse of `to_blocked`: blocked 1-D scales -> plain (rows, K // 16), padding
    dropped."""
    _check_k(k)
    b = as_uint8(blocked, "blocked")
    expected = blocked_scale_numel(rows, k)
    if b.dim() != 1 or b.numel() != expected:
        raise InputError(
            f"blocked scales for rows={rows}, K={k} must be 1-D with {expected} elements, "
            f"but got shape {tuple(b.shape)}"
        )
    m_blocks = -(-rows // 128)
    k_blocks = -(-k // (4 * SF_VEC))
    # The permutation (0, 3, 2, 1, 4) swaps two axes, so it is its own inverse.
    plain = b.reshape(m_blocks, k_blocks, 32, 4, 4).permute(0, 3, 2, 1, 4)
    plain = plain.reshape(m_blocks * 128, k_blocks * 4)[:rows, : k // SF_VEC].contiguous()
    return plain if blocked.dtype == torch.uint8 else plain.view(blocked.dtype)


# --------------------------------------------------------------------------------------------
# Quantization
# --------------------------------------------------------------------------------------------


def _midpoints_on(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """_E2M1_MIDPOINTS as a tensor computed on `device` (exact), not copied from the host: a
    host-to-device copy of Python values synchronizes and fails under CUDA-graph capture, where
    runtime.activations runs this."""
    i = torch.arange(len(_E2M1_MIDPOINTS), dtype=dtype, device=device)
    return torch.where(i < 4, 0.25 + 0.5 * i, torch.where(i < 6, i - 1.5, 5.0))


def _round_to_e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Round values (already divided by their scale) to the nearest e2m1 code.

    Ties go to the EVEN code (the one whose mantissa bit is 0): IEEE round-to-nearest-even on the
    e2m1 grid, the `.rn` mode of PTX `cvt ... e2m1x2`. As values: 0.25 -> 0, 0.75 -> 1.0,
    1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0. Magnitudes above 6 saturate to 6.
    Values that round to zero get code 0 (+0), whatever their sign.
    """
    mag = v.abs()
    bounds = _midpoints_on(mag.device, mag.dtype)
    lo = torch.bucketize(mag, bounds, right=False)  # a tie at a midpoint -> lower code
    hi = torch.bucketize(mag, bounds, right=True)  # a tie at a midpoint -> upper code
    code = torch.where((lo != hi) & (lo % 2 == 1), hi, lo)  # on a tie keep the even one
    sign = ((v < 0) & (code != 0)).to(torch.uint8) << 3
    return code.to(torch.uint8) | sign


def quantize_nvfp4(
    x: torch.Tensor, global_scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x (rows, K) to NVFP4: (packed uint8 (rows, K // 2), e4m3 scales (rows, K // 16)).

    The scales come back in the PLAIN layout; `to_blocked` turns them into the kernels' layout.
    Per 16-element block: scale = e4m3(amax / 6 / global_scale) (round to nearest even,
    saturating at 448), then each value / (scale * global_scale) rounds to the nearest e2m1
    value (ties to the even code, saturating at 6). `global_scale` is the per-tensor factor that
    dequantization multiplies back (the kernel's alpha): x ~= e2m1 * scale * global_scale.
    A block whose scale rounds to 0 (all zeros, or tiny) gets scale 0 and codes 0, never NaN.
    Inputs already on the grid with amax = 6 * an e4m3 value per block round-trip exactly.
    Arithmetic is in float64 on x's device, so the e2m1 rounding decisions are exact; the e4m3
    scale goes through torch's cast, via float32, which may round a quotient within 2^-24
    (relative) of an e4m3 midpoint the other way.
    """
    if not isinstance(x, torch.Tensor):
        raise InputError(f"x must be a torch.Tensor, but got {type(x).__name__}")
    if x.dim() != 2:
        raise InputError(f"x must be 2-D (rows, K), but got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise InputError(f"x must be float32, float16, bfloat16 or float64, but got {x.dtype}")
    rows, k = x.shape
    _check_k(k)
    if global_scale is not None and not (math.isfinite(global_scale) and global_scale > 0):
        raise InputError(f"global_scale must be a positive finite number, but got {global_scale}")
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise InputError("x must be finite, but it contains NaN or Inf")
    gs = 1.0 if global_scale is None else float(global_scale)
    codes, scale = _quantize_codes(x, gs)
    return _pack_codes(codes), scale


def _quantize_codes(x: torch.Tensor, gs: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_nvfp4's arithmetic, reading no value on the host: (codes uint8 (rows, K), e4m3
    scales (rows, K // 16)) of x (rows, K) for decode scale `gs`, a float or a float64 (rows, 1)
    tensor (one per row; the same IEEE operations either way, so the same bits)."""
    rows, k = x.shape
    blocks = x.to(torch.float64).reshape(rows, k // SF_VEC, SF_VEC)
    amax = blocks.abs().amax(dim=-1)
    scale = (amax / E2M1_MAX / gs).clamp(max=E4M3_MAX).to(_E4M3_DTYPE)
    denom = scale.to(torch.float64) * gs
    safe = denom > 0
    v = torch.where(safe[..., None], blocks / torch.where(safe, denom, 1.0)[..., None], 0.0)
    return _round_to_e2m1_codes(v).reshape(rows, k), scale


def dequantize_nvfp4(
    packed: torch.Tensor, scales_plain: torch.Tensor, global_scale: float | None = None
) -> torch.Tensor:
    """Dequantize NVFP4 (packed (rows, K // 2), plain e4m3 scales (rows, K // 16)) to float32.

    value * scale is exact in float32; a `global_scale` multiplies once more (one rounding).
    """
    values = fp4_to_float(packed)
    if values.dim() != 2:
        raise InputError(f"packed must be 2-D (rows, K // 2), but got shape {tuple(packed.shape)}")
    rows, k = values.shape
    s = as_uint8(scales_plain, "scales_plain").view(_E4M3_DTYPE)  # uint8 = raw e4m3 bytes
    if tuple(s.shape) != (rows, k // SF_VEC):
        raise InputError(
            f"scales_plain must have shape {(rows, k // SF_VEC)}, but got {tuple(s.shape)}"
        )
    out = values * s.to(torch.float32).repeat_interleave(SF_VEC, dim=1)
    if global_scale is not None:
        out = out * float(global_scale)
    return out


def global_scale_for(x: torch.Tensor, max_block_scale: float = E4M3_MAX) -> float:
    """Per-tensor global scale for `quantize_nvfp4(x, global_scale=...)`: amax / (6 *
    max_block_scale), rounded to float32 (the kernels' alpha is fp32), 1.0 for an all-zero x.

    With the default the largest block scale lands on 448, the top of e4m3, which keeps the most
    range below it (2^-9..448) for small blocks: the usual NVFP4 recipe for tensors whose
    magnitudes are far from 1 (ModelOpt's weight_scale_2 and input_scale). Kernels that apply
    alpha to the fp32 accumulator take it as is. Only a kernel WITHOUT alpha (whose fp16 output
    holds the UNSCALED product, up to 2688^2 * K, multiplied later by `apply_alpha`) needs a
    small max_block_scale (e.g. 1.0) so that output fits fp16, at the cost of flushing blocks
    below amax * 2^-9 / 6 to zero.
    """
    if not (math.isfinite(max_block_scale) and 0 < max_block_scale <= E4M3_MAX):
        raise InputError(f"max_block_scale must be in (0, {E4M3_MAX}], but got {max_block_scale}")
    amax = float(x.detach().abs().amax().double()) if x.numel() else 0.0
    if not math.isfinite(amax):
        raise InputError("x must be finite, but it contains NaN or Inf")
    if amax == 0.0:
        return 1.0
    gs = float(torch.tensor(amax / (E2M1_MAX * max_block_scale), dtype=torch.float32))
    if not gs > 0.0:  # amax so small that the quotient underflows fp32
        raise InputError(f"x's amax {amax!r} is too small for an fp32 global scale")
    if not math.isfinite(gs):  # or so large that it overflows (a float64 x)
        raise InputError(f"x's amax {amax!r} is too large for an fp32 global scale")
    return gs


@dataclass
class QuantizedGroups:
    """Operands of one grouped GEMM quantized from real values, in the kernels' formats.

    a[g]: uint8 (m, k // 2); b[g]: uint8 (n, k // 2); sfa[g] / sfb[g]: 1-D float8_e4m3fn in the
    blocked layout; global_a / global_b: the per-tensor DECODE global scales used (1.0 without),
    each an fp32 value; alpha: float32 (G,) on the data's device (that of the first A; the CPU
    for zero groups), alpha[g] = global_a[g] * global_b[g] rounded once to fp32 (the fp32
    product of the two decode scales).

    C_g ~= alpha[g] * (A_g * SFA_g) @ (B_g * SFB_g)^T: pass `alpha` straight to the kernels
    (`gg.grouped_gemm(q.a, q.b, q.sfa, q.sfb, alpha=q.alpha)`), and compare against
    `reference()`, which includes alpha. A kernel without alpha needs `apply_alpha` instead.
    """

    shapes: list[tuple[int, int, int]]
    a: list[torch.Tensor] = field(default_factory=list)
    b: list[torch.Tensor] = field(default_factory=list)
    sfa: list[torch.Tensor] = field(default_factory=list)
    sfb: list[torch.Tensor] = field(default_factory=list)
    global_a: list[float] = field(default_factory=list)
    global_b: list[float] = field(default_factory=list)
    alpha: torch.Tensor = field(default_factory=lambda: torch.ones(0, dtype=torch.float32))

    def reference(self, out_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """alpha[g] * C_g per group in float64, or rounded to `out_dtype` (float16 / bfloat16)
        as the kernels' output (see `reference_grouped_gemm`)."""
        return reference_grouped_gemm(self.a, self.b, self.sfa, self.sfb, self.shapes,
                                      alpha=self.alpha.tolist(), out_dtype=out_dtype)


def quantize_grouped(
    a_list: Sequence[torch.Tensor],
    b_list: Sequence[torch.Tensor],
    *,
    global_scale: bool = False,
    max_block_scale: float = E4M3_MAX,
) -> QuantizedGroups:
    """Quantize real operands A_g (m, K) and B_g (n, K) (K-major, like the kernels' inputs) to
    NVFP4 with blocked scales. global_scale=True gives each tensor its own `global_scale_for`
    decode scale and returns their product per group as `alpha`, float32 (G,) on the data's
    device, ready for the kernels' `alpha=` argument; otherwise alpha is all ones.
    """
    if len(a_list) != len(b_list):
        raise InputError(f"a_list and b_list must have the same number of groups, but got "
                         f"{len(a_list)} and {len(b_list)}")
    q = QuantizedGroups(shapes=[])
    for g, (x, w) in enumerate(zip(a_list, b_list)):
        if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
            raise InputError(f"group {g}: a must be (m, K) and b (n, K) with the same K, but got "
                             f"shapes {tuple(x.shape)} and {tuple(w.shape)}")
        gx = global_scale_for(x, max_block_scale) if global_scale else 1.0
        gw = global_scale_for(w, max_block_scale) if global_scale else 1.0
        a, sa = quantize_nvfp4(x, gx if global_scale else None)
        b, sb = quantize_nvfp4(w, gw if global_scale else None)
        q.shapes.append((x.shape[0], w.shape[0], x.shape[1]))
        q.a.append(a)
        q.b.append(b)
        q.sfa.append(to_blocked(sa))
        q.sfb.append(to_blocked(sb))
        q.global_a.append(gx)
        q.global_b.append(gw)
    device = a_list[0].device if len(a_list) else torch.device("cpu")
    # gx and gw are fp32 values: their fp32 product is the decode-scale product, rounded once.
    q.alpha = (torch.tensor(q.global_a, dtype=torch.float32, device=device)
               * torch.tensor(q.global_b, dtype=torch.float32, device=device))
    return q


def apply_alpha(
    outs: Sequence[torch.Tensor], alpha: torch.Tensor | Sequence[float]
) -> list[torch.Tensor]:
    """out[g] * alpha[g] in float32, back to out[g]'s dtype: the caller's epilogue for a kernel
    that does not take alpha (kernels that do apply it to the fp32 accumulator, which is
    better). Two roundings (the kernel's fp16 output, then this), and the unscaled fp16 output
    must not overflow first (see `global_scale_for`)."""
    vals = alpha.tolist() if isinstance(alpha, torch.Tensor) else list(alpha)
    if len(vals) != len(outs):
        raise InputError(f"alpha must have {len(outs)} entries, but got {len(vals)}")
    return [(o.float() * float(torch.tensor(v, dtype=torch.float32))).to(o.dtype)
            for o, v in zip(outs, vals)]


# --------------------------------------------------------------------------------------------
# Checkpoints: NVIDIA ModelOpt NVFP4
# --------------------------------------------------------------------------------------------

_FP4_PACKED_DTYPES = tuple(d for d in (torch.uint8, _FP4_DTYPE) if d is not None)


@dataclass
class ModelOptExperts:
    """The NVFP4 weights of one or more experts (linear layers) of a ModelOpt checkpoint, in the
    kernels' formats: the B operands of one grouped GEMM, one group per expert.

    b[e]: uint8 (N, K // 2), the checkpoint's packed e2m1 bytes unchanged (a view, no copy, when
    the weight is contiguous); sfb[e]: 1-D float8_e4m3fn, `to_blocked(weight_scale[e])`;
    alpha: float32 (E,) = input_scale * weight_scale_2 (fp32 product), the kernels' `alpha=`;
    input_scale: float32 (E,), the activations' decode scale (see `quantize_activation`);
    weight_scale_2: float32 (E,); shapes[e]: (N, K). All tensors on the weights' device.
    Expert e computes C_e ~= X_e @ W_e^T with A_e, SFA_e = quantize_activation(X_e, input_scale[e])
    and `gg.grouped_gemm(a, self.b, sfa, self.sfb, alpha=self.alpha)`.
    """

    shapes: list[tuple[int, int]]
    b: list[torch.Tensor]
    sfb: list[torch.Tensor]
    alpha: torch.Tensor
    input_scale: torch.Tensor
    weight_scale_2: torch.Tensor

    def quantize_inputs(
        self, x_list: Sequence[torch.Tensor]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(a_list, sfa_list): x_list[e] (m_e, K) quantized with input_scale[e]."""
        if len(x_list) != len(self.b):
            raise InputError(f"x_list must have {len(self.b)} entries (one per expert), "
                             f"but got {len(x_list)}")
        pairs = [quantize_activation(x, s) for x, s in zip(x_list, self.input_scale.tolist())]
        return [a for a, _ in pairs], [sf for _, sf in pairs]

    def reference(
        self,
        a_list: Sequence[torch.Tensor],
        sfa_list: Sequence[torch.Tensor],
        out_dtype: torch.dtype | None = None,
    ) -> list[torch.Tensor]:
        """What the kernels compute for these experts on quantized activations, alpha included
        (`reference_grouped_gemm`; float64 unless `out_dtype`)."""
        if len(a_list) != len(self.b):
            raise InputError(f"a_list must have {len(self.b)} entries (one per expert), "
                             f"but got {len(a_list)}")
        shapes = [(as_uint8(a, f"a_list[{e}]").shape[0], n, k)
                  for e, (a, (n, k)) in enumerate(zip(a_list, self.shapes))]
        return reference_grouped_gemm(a_list, self.b, sfa_list, self.sfb, shapes,
                                      alpha=self.alpha, out_dtype=out_dtype)


def _modelopt_weight(
    weight: torch.Tensor, weight_scale: torch.Tensor, wname: str, sname: str
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """Check one expert's weight (N, K // 2) and plain weight_scale (N, K // 16); return
    (b uint8, sfb blocked, (N, K))."""
    if not isinstance(weight, torch.Tensor):
        raise InputError(f"{wname} must be a torch.Tensor, but got {type(weight).__name__}")
    if weight.dtype not in _FP4_PACKED_DTYPES:
        raise InputError(f"{wname} must be uint8 or torch.float4_e2m1fn_x2 (packed e2m1 pairs), "
                         f"but got {weight.dtype}")
    if weight.dim() != 2:
        raise InputError(f"{wname} must be 2-D (N, K // 2), but got shape {tuple(weight.shape)}")
    n, k = weight.shape[0], 2 * weight.shape[1]
    if k == 0 or k % SF_VEC:
        raise InputError(f"K (= 2 * {wname}.shape[-1]) must be a positive multiple of {SF_VEC}, "
                         f"but got {k}")
    if not isinstance(weight_scale, torch.Tensor):
        raise InputError(f"{sname} must be a torch.Tensor, but got {type(weight_scale).__name__}")
    if weight_scale.dtype != _E4M3_DTYPE:
        raise InputError(f"{sname} must be torch.float8_e4m3fn, but got {weight_scale.dtype}")
    if tuple(weight_scale.shape) != (n, k // SF_VEC):
        raise InputError(f"{sname} must have shape (N, K // 16) = {(n, k // SF_VEC)} (plain, not "
                         f"blocked), but got {tuple(weight_scale.shape)}")
    if weight_scale.device != weight.device:
        raise InputError(f"{sname} must be on {wname}'s device {weight.device}, "
                         f"but got {weight_scale.device}")
    # e4m3fn's only non-finite codes are NaN (S.1111.111): a corrupt checkpoint would give NaN
    # outputs with no error. One host read, at import time.
    if weight_scale.device.type != "meta":  # meta tensors hold no values
        nan = (weight_scale.view(torch.uint8) & 0x7F) == 0x7F
        if bool(nan.any()):
            first = [int(i) for i in nan.nonzero()[0]]
            raise InputError(f"{sname} must be finite e4m3 block scales, but {sname}{first} "
                             f"is NaN ({int(nan.sum())} NaN scales in all)")
    return as_uint8(weight).contiguous(), to_blocked(weight_scale), (n, k)


def _scale_vector(
    v: torch.Tensor | float | Sequence[torch.Tensor | float],
    name: str,
    count: int | None,
    device: torch.device,
) -> torch.Tensor:
    """Per-expert fp32 decode scales as a float32 (E,) tensor on `device`. count=None: ONE
    scalar (a one-element float32 tensor or a Python number); otherwise a float32 (count,) tensor
    or a sequence of count scalars. Every value must be positive and finite."""
    if count is None or not isinstance(v, (torch.Tensor, Sequence)):
        if isinstance(v, torch.Tensor):
            if v.dtype != torch.float32:
                raise InputError(f"{name} must be float32, but got {v.dtype}")
            if v.numel() != 1:
                raise InputError(f"{name} must be a scalar (one element), "
                                 f"but got shape {tuple(v.shape)}")
            out = v.detach().reshape(1).to(device)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out = torch.tensor([float(v)], dtype=torch.float32, device=device)
        else:
            raise InputError(f"{name} must be a float32 tensor or a Python float, "
                             f"but got {type(v).__name__}")
        if count not in (None, 1):
            raise InputError(f"{name} must have shape ({count},) or {count} entries (one per "
                             f"expert), but got a scalar")
    elif isinstance(v, torch.Tensor):
        if v.dtype != torch.float32:
            raise InputError(f"{name} must be float32, but got {v.dtype}")
        if tuple(v.shape) != (count,):
            raise InputError(f"{name} must have shape (E,) = ({count},), "
                             f"but got {tuple(v.shape)}")
        out = v.detach().to(device)
    else:
        if len(v) != count:
            raise InputError(f"{name} must have {count} entries (one per expert), "
                             f"but got {len(v)}")
        out = torch.cat([_scale_vector(x, f"{name}[{e}]", None, device) for e, x in enumerate(v)])
    bad = ~(torch.isfinite(out) & (out > 0))
    if bool(bad.any()):
        e = int(bad.nonzero()[0, 0])
        where = name if count is None else f"{name}[{e}]"
        raise InputError(f"{where} must be positive and finite, but got {float(out[e])!r}")
    return out


def from_modelopt(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor | float,
    input_scale: torch.Tensor | float,
) -> ModelOptExperts:
    """One ModelOpt NVFP4 linear layer (one expert) in the kernels' formats: E = 1.

    weight: uint8 (or float4_e2m1fn_x2) (N, K // 2), element 2j in the low nibble;
    weight_scale: float8_e4m3fn (N, K // 16), plain row-major; weight_scale_2 and input_scale:
    fp32 decode scales, each a one-element float32 tensor (0-d as stored) or a Python float.
    Returns b = [weight as uint8], sfb = [to_blocked(weight_scale)], alpha = (1,) float32
    input_scale * weight_scale_2, input_scale (1,), weight_scale_2 (1,), on weight's device.
    """
    b, sfb, shape = _modelopt_weight(weight, weight_scale, "weight", "weight_scale")
    ws2 = _scale_vector(weight_scale_2, "weight_scale_2", None, weight.device)
    ins = _scale_vector(input_scale, "input_scale", None, weight.device)
    return ModelOptExperts(shapes=[shape], b=[b], sfb=[sfb], alpha=ins * ws2,
                           input_scale=ins, weight_scale_2=ws2)


def from_modelopt_experts(
    weight: torch.Tensor | Sequence[torch.Tensor],
    weight_scale: torch.Tensor | Sequence[torch.Tensor],
    weight_scale_2: torch.Tensor | Sequence[torch.Tensor | float],
    input_scale: torch.Tensor | Sequence[torch.Tensor | float],
) -> ModelOptExperts:
    """E ModelOpt NVFP4 experts in the kernels' formats, one group per expert.

    Either stacked tensors, weight (E, N, K // 2), weight_scale (E, N, K // 16) (b[e] is then a
    view of weight[e]), or sequences of E per-expert tensors as `from_modelopt` takes them
    (experts may then differ in N and K). weight_scale_2 and input_scale: a float32 (E,) tensor or
    a sequence of E scalars. Returns b, sfb (lists of E), alpha = input_scale * weight_scale_2
    (E,) float32, input_scale (E,), weight_scale_2 (E,), all on the weights' device.
    A fused gate-up weight needs ONE weight_scale_2 for the concatenated rows: ModelOpt stores
    one each for w1 and w3, which are equal only if the export tied them (check before fusing).
    """
    def split(v: Any, what: str, shape: str) -> list[Any]:
        if isinstance(v, torch.Tensor):
            if v.dim() != 3:
                raise InputError(f"{what} must be 3-D {shape} or a sequence of 2-D tensors, "
                                 f"but got shape {tuple(v.shape)}")
            return list(v.unbind(0))
        if isinstance(v, Sequence):
            return list(v)
        raise InputError(f"{what} must be a torch.Tensor or a sequence of tensors, "
                         f"but got {type(v).__name__}")

    weights = split(weight, "weight", "(E, N, K // 2)")
    scales = split(weight_scale, "weight_scale", "(E, N, K // 16)")
    e = len(weights)
    if e == 0:
        raise InputError("weight must hold at least one expert, but got 0")
    if len(scales) != e:
        raise InputError(f"weight_scale must have {e} experts (one per weight), "
                         f"but got {len(scales)}")
    parts = [_modelopt_weight(w, s, f"weight[{i}]", f"weight_scale[{i}]")
             for i, (w, s) in enumerate(zip(weights, scales))]
    device = weights[0].device
    for i, w in enumerate(weights):
        if w.device != device:
            raise InputError(f"weight[{i}] must be on weight[0]'s device {device}, "
                             f"but got {w.device}")
    ws2 = _scale_vector(weight_scale_2, "weight_scale_2", e, device)
    ins = _scale_vector(input_scale, "input_scale", e, device)
    return ModelOptExperts(shapes=[p[2] for p in parts], b=[p[0] for p in parts],
                           sfb=[p[1] for p in parts], alpha=ins * ws2,
                           input_scale=ins, weight_scale_2=ws2)


def quantize_activation(
    x: torch.Tensor, input_scale: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations x (M, K) (bf16, fp16 or fp32) for a ModelOpt expert: returns
    (a uint8 (M, K // 2), sfa float8_e4m3fn 1-D blocked), x / input_scale block-quantized (the
    encode global scale is 1 / input_scale), so that x ~= input_scale * dequant(a, sfa).

    input_scale: the fp32 decode scale (a one-element float32 tensor or a Python float). Blocks
    beyond the calibrated range saturate (block scale 448, values 6), as in serving engines.
    A plain torch reference (float64 rounding decisions), not a fast kernel.
    """
    if not isinstance(x, torch.Tensor):
        raise InputError(f"x must be a torch.Tensor, but got {type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise InputError(f"x must be bfloat16, float16 or float32, but got {x.dtype}")
    gs = _scale_vector(input_scale, "input_scale", None, x.device)
    a, sf = quantize_nvfp4(x, global_scale=float(gs[0]))
    return a, to_blocked(sf)


# --------------------------------------------------------------------------------------------
# Random inputs and grouped problems
# --------------------------------------------------------------------------------------------


def random_nvfp4(
    rows: int,
    k: int,
    *,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    values: str = "full",
    scale_exp: tuple[int, int] = (-6, 6),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random NVFP4 operand: (packed uint8 (rows, K // 2), plain e4m3 scales (rows, K // 16)).

    values='full': codes uniform over all 16 e2m1 codes; scales 2**e, e uniform integer in
    scale_exp (both ends included). values='benchmark': the public benchmark's inputs, values in
    {0, +-0.5, +-1, +-1.5} and scales in {1, 2} (scale_exp is ignored). Drawn on the CPU from
    `generator` and then moved, so a seed gives the same data on every device.
    """
    _check_k(k)
    if rows < 0:
        raise InputError(f"rows must be >= 0, but got {rows}")
    if values == "full":
        lo, hi = scale_exp
        if not (_E4M3_POW2_EXP[0] <= lo <= hi <= _E4M3_POW2_EXP[1]):
            raise InputError(
                f"scale_exp must be (lo, hi) with {_E4M3_POW2_EXP[0]} <= lo <= hi <= "
                f"{_E4M3_POW2_EXP[1]} (exact e4m3 powers of two), but got {scale_exp}"
            )
        codes = torch.randint(0, 16, (rows, k), generator=generator, dtype=torch.uint8)
    elif values == "benchmark":
        lo, hi = 0, 1
        pick = torch.randint(0, len(_BENCHMARK_CODES), (rows, k), generator=generator)
        codes = torch.tensor(_BENCHMARK_CODES, dtype=torch.uint8)[pick]
    else:
        raise InputError(f"values must be 'full' or 'benchmark', but got {values!r}")
    exps = torch.randint(lo, hi + 1, (rows, k // SF_VEC), generator=generator)
    scales = torch.pow(2.0, exps.to(torch.float32)).to(_E4M3_DTYPE)
    return pack_fp4(codes).to(device), scales.to(device)


@dataclass
class GroupedProblem:
    """Inputs of one grouped GEMM call, in the kernels' formats, plus plain scales for checking.

    a[g]: uint8 (m, k // 2); b[g]: uint8 (n, k // 2); sfa[g] / sfb[g]: 1-D float8_e4m3fn in the
    blocked layout; sfa_plain[g] / sfb_plain[g]: float8_e4m3fn (m, k // 16) / (n, k // 16).
    """

    shapes: list[tuple[int, int, int]]
    a: list[torch.Tensor] = field(default_factory=list)
    b: list[torch.Tensor] = field(default_factory=list)
    sfa: list[torch.Tensor] = field(default_factory=list)
    sfb: list[torch.Tensor] = field(default_factory=list)
    sfa_plain: list[torch.Tensor] = field(default_factory=list)
    sfb_plain: list[torch.Tensor] = field(default_factory=list)

    def reference(self) -> list[torch.Tensor]:
        """float64 reference outputs of this problem (see `reference_grouped_gemm`)."""
        return reference_grouped_gemm(self.a, self.b, self.sfa, self.sfb, self.shapes)


# make_grouped_problem arguments whose every fp32 partial sum is exact (full-range e2m1 values,
# A scales 2^0..2^6, B scales 2^-6..2^-3): a correct kernel's output then equals
# fp16(float64 reference) bit for bit, so benchmarks can check the timed outputs exactly.
EXACT_DATA = {"values": "full", "scale_exp": (0, 6), "scale_exp_b": (-6, -3)}


def make_grouped_problem(
    groups: Sequence[tuple[int, int, int]],
    *,
    seed: int,
    device: torch.device | str = "cpu",
    values: str = "full",
    scale_exp: tuple[int, int] = (-6, 6),
    scale_exp_b: tuple[int, int] | None = None,
) -> GroupedProblem:
    """Random grouped problem for groups [(m, n, k), ...], reproducible from `seed` on any device.

    Padding of the blocked scales is 0. See `random_nvfp4` for `values` and `scale_exp`, which
    applies to A, and to B unless `scale_exp_b` is given. Full-range values with scales up to
    2^6 on both sides overflow fp16 outputs at large K (rms |C| ~ 3e5 at K = 7168); scales
    2^-6..2^6 on A with 2^-6..2^-2 on B keep |C| around 2e3 while the products still span
    2^-12..2^4.
    """
    gen = torch.Generator().manual_seed(seed)
    prob = GroupedProblem(shapes=[])
    for g, shape in enumerate(groups):
        if len(shape) != 3:
            raise InputError(f"group {g} must be (m, n, k), but got {shape!r}")
        m, n, k = (int(v) for v in shape)
        if m < 0 or n < 0:
            raise InputError(f"group {g} must have m, n >= 0, but got {(m, n, k)}")
        _check_k(k)
        a, sfa = random_nvfp4(m, k, generator=gen, device=device, values=values,
                              scale_exp=scale_exp)  # fmt: skip
        b, sfb = random_nvfp4(n, k, generator=gen, device=device, values=values,
                              scale_exp=scale_exp_b or scale_exp)  # fmt: skip
        prob.shapes.append((m, n, k))
        prob.a.append(a)
        prob.b.append(b)
        prob.sfa_plain.append(sfa)
        prob.sfb_plain.append(sfb)
        prob.sfa.append(to_blocked(sfa))
        prob.sfb.append(to_blocked(sfb))
    return prob


# --------------------------------------------------------------------------------------------
# Reference and comparison
# --------------------------------------------------------------------------------------------


def _dequant_operand(
    data: torch.Tensor, sf_blocked: torch.Tensor, rows: int, k: int, what: str
) -> torch.Tensor:
    d = as_uint8(data, what)
    if tuple(d.shape) != (rows, k // 2):
        raise InputError(f"{what} must have shape {(rows, k // 2)} bytes, but got {tuple(d.shape)}")
    sf = from_blocked(as_uint8(sf_blocked, f"scales of {what}"), rows, k).view(_E4M3_DTYPE)
    values = fp4_to_float(d).to(torch.float64)
    return values * sf.to(torch.float64).repeat_interleave(SF_VEC, dim=1)


def reference_grouped_gemm(
    a_list: Sequence[torch.Tensor],
    b_list: Sequence[torch.Tensor],
    sfa_blocked_list: Sequence[torch.Tensor],
    sfb_blocked_list: Sequence[torch.Tensor],
    shapes: Sequence[tuple[int, int, int]],
    alpha: Sequence[float] | torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """float64 C_g = (A_g * SFA_g) @ (B_g * SFB_g)^T [* alpha_g] per group, on the inputs' device.

    Inputs are in the kernels' formats (packed fp4 as uint8 or float4_e2m1fn_x2, blocked e4m3
    scales). Why float64 is exact: with scales in 2^-6..2^6 each dequantized element is a multiple
    of 2^-7 below 2^9, each product a multiple of 2^-14 below 2^18, so a dot product needs at most
    32 + log2(K) bits: exact for K <= 2^21 (for any e4m3 scales at all, exact for K <= 2^10).
    The reference thus has no rounding error of its own before `alpha`.

    alpha: one value per group (a sequence or a 1-D tensor, e.g. the float32 alpha given to the
    kernels), multiplied into the float64 result as the kernels multiply their fp32 accumulator.
    out_dtype: None (default) returns float64; torch.float16 or torch.bfloat16 rounds the
    (alpha-scaled) float64 result to that dtype with `.to`, like the kernels' output.
    """
    lists = (a_list, b_list, sfa_blocked_list, sfb_blocked_list)
    if len({len(x) for x in lists} | {len(shapes)}) != 1:
        raise InputError(
            "a, b, sfa, sfb and shapes must have the same number of groups, but got "
            f"{[len(x) for x in lists] + [len(shapes)]}"
        )
    if out_dtype not in (None, torch.float16, torch.bfloat16):
        raise InputError("out_dtype must be torch.float16, torch.bfloat16 or None (float64), "
                         f"but got {out_dtype}")
    if isinstance(alpha, torch.Tensor):
        if alpha.dim() != 1:
            raise InputError(f"alpha must be 1-D (G,), but got shape {tuple(alpha.shape)}")
        alpha = alpha.tolist()
    if alpha is not None and len(alpha) != len(shapes):
        raise InputError(f"alpha must have {len(shapes)} entries, but got {len(alpha)}")
    out = []
    for g, (m, n, k) in enumerate(shapes):
        _check_k(k)
        a = _dequant_operand(a_list[g], sfa_blocked_list[g], m, k, f"a[{g}]")
        b = _dequant_operand(b_list[g], sfb_blocked_list[g], n, k, f"b[{g}]")
        c = a @ b.T
        if alpha is not None:
            c = c * float(alpha[g])
        out.append(c if out_dtype is None else c.to(out_dtype))
    return out


def check_close(
    out: torch.Tensor | Sequence[torch.Tensor],
    ref: torch.Tensor | Sequence[torch.Tensor],
    rtol: float = 1e-3,
    atol: float = 1e-3,
) -> tuple[bool, str]:
    """Compare a kernel output to a reference: |out - ref| <= atol + rtol * |ref|, NaN never passes.

    Accepts one tensor each or lists of tensors (one per group). Returns (ok, report) where the
    report gives max abs/rel error, NaN count, mismatch count and the first bad index with its
    values, so a failing GPU run says where and how it is wrong, not just that it is.
    """
    if isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor):
        return _check_one(out, ref, rtol, atol)
    if isinstance(out, torch.Tensor) or isinstance(ref, torch.Tensor):
        return False, "out and ref must both be tensors or both be lists of tensors"
    if len(out) != len(ref):
        return False, f"group count mismatch: out has {len(out)}, ref has {len(ref)}"
    ok_all, lines = True, []
    for g, (o, r) in enumerate(zip(out, ref)):
        ok, rep = _check_one(o, r, rtol, atol)
        ok_all &= ok
        lines.append(f"group {g}: {rep}")
    return ok_all, "\n".join(lines)


def _check_one(out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> tuple[bool, str]:
    if tuple(out.shape) != tuple(ref.shape):
        return False, f"shape mismatch: out {tuple(out.shape)} vs ref {tuple(ref.shape)}"
    o = out.detach().to(device=ref.device, dtype=torch.float64)
    r = ref.detach().to(torch.float64)
    total = r.numel()
    nan = torch.isnan(o) | torch.isnan(r)
    n_nan = int(nan.sum())
    err = (o - r).abs()
    bad = ~(err <= atol + rtol * r.abs())  # NaN compares False, so it counts as bad
    n_bad = int(bad.sum())
    finite = ~nan
    max_abs = float(err[finite].max()) if bool(finite.any()) else float("nan")
    rel = err / r.abs()
    rel_ok = finite & (r != 0)
    max_rel = float(rel[rel_ok].max()) if bool(rel_ok.any()) else 0.0
    report = (
        f"{'OK' if n_bad == 0 else 'FAIL'}: shape {tuple(r.shape)}, max abs err {max_abs:.3e}, "
        f"max rel err {max_rel:.3e}, NaN {n_nan}, mismatched {n_bad}/{total} "
        f"(rtol={rtol:g}, atol={atol:g})"
    )
    if n_bad:
        flat = int(bad.reshape(-1).nonzero()[0, 0])
        idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(flat), tuple(r.shape)))
        report += f"; first bad index {idx}: out {float(o[idx])!r}, ref {float(r[idx])!r}"
    return n_bad == 0, report
