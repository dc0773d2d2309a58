"""The serving contract (issue 26): stacked expert weights, tokens grouped by expert, offsets on
the device, one CUDA graph for every routing.

    out = gg.scaled_grouped_mm(a, b, sfa, sfb, offs, alpha=None, out=None,
                               out_dtype=torch.bfloat16)

- a: (T, K/2) packed e2m1 (torch.float4_e2m1fn_x2 or uint8), rows grouped by expert: expert g
  owns rows offs[g-1] .. offs[g] (offs[-1] taken as 0); rows from offs[E-1] to T are ignored
  and their output rows are not written.
- b: (E, N, K/2), same dtypes, K-major (torch's mat_b is its .transpose(-2, -1) view).
- sfa: e4m3 (or uint8) in the blocked 128x4 layout, each expert's rows padded to a multiple of
  128 (expert g's scales start at row sum_{i<g} round_up(m_i, 128): torch's layout for
  scaled_grouped_mm 2D x 3D). The host cannot know the m_i, so sfa must hold
  round_up(T, 128) + 128 * E rows, enough for any routing.
- sfb: (E, round_up(N, 128) * round_up(K/16, 4)) blocked, one expert per row.
- offs: (E,) int32 CUDA tensor of cumulative end offsets, never read on the host.
- alpha: (E,) float32 CUDA tensor or None; out: (T, N) bf16 or fp16 (its dtype decides).

How: `experts:` sets in shapes.yaml build device-offsets kernels (Config.device_offsets,
kernels/sm90/offsets.py): the launch passes offs, the operands' base addresses, T, N and K, and
each CTA derives its group tables from them on the device. A call is one kernel launch and no
host work that depends on the routing, so one captured graph serves every routing. Kernel
choice depends only on (arch, E, N, K, T, output dtype). Bad offs cannot make it read or write
out of bounds: the kernel clamps the offsets to [0, T] and makes them non-decreasing (a running
maximum) before forming any pointer, so each expert's rows lie inside a and out, and its scale
rows inside the sfa bound above (compute-sanitizer memcheck: 0 errors, 2026-12-04).

Host cost: a call whose tensors match an earlier validated call's types, dtypes, devices,
shapes and strides (torch's C++ TensorGuards, keyed by the weights' id) skips validation and
planning: 10-12 us per eager call on the H200 at E = 128 and 256, back to back with new
routing each call; 13-19 us right after a sync (2026-12-04, bench/RESULTS.md).

Kernels without the offsets ABI (list-API dynamic-m kernels of E identical groups) are served
through device tables computed from offs with a few dozen torch ops in the caller's stream
(device_tables below): capturable and exact, but 600-650 us of host time per eager call.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import validate
from .dispatch import MN_LIMIT, dynamic_groups
from .errors import InputError, NoKernelError
from .formats import blocked_scale_numel, offsets_tables_bytes, scale_cols, sfa_rows_needed
from .manifest import KernelEntry
from .plan import TABLE_ALIGN, Plan, _layout, grid_size, ones_image
from .validate import (
    _FP4,
    _FP4_NAMES,
    _SF,
    _SF_NAMES,
    ALIGN,
    OUT_TORCH_DTYPES,
    check_alpha,
    check_out_overlap,
    out_dtype_name,
)


def _tensor(name: str, t: Any, dtypes: tuple, names: str, dims: int, shape_text: str
            ) -> torch.Tensor:
    """The list API's tensor checks (validate: a dense torch.Tensor of one of `dtypes`,
    contiguous), plus the rank (`dims`, 0 for any)."""
    desc = validate._tensor(name, t, dtypes, names)
    if dims and len(desc.shape) != dims:
        raise InputError(f"{name} must be {dims}-D {shape_text}, but got shape {desc.shape}")
    validate._contiguous(name, desc)
    return t


class ServingCall:
    """A validated scaled_grouped_mm call's host-known facts."""

    __slots__ = ("a", "alpha_ptr", "b", "dtype", "experts", "k", "n", "offs", "ordinal",
                 "out", "sfa", "sfb", "t")

    def __init__(self, **kw: Any) -> None:
        for key, value in kw.items():
            setattr(self, key, value)


