"""The masked layout (issue 27): DeepGEMM's and DeepEP low-latency's form of the expert GEMMs,
used for expert-parallel decode under CUDA graphs.

    out = gg.masked_grouped_mm(a, b, sfa, sfb, masked_m, *, expected_m=None, alpha=None,
                               out=None, out_dtype=torch.bfloat16)

- a: (E, max_m, K/2) packed e2m1 (torch.float4_e2m1fn_x2 or uint8): expert g's tokens are
  a[g, :masked_m[g]]; the rest of its rows are ignored and their output rows are not written.
- b: (E, N, K/2), sfb: (E, round_up(N, 128) * round_up(K/16, 4)) blocked, as in
  scaled_grouped_mm; sfa: (E, round_up(max_m, 128) * round_up(K/16, 4)) blocked, one expert per
  row; alpha: (E,) float32 CUDA tensor or None.
- masked_m: (E,) int32 CUDA tensor, never read on the host; values are clamped to [0, max_m].
- expected_m: an optional host hint of the rows per expert (DeepGEMM's), used only to choose
  among built kernels (a decode kernel with a small tile for small values); never a bound.
- out: (E, max_m, N) bf16 or fp16.

The kernels are device-offsets kernels built with `masked: true` (kernels/sm90/offsets.py):
each CTA derives its tables from masked_m on the device, so one captured graph serves every
masked_m. Exact and timed on the H200 (tests/test_masked_gpu.py, bench/bench_masked.py; bench/
RESULTS.md, "Masked layout"); its host side is also tested on the CPU.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .dispatch import dynamic_groups
from .errors import InputError, NoKernelError
from .formats import MN_LIMIT, blocked_scale_numel
from .manifest import KernelEntry
from .serving import _tensor, check_devices, must
from .validate import (
    _FP4,
    _FP4_NAMES,
    _SF,
    _SF_NAMES,
    OUT_TORCH_DTYPES,
    check_alpha,
    check_out_overlap,
    out_dtype_name,
)


def check_masked_sizes(experts: Any, max_m: Any, half_k: Any, b_shape: tuple, masked_len: Any,
                       sfa_shape: tuple, sfb_shape: tuple, require: Any = must) -> None:
    """The size checks of a masked_grouped_mm call over sizes alone (ints, or the SymInts of
    the torch op's fake: serving.check_serving_sizes' twin)."""
    require(tuple(b_shape[::2]) == (experts, half_k), lambda: (
        f"b must have shape (E, N, K/2) = ({experts}, N, {half_k}) (a's E and K/2), but got "
        f"{tuple(b_shape)}"))
    n = b_shape[1]
    require(experts > 0 and n > 0, lambda: f"b must have E > 0 experts of N > 0 rows, but got "
                                           f"{tuple(b_shape)}")
    require(half_k > 0 and half_k % 8 == 0,
            lambda: f"a.shape[2] (K/2) must be a positive multiple of 8, but got {half_k}")
    k = 2 * half_k
    require(masked_len == experts, lambda: f"masked_m must have shape ({experts},) (one row "
                                           f"count per expert), but got ({masked_len},)")
    for name, shape, rows in (("sfa", sfa_shape, max_m), ("sfb", sfb_shape, n)):
        want = experts * blocked_scale_numel(rows, k)
        numel = math.prod(shape)  # ints or SymInts
        require(numel == want, lambda name=name, want=want, numel=numel, shape=shape, rows=rows: (
            f"{name} must have {want} elements ((E, round_up({rows}, 128) * round_up(K/16, 4)) "
            f"blocked), but got {numel} (shape {tuple(shape)})"))
    require(max_m * n < MN_LIMIT, lambda: f"a.shape[1] (max_m) must keep max_m * N < 2^31 "
                                          f"(N = {n}), but got {max_m}")


def check_masked(a: Any, b: Any, sfa: Any, sfb: Any, masked_m: Any, expected_m: Any,
                 alpha: Any, out: Any, out_dtype: Any) -> dict[str, Any]:
    """Every check of a masked_grouped_mm call that reads nothing from the GPU; returns the
    call's host-known facts."""
    a = _tensor("a", a, _FP4, _FP4_NAMES, 3, "(E, max_m, K/2) packed fp4")
    b = _tensor("b", b, _FP4, _FP4_NAMES, 3, "(E, N, K/2) packed fp4")
    sfa = _tensor("sfa", sfa, _SF, _SF_NAMES, 0, "")
    sfb = _tensor("sfb", sfb, _SF, _SF_NAMES, 0, "")
    masked_m = _tensor("masked_m", masked_m, (torch.int32,), "torch.int32", 1, "(E,)")
    experts, max_m, half_k = a.shape
    check_masked_sizes(experts, max_m, half_k, tuple(b.shape), masked_m.shape[0],
                       tuple(sfa.shape), tuple(sfb.shape))
    n, k = b.shape[1], 2 * half_k
    if expected_m is not None and (not isinstance(expected_m, int) or isinstance(
            expected_m, bool) or expected_m < 0):
        raise InputError(f"expected_m must be None or an int >= 0 (a host hint of the rows per "
                         f"expert), but got {expected_m!r}")
    if out is not None:
        out = _tensor("out", out, tuple(OUT_TORCH_DTYPES.values()),
                      "torch.float16 or torch.bfloat16", 3, "(E, max_m, N)")
        if tuple(out.shape) != (experts, max_m, n):
            raise InputError(f"out must have shape (E, max_m, N) = {(experts, max_m, n)}, but "
                             f"got {tuple(out.shape)}")
    dtype = out_dtype_name([out] if out is not None else None, out_dtype)
    ordinal = check_devices((("a", a), ("b", b), ("sfa", sfa), ("sfb", sfb)), "masked_m",
                            masked_m, out)
    alpha_ptr = 0 if alpha is None else check_alpha(alpha, experts, ordinal)
    check_out_overlap(out, (("a", a), ("b", b), ("sfa", sfa), ("sfb", sfb),
                            ("masked_m", masked_m), ("alpha", alpha)))
    return {"experts": experts, "max_m": max_m, "n": n, "k": k, "dtype": dtype,
            "ordinal": ordinal, "alpha_ptr": alpha_ptr, "out": out}