def check_devices(operands: tuple[tuple[str, torch.Tensor], ...], index_name: str,
                  index: torch.Tensor, out: torch.Tensor | None) -> int:
    """The device checks of a stacked-experts call (scaled_grouped_mm, masked_grouped_mm):
    every tensor a CUDA tensor on a's device, the TMA operands and out 16-byte aligned (the
    int32 index tensor, offs or masked_m, is read by plain loads). Returns the device ordinal."""
    a = operands[0][1]
    ordinal = a.get_device()
    named = (*operands, *((("out", out),) if out is not None else ()))
    for name, x in (*named, (index_name, index)):
        if x.device.type != "cuda":
            raise InputError(f"{name} must be a CUDA tensor, but got a tensor on {x.device}")
        if x.get_device() != ordinal:
            raise InputError(f"{name} must be on a's device cuda:{ordinal}, but got {x.device}")
    for name, x in named:
        if x.numel() and x.data_ptr() % ALIGN:
            raise InputError(f"{name}'s data pointer must be {ALIGN}-byte aligned (TMA), but got "
                             f"0x{x.data_ptr():x}")
    return ordinal


def must(cond: Any, message: Any) -> None:
    """InputError(message()) unless cond: the `require` of the size checks below for concrete
    sizes (the torch op's fake passes one that also takes symbolic ones)."""
    if not cond:
        raise InputError(message())


def check_serving_sizes(t: Any, experts: Any, n: Any, half_k: Any, b_half_k: Any, offs_len: Any,
                        sfa_numel: Any, sfb_shape: tuple, require: Any = must) -> None:
    """The size checks of a scaled_grouped_mm call, over sizes alone (ints, or the SymInts of
    the torch op's fake at trace time), so compiling rejects what the eager call would."""
    require(b_half_k == half_k, lambda: f"b.shape[2] must equal a.shape[1] = {half_k} (K/2 "
                                        f"bytes), but got {b_half_k}")
    require(half_k > 0 and half_k % 8 == 0,
            lambda: f"a.shape[1] (K/2) must be a positive multiple of 8 (K a multiple of 16: "
                    f"one scale per 16 values), but got {half_k}")
    require(experts > 0 and n > 0, lambda: f"b must have E > 0 experts of N > 0 rows, but got "
                                           f"shape {(experts, n, b_half_k)}")
    require(offs_len == experts, lambda: f"offs must have shape ({experts},) (one end offset per "
                                         f"expert of b), but got ({offs_len},)")
    k = 2 * half_k
    cols = scale_cols(k)
    need = sfa_rows_needed(t, experts) * cols
    require(sfa_numel >= need, lambda: (
        f"sfa must have at least {need} elements (room for any routing: round_up(T, 128) + "
        f"128 * E = {sfa_rows_needed(t, experts)} blocked rows x {cols} scale columns, "
        f"T = {t}, E = {experts}), but got {sfa_numel}"))
    want_b = experts * blocked_scale_numel(n, k)
    sfb_numel = math.prod(sfb_shape)  # ints or SymInts
    require(sfb_numel == want_b, lambda: (
        f"sfb must have {want_b} elements ((E, round_up(N, 128) * round_up(K/16, 4)) = "
        f"({experts}, {want_b // experts})), but got {sfb_numel} (shape {tuple(sfb_shape)})"))


def check_serving(a: Any, b: Any, sfa: Any, sfb: Any, offs: Any, alpha: Any, out: Any,
                  out_dtype: Any) -> ServingCall:
    """Every check of a scaled_grouped_mm call that needs no device data (nothing is read from
    the GPU): dtypes, shapes, sizes, contiguity, devices, 16-byte alignment."""
    a = _tensor("a", a, _FP4, _FP4_NAMES, 2, "(T, K/2) packed fp4")
    b = _tensor("b", b, _FP4, _FP4_NAMES, 3, "(E, N, K/2) packed fp4")
    sfa = _tensor("sfa", sfa, _SF, _SF_NAMES, 0, "")
    sfb = _tensor("sfb", sfb, _SF, _SF_NAMES, 0, "")
    offs = _tensor("offs", offs, (torch.int32,), "torch.int32", 1, "(E,)")
    t, half_k = a.shape
    experts, n, b_half_k = b.shape
    check_serving_sizes(t, experts, n, half_k, b_half_k, offs.shape[0], sfa.numel(),
                        tuple(sfb.shape))
    k = 2 * half_k
    if out is not None:
        out = _tensor("out", out, tuple(OUT_TORCH_DTYPES.values()),
                      "torch.float16 or torch.bfloat16", 2, "(T, N)")
        if tuple(out.shape) != (t, n):
            raise InputError(f"out must have shape (T, N) = {(t, n)}, but got "
                             f"{tuple(out.shape)}")
    dtype = out_dtype_name([out] if out is not None else None, out_dtype)
    ordinal = check_devices((("a", a), ("b", b), ("sfa", sfa), ("sfb", sfb)), "offs", offs, out)
    alpha_ptr = 0 if alpha is None else check_alpha(alpha, experts, ordinal)
    check_out_overlap(out, (("a", a), ("b", b), ("sfa", sfa), ("sfb", sfb), ("offs", offs),
                            ("alpha", alpha)))
    return ServingCall(a=a, b=b, sfa=sfa, sfb=sfb, offs=offs, out=out, t=t, n=n, k=k,
                       experts=experts, dtype=dtype, ordinal=ordinal, alpha_ptr=alpha_ptr)