def select_masked(kernels: tuple[KernelEntry, ...], arch: str | None, experts: int, n: int,
                  k: int, hint: int, dtype: str) -> KernelEntry:
    """The masked-layout kernel for E experts of (N, K) writing `dtype`: the one with the
    smallest T bound (the set's max_m) that covers `hint` rows per expert (expected_m, else
    max_m), else one without a bound. Host-known values only."""
    want = tuple((n, k) for _ in range(experts))
    best, best_bound = None, None
    for e in kernels:
        dyn = dynamic_groups(e)
        if (e.arch != arch or e.out_dtype != dtype or not e.takes_masked or dyn is None
                or dyn[0] != want):
            continue
        bound = float("inf") if dyn[1] is None else dyn[1]
        if bound >= hint and (best_bound is None or bound < best_bound):
            best, best_bound = e, bound
    if best is not None:
        return best
    built = [f"  - {e.name}: {len(d[0])} x {d[0][0]}, max_m {d[1]}" for e in kernels
             if e.arch == arch and e.takes_masked and (d := dynamic_groups(e)) is not None]
    raise NoKernelError(
        f"no built kernel serves masked_grouped_mm with E = {experts} experts of (N, K) = "
        f"({n}, {k}) and {dtype} output on {arch} (rows hint {hint}); nothing was launched. "
        f"Declare an expert set with `options: {{sm_90a: {{masked: true}}}}` (experts: "
        f"{experts}, n: {n}, k: {k}). Masked-layout kernels built for {arch}:\n"
        + ("\n".join(built) or "  (none)"))


def masked_grouped_mm(gg: Any, a: Any, b: Any, sfa: Any, sfb: Any, masked_m: Any, *,
                      expected_m: Any = None, alpha: Any = None, out: Any = None,
                      out_dtype: Any = torch.bfloat16) -> torch.Tensor:
    """See the module docstring. Raises InputError / NoKernelError with nothing launched."""
    c = check_masked(a, b, sfa, sfb, masked_m, expected_m, alpha, out, out_dtype)
    rt = gg._runtime(c["ordinal"])
    e, max_m, n, k = c["experts"], c["max_m"], c["n"], c["k"]
    entry = select_masked(gg.kernels, rt.arch, e, n, k,
                          max_m if expected_m is None else expected_m, c["dtype"])
    out = c["out"]
    if out is None:
        out = torch.empty((e, max_m, n), dtype=OUT_TORCH_DTYPES[c["dtype"]],
                          device=rt.torch_device)
    if max_m == 0:
        return out
    op = rt.offsets_plan(entry, e, n, k, e * max_m)
    rt.launch_offsets(op, (masked_m.data_ptr(), a.data_ptr(), b.data_ptr(), sfa.data_ptr(),
                           sfb.data_ptr(), out.data_ptr()), c["alpha_ptr"])
    return out