def select_serving(kernels: tuple[KernelEntry, ...], arch: str | None, experts: int, n: int,
                   k: int, t: int, dtype: str) -> KernelEntry:
    """The dynamic-m kernel for E groups of (N, K) writing `dtype` whose max_m admits T rows
    per expert (any routing may give one expert every row): host-known values only."""
    want = tuple((n, k) for _ in range(experts))

    def preference(e: KernelEntry) -> tuple[bool, float]:
        # Device-offsets kernels first (no host work per call), then list kernels with tables;
        # among them the smallest bound on T that covers the call: a set declared with a small
        # max_m (a decode kernel, e.g. a small tile_m) serves the calls it was built for.
        dyn = dynamic_groups(e)
        bound = dyn[1] if dyn is not None and dyn[1] is not None else float("inf")
        return (not e.takes_offsets, bound)

    for e in sorted(kernels, key=preference):
        if e.arch != arch or e.out_dtype != dtype or e.takes_masked:
            continue
        dyn = dynamic_groups(e)
        if dyn is not None and dyn[0] == want and (dyn[1] is None or dyn[1] >= t):
            if t * n >= MN_LIMIT:
                raise InputError(f"a.shape[0] (T) must keep T * N < 2^31 (the kernels index C "
                                 f"with 32-bit offsets; N = {n}), but got {t}")
            return e
    built = [f"  - {e.name}: {len(d[0])} x {d[0][0]}, max_m {d[1]}" for e in kernels
             if e.arch == arch and (d := dynamic_groups(e)) is not None]
    raise NoKernelError(
        f"no built kernel serves scaled_grouped_mm with E = {experts} experts of (N, K) = "
        f"({n}, {k}), T = {t} rows and {dtype} output on {arch}; nothing was launched. Declare "
        f"a dynamic-m set of {experts} groups [{n}, {k}] (max_m unset or >= T) with {dtype} in "
        f"its out_dtypes. Dynamic-m kernels built for {arch}:\n" + ("\n".join(built) or
                                                                   "  (none)"))


def device_tables(entry: KernelEntry, call: ServingCall, out: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(pointer table (E, 5) int64, problem sizes + CTA prefix in one int32 buffer, the prefix's
    byte offset in it) computed from offs with torch ops on offs' device: no host sync, so a
    CUDA graph captures them and replays them with each step's offs.

    The offsets are clamped to [0, T] and made non-decreasing before use, so no value of offs
    makes a pointer leave its tensor (module docstring)."""
    lay = _layout(entry)
    t, n, k, e = call.t, call.n, call.k, call.experts
    ends = torch.cummax(call.offs.to(torch.int64).clamp(0, t), dim=0).values
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    m = ends - starts
    sfa_rows = (m + 127) // 128 * 128
    sfa_start = torch.cumsum(sfa_rows, 0) - sfa_rows
    g = torch.arange(e, device=ends.device, dtype=torch.int64)
    cols = scale_cols(k)
    column = {
        "a": starts * (k // 2) + call.a.data_ptr(),
        "b": g * (n * k // 2) + call.b.data_ptr(),
        "sfa": sfa_start * cols + call.sfa.data_ptr(),  # cols bytes per blocked row
        "sfb": g * blocked_scale_numel(n, k) + call.sfb.data_ptr(),
        "c": starts * (n * out.element_size()) + out.data_ptr(),
    }
    pointers = torch.stack([column[c] for c in lay.pointer_columns], dim=1).contiguous()
    size_of = {0: m, 1: torch.full_like(m, n), 2: torch.full_like(m, k), 3: torch.ones_like(m)}
    sizes = torch.stack([size_of[i] for i in lay.size_index], dim=1).reshape(-1)
    tiles = (m + lay.tile_m - 1) // lay.tile_m * (-(-n // lay.tile_n))
    prefix = torch.cat([ends.new_zeros(1), torch.cumsum(tiles, 0)])
    offset = -(-4 * sizes.numel() // TABLE_ALIGN) * TABLE_ALIGN  # bytes, as plan.pack_aligned
    tables = torch.zeros(offset // 4 + prefix.numel(), dtype=torch.int32, device=ends.device)
    tables[: sizes.numel()] = sizes.to(torch.int32)
    tables[offset // 4:] = prefix.to(torch.int32)
    return pointers, tables, offset


def offsets_launch_facts(entry: KernelEntry, experts: int, k: int, t: int,
                         sm_count: int) -> tuple[int, int]:
    """(grid, workspace bytes) of a device-offsets kernel's call: every SM's CTAs (the tile
    count depends on the routing), and a workspace of the header, each CTA's descriptor sets
    and derived tables (runtime.formats.offsets_tables_bytes), then T rows of converted A."""
    lay = _layout(entry)
    grid = grid_size(entry, 2**31 - 1, sm_count)
    return grid, (lay.header + grid * (lay.per_cta + offsets_tables_bytes(experts))
                  + t * k * lay.a_element)


def serving_plan(entry: KernelEntry, experts: int, n: int, k: int, t: int,
                 sm_count: int) -> Plan:
    """The launch plan of a serving call: what depends only on (kernel, E, N, K, T, device).

    The grid is every SM's CTAs (the routing, hence the tile count, is unknown on the host:
    CTAs past the last tile exit), and the workspace holds T rows of converted A (sum m = T for
    any routing). Its tables are not used: they come from device_tables each call."""
    lay = _layout(entry)
    grid = grid_size(entry, 2**31 - 1, sm_count)
    ones = ones_image(experts)
    return Plan(entry=entry, shapes=tuple((0, n, k) for _ in range(experts)), problem_sizes=b"",
                cta_prefix=(), total_tiles=-1, grid=grid,
                workspace_bytes=lay.header + grid * lay.per_cta + t * k * lay.a_element,
                workspace_header=lay.header, plan_tables=ones, cta_prefix_offset=0,
                ones_offset=0, pointer_columns=lay.pointer_columns,
                pointer_format=lay.pointer_format)


SIGNATURES = 256  # fast-path signatures kept per GroupedGemm (keyed by the weights' id)


class _Signature:
    """A validated call on a device-offsets kernel: a later call whose tensors pass `guard`
    (same types, dtypes, devices, shapes and strides; torch's C++ TensorGuards, the list API's
    fast path) with the same out_dtype argument and 16-byte aligned data pointers would pass
    check_serving and select the same kernel and plan, so it skips them."""

    __slots__ = ("guard", "in_bytes", "op", "out_bytes", "out_dtype", "out_shape",
                 "out_torch_dtype", "rt")

    def __init__(self, **kw: Any) -> None:
        for key, value in kw.items():
            setattr(self, key, value)


def _fast(gg: Any, a: Any, b: Any, sfa: Any, sfb: Any, offs: Any, alpha: Any, out: Any,
          out_dtype: Any) -> torch.Tensor | None:
    """The call launched through a matching _Signature, or None (nothing launched)."""
    sigs = gg._serving_signatures.get((id(b), alpha is None, out is None))
    if not sigs:
        return None
    tensors = (a, b, sfa, sfb, offs)
    if out is not None:
        tensors += (out,)
    if alpha is not None:
        tensors += (alpha,)
    for sig in sigs:
        if out_dtype is sig.out_dtype and sig.guard.check(*tensors):
            break
    else:
        return None
    pa, pb, psfa, psfb = a.data_ptr(), b.data_ptr(), sfa.data_ptr(), sfb.data_ptr()
    po, pal = offs.data_ptr(), 0 if alpha is None else alpha.data_ptr()
    if out is None:
        out = torch.empty(sig.out_shape, dtype=sig.out_torch_dtype, device=a.device)
        pc = out.data_ptr()
    else:
        # The guard fixed every shape, so the byte spans are the signature's: out may share
        # none with an input (check_out_overlap names the one it does).
        pc = out.data_ptr()
        end = pc + sig.out_bytes
        na, nb, nsa, nsb, no, nal = sig.in_bytes
        if ((pa < end and pc < pa + na) or (pb < end and pc < pb + nb)
                or (psfa < end and pc < psfa + nsa) or (psfb < end and pc < psfb + nsb)
                or (po < end and pc < po + no) or (pal < end and pc < pal + nal)):
            return None
    if (pa | pb | psfa | psfb | pc) & (ALIGN - 1):
        return None  # the full path names the misaligned tensor
    sig.rt.launch_offsets(sig.op, (po, pa, pb, psfa, psfb, pc), pal)
    return out


def _remember(gg: Any, a: Any, b: Any, sfa: Any, sfb: Any, offs: Any, alpha: Any, out: Any,
              out_dtype: Any, call: ServingCall, rt: Any, op: Any,
              result: torch.Tensor) -> None:
    """Keep a guard for this validated device-offsets call (module docstring: host cost)."""
    if not gg._guard_checked:  # the list API's fast path asks the same question once
        from .api import tensor_guard_type

        gg._guard_type = tensor_guard_type()
        gg._guard_checked = True
    guard_type = gg._guard_type
    if guard_type is None:
        return
    examples = (a, b, sfa, sfb, offs)
    if out is not None:
        examples += (out,)
    if alpha is not None:
        examples += (alpha,)
    sig = _Signature(guard=guard_type(*examples, dynamic_dims_sizes=None,
                                      dynamic_dims_strides=None),
                     op=op, out_dtype=out_dtype, out_shape=(call.t, call.n),
                     out_torch_dtype=result.dtype, rt=rt,
                     in_bytes=tuple(0 if x is None else x.numel() * x.element_size()
                                    for x in (a, b, sfa, sfb, offs, alpha)),
                     out_bytes=result.numel() * result.element_size())
    table = gg._serving_signatures
    key = (id(b), alpha is None, out is None)
    if len(table) >= SIGNATURES and key not in table:
        table.clear()
    table[key] = (sig, *table.get(key, ()))[:8]  # replaced, never mutated


def scaled_grouped_mm(gg: Any, a: Any, b: Any, sfa: Any, sfb: Any, offs: Any, *,
                      alpha: Any = None, out: Any = None,
                      out_dtype: Any = torch.bfloat16) -> torch.Tensor:
    """See the module docstring. Raises InputError / NoKernelError with nothing launched."""
    fast = _fast(gg, a, b, sfa, sfb, offs, alpha, out, out_dtype)
    if fast is not None:
        return fast
    call = check_serving(a, b, sfa, sfb, offs, alpha, out, out_dtype)
    rt = gg._runtime(call.ordinal)  # the ordinal of a checked CUDA tensor: no device lookup
    entry = select_serving(gg.kernels, rt.arch, call.experts, call.n, call.k, call.t,
                           call.dtype)
    if alpha is not None and not entry.takes_alpha:
        raise InputError(f"alpha was given, but kernel {entry.name!r} takes no alpha; rebuild "
                         "the artifacts")
    if out is None:
        out = torch.empty((call.t, call.n), dtype=OUT_TORCH_DTYPES[call.dtype],
                          device=rt.torch_device)
    if call.t == 0:
        return out
    if entry.takes_offsets:
        op = rt.offsets_plan(entry, call.experts, call.n, call.k, call.t)
        rt.launch_offsets(op, (call.offs.data_ptr(), call.a.data_ptr(), call.b.data_ptr(),
                               call.sfa.data_ptr(), call.sfb.data_ptr(), out.data_ptr()),
                          call.alpha_ptr)
        _remember(gg, a, b, sfa, sfb, offs, alpha, call.out, out_dtype, call, rt, op, out)
        return out
    dp = rt.serving_plan(entry, call.experts, call.n, call.k, call.t)
    with torch.cuda.device(call.ordinal):
        pointers, tables, offset = device_tables(entry, call, out)
    rt.launch_device_tables(dp, pointers, tables, offset, call.alpha_ptr)
    return out
