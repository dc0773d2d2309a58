"""`torch.ops.nvfp4.grouped_gemm`: the runtime as a torch.library custom op.

    import runtime.torch_op as nvfp4_op           # registers the ops (explicit: `import runtime`
    nvfp4_op.register(runtime.load("artifacts"))  # alone never pays for torch.library)
    outs = torch.ops.nvfp4.grouped_gemm(a_list, b_list, sfa_list, sfb_list)
    out = torch.ops.nvfp4.scaled_grouped_mm(a, b, sfa, sfb, offs)  # serving: stacked experts

Schemas:

    nvfp4::grouped_gemm(Tensor[] a, Tensor[] b, Tensor[] sfa, Tensor[] sfb,
                        str artifacts="default", Tensor? alpha=None,
                        ScalarType out_dtype=torch.float16) -> Tensor[]
    nvfp4::grouped_gemm_out(Tensor[] a, Tensor[] b, Tensor[] sfa, Tensor[] sfb,
                            Tensor(a!)[] out, str artifacts="default",
                            Tensor? alpha=None) -> ()
    nvfp4::scaled_grouped_mm(Tensor a, Tensor b, Tensor sfa, Tensor sfb, Tensor offs,
                             str artifacts="default", Tensor? alpha=None,
                             ScalarType out_dtype=torch.bfloat16) -> Tensor
    nvfp4::masked_grouped_mm(Tensor a, Tensor b, Tensor sfa, Tensor sfb, Tensor masked_m,
                             int expected_m=-1, str artifacts="default", Tensor? alpha=None,
                             ScalarType out_dtype=torch.bfloat16) -> Tensor
    nvfp4::act_quant_experts(Tensor x, Tensor offs, Tensor input_scale,
                             str artifacts="default") -> (Tensor, Tensor)
    nvfp4::act_quant_masked(Tensor x, Tensor input_scale, str artifacts="default",
                            Tensor? masked_m=None) -> (Tensor, Tensor)

act_quant_*: `GroupedGemm.quantize_experts` / `quantize_masked` (runtime/quantize.py: the
artifacts' AOT activation quantizers), input_scale a float32 (E,) tensor of decode scales.

Arguments and results are those of `GroupedGemm.grouped_gemm`: per group a (m, k/2) and b
(n, k/2) packed fp4, sfa / sfb blocked e4m3 scales, alpha an optional float32 (G,) CUDA tensor,
(m, n) out in out_dtype (bf16 or fp16; out's own dtype for grouped_gemm_out).

How the op finds its kernels. A custom op can only take tensors, numbers and strings, so the
GroupedGemm is named by the string `artifacts`, a key into this module's registry:
- `register(gg_or_spec, name="default")` stores a GroupedGemm under `name`;
- a key that was never registered is loaded once and cached: "default" means the only
  installed artifact package (runtime.packages), "pkg:<name>" a named one, anything else an
  artifact directory.
Why a string key: torch.compile bakes it into the graph as a constant (no guard on an object,
no graph break, and the graph stays serializable); the fake implementation never reads the
registry, so tracing needs neither artifacts nor a GPU; and the real implementation is one
dict lookup before `GroupedGemm.grouped_gemm`, which launches on the current stream without
synchronizing and allocates outputs with torch, so CUDA graph capture (torch.cuda.graph or
torch.compile mode="reduce-overhead") records the launch and the outputs come from the graph's
pool. Capture with the same key and shapes you replay with; replays reuse captured pointers.

Per-group global scales: `alpha` (runtime.nvfp4.quantize_grouped returns it), applied by the
kernel's epilogue to the fp32 accumulator.

Host cost: a custom op call goes through the dispatcher and back into Python (tens of
microseconds more than calling `gg.grouped_gemm` directly); inside a CUDA graph it is free.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .activations import (
    _check_masked_m,
    _check_masked_x,
    _check_offs,
    _check_scales,
    _check_x,
    _quantize_experts_fake,
    _quantize_masked_fake,
)
from .errors import InputError
from .masked import check_masked_sizes
from .serving import check_serving_sizes

__all__ = ["DEFAULT", "grouped_gemm", "lookup", "masked_grouped_mm", "register", "registered",
           "scaled_grouped_mm", "unregister"]

DEFAULT = "default"
NAMESPACE = "nvfp4"

_registry: dict[str, Any] = {}
_lock = threading.Lock()
# Accepted dtypes, for trace-time errors; the runtime's own checks are the authority.
_FP4 = tuple(d for d in (getattr(torch, "float4_e2m1fn_x2", None), torch.uint8) if d is not None)
_SF = (torch.float8_e4m3fn, torch.uint8)
_OUT = (torch.bfloat16, torch.float16)


def register(gg_or_spec: Any, name: str = DEFAULT) -> str:
    """Serve key `name` with a GroupedGemm, or with what `runtime.load(spec)` opens for a str
    or path ("pkg:<name>" selects an installed artifact package). Returns `name`."""
    if not isinstance(name, str) or not name:
        raise InputError(f"name must be a non-empty str, but got {name!r}")
    gg = _open(gg_or_spec) if isinstance(gg_or_spec, (str, Path)) else gg_or_spec
    if not callable(getattr(gg, "grouped_gemm", None)):
        raise InputError("register takes a runtime.GroupedGemm, an artifact directory or "
                         f"'pkg:<name>', but got {type(gg_or_spec).__name__}")
    with _lock:
        _registry[name] = gg
    return name


def unregister(name: str = DEFAULT) -> None:
    with _lock:
        _registry.pop(name, None)


def registered() -> dict[str, Any]:
    """A snapshot of the registry: key -> GroupedGemm."""
    with _lock:
        return dict(_registry)


def _open(spec: str | Path | None) -> Any:
    from .api import load
    from .packages import resolve

    return load(resolve(spec))


def lookup(name: str = DEFAULT) -> Any:
    """The GroupedGemm serving key `name`, loading and caching an unregistered key (see the
    module docstring). Raises ManifestError when there is nothing to load."""
    gg = _registry.get(name)
    if gg is None:
        with _lock:
            gg = _registry.get(name)
            if gg is None:
                gg = _registry[name] = _open(None if name == DEFAULT else name)
    return gg


# --------------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------------


def _require(cond: Any, message: Any) -> None:
    """InputError for a concrete False; a deferred runtime assert for a symbolic condition
    (torch.compile with dynamic shapes), which must not be turned into a guard."""
    if isinstance(cond, bool):
        if not cond:
            raise InputError(message())
    else:
        torch._check(cond, message)


def _check_counts(a: Sequence[Tensor], b: Sequence[Tensor], sfa: Sequence[Tensor],
                  sfb: Sequence[Tensor]) -> None:
    # Also run by the real ops before the registry: a call with no tensors at all dispatches
    # to the default (real) kernel even while tracing, as there is no device to dispatch on.
    counts = [len(a), len(b), len(sfa), len(sfb)]
    if len(set(counts)) != 1 or not counts[0]:
        raise InputError(f"a, b, sfa and sfb must have the same non-zero number of groups, "
                         f"but got {counts}")


def _fake_check(a: Sequence[Tensor], b: Sequence[Tensor], sfa: Sequence[Tensor],
                sfb: Sequence[Tensor]) -> None:
    """Structural checks at trace time, so a wrong call fails while compiling, not at run time.
    Shapes may be symbolic: only what holds for every value is compared."""
    _check_counts(a, b, sfa, sfb)
    for g, (x, y, sx, sy) in enumerate(zip(a, b, sfa, sfb)):
        if x.dim() != 2 or y.dim() != 2:
            raise InputError(f"a[{g}] and b[{g}] must be 2-D (rows, k/2), but got shapes "
                             f"{tuple(x.shape)} and {tuple(y.shape)}")
        if x.dtype not in _FP4 or y.dtype not in _FP4:
            raise InputError(f"a[{g}] and b[{g}] must be one of {list(_FP4)}, but got "
                             f"{x.dtype} and {y.dtype}")
        if sx.dtype not in _SF or sy.dtype not in _SF:
            raise InputError(f"sfa[{g}] and sfb[{g}] must be one of {list(_SF)}, but got "
                             f"{sx.dtype} and {sy.dtype}")
        _require(x.shape[1] == y.shape[1],
                 lambda g=g, x=x, y=y: f"a[{g}] and b[{g}] must have the same k/2, but got "
                                       f"{x.shape[1]} and {y.shape[1]}")


def _fake_alpha(alpha: Tensor | None, groups: int) -> None:
    """alpha's trace-time checks (the runtime's check_alpha is the authority)."""
    if alpha is None:
        return
    if alpha.dtype != torch.float32 or alpha.dim() != 1:
        raise InputError(f"alpha must be a 1-D torch.float32 tensor, but got {alpha.dtype} of "
                         f"shape {tuple(alpha.shape)}")
    _require(alpha.shape[0] == groups,
             lambda: f"alpha must have shape ({groups},), but got {tuple(alpha.shape)}")


@torch.library.custom_op(f"{NAMESPACE}::grouped_gemm", mutates_args=())
def _grouped_gemm(a: list[Tensor], b: list[Tensor], sfa: list[Tensor], sfb: list[Tensor],
                  artifacts: str = DEFAULT, alpha: Tensor | None = None,
                  out_dtype: torch.dtype = torch.float16) -> list[Tensor]:
    _check_counts(a, b, sfa, sfb)
    return lookup(artifacts).grouped_gemm(a, b, sfa, sfb, alpha=alpha, out_dtype=out_dtype)


@_grouped_gemm.register_fake
def _grouped_gemm_fake(a: list[Tensor], b: list[Tensor], sfa: list[Tensor], sfb: list[Tensor],
                       artifacts: str = DEFAULT, alpha: Tensor | None = None,
                       out_dtype: torch.dtype = torch.float16) -> list[Tensor]:
    _fake_check(a, b, sfa, sfb)
    _fake_alpha(alpha, len(a))
    if out_dtype not in _OUT:
        raise InputError(f"out_dtype must be one of {list(_OUT)}, but got {out_dtype}")
    return [x.new_empty((x.shape[0], y.shape[0]), dtype=out_dtype) for x, y in zip(a, b)]


@torch.library.custom_op(f"{NAMESPACE}::grouped_gemm_out", mutates_args=("out",))
def _grouped_gemm_out(a: list[Tensor], b: list[Tensor], sfa: list[Tensor], sfb: list[Tensor],
                      out: list[Tensor], artifacts: str = DEFAULT,
                      alpha: Tensor | None = None) -> None:
    _check_counts(a, b, sfa, sfb)
    lookup(artifacts).grouped_gemm(a, b, sfa, sfb, out=out, alpha=alpha)


@_grouped_gemm_out.register_fake
def _grouped_gemm_out_fake(a: list[Tensor], b: list[Tensor], sfa: list[Tensor],
                           sfb: list[Tensor], out: list[Tensor],
                           artifacts: str = DEFAULT, alpha: Tensor | None = None) -> None:
    _fake_check(a, b, sfa, sfb)
    _fake_alpha(alpha, len(a))
    if len(out) != len(a):
        raise InputError(f"out must have {len(a)} tensors, but got {len(out)}")
    for g, (x, y, c) in enumerate(zip(a, b, out)):
        if c.dtype not in _OUT or c.dim() != 2 or c.dtype != out[0].dtype:
            raise InputError(f"out[{g}] must be a 2-D torch.bfloat16 or torch.float16 tensor "
                             f"(all of one dtype), but got {c.dtype} of shape "
                             f"{tuple(c.shape)}")
        for dim, want in ((0, x.shape[0]), (1, y.shape[0])):
            _require(c.shape[dim] == want,
                     lambda g=g, c=c, x=x, y=y: f"out[{g}] must have shape (m, n) = "
                                                f"({x.shape[0]}, {y.shape[0]}), but got "
                                                f"{tuple(c.shape)}")


@torch.library.custom_op(f"{NAMESPACE}::scaled_grouped_mm", mutates_args=())
def _scaled_grouped_mm(a: Tensor, b: Tensor, sfa: Tensor, sfb: Tensor, offs: Tensor,
                       artifacts: str = DEFAULT, alpha: Tensor | None = None,
                       out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    return lookup(artifacts).scaled_grouped_mm(a, b, sfa, sfb, offs, alpha=alpha,
                                               out_dtype=out_dtype)


@_scaled_grouped_mm.register_fake
def _scaled_grouped_mm_fake(a: Tensor, b: Tensor, sfa: Tensor, sfb: Tensor, offs: Tensor,
                            artifacts: str = DEFAULT, alpha: Tensor | None = None,
                            out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """The serving op's trace-time checks (runtime/serving.py is the authority) and its output:
    (T, N) in out_dtype; rows past offs[-1] are left unwritten by the kernel."""
    if a.dim() != 2 or b.dim() != 3:
        raise InputError(f"a must be (T, K/2) and b (E, N, K/2), but got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    _fake_dtypes(a, b, sfa, sfb, "offs", offs)
    _fake_devices(a, (("b", b), ("sfa", sfa), ("sfb", sfb), ("offs", offs), ("alpha", alpha)))
    check_serving_sizes(a.shape[0], b.shape[0], b.shape[1], a.shape[1], b.shape[2],
                        offs.shape[0], sfa.numel(), tuple(sfb.shape), require=_require)
    _fake_alpha(alpha, b.shape[0])
    if out_dtype not in _OUT:
        raise InputError(f"out_dtype must be one of {list(_OUT)}, but got {out_dtype}")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _fake_devices(a: Tensor, others: tuple) -> None:
    """Every tensor on a's device, at trace time (the runtime also asks for CUDA)."""
    for name, x in others:
        if x is not None and x.device != a.device:
            raise InputError(f"{name} must be on a's device {a.device}, but got a tensor on "
                             f"{x.device}")


def _fake_dtypes(a: Tensor, b: Tensor, sfa: Tensor, sfb: Tensor, index_name: str,
                 index: Tensor) -> None:
    """The stacked-experts ops' dtype checks at trace time: fp4 a and b, e4m3 scales, a 1-D
    int32 index tensor (offs or masked_m)."""
    if a.dtype not in _FP4 or b.dtype not in _FP4:
        raise InputError(f"a and b must be one of {list(_FP4)}, but got {a.dtype} and {b.dtype}")
    if sfa.dtype not in _SF or sfb.dtype not in _SF:
        raise InputError(f"sfa and sfb must be one of {list(_SF)}, but got {sfa.dtype} and "
                         f"{sfb.dtype}")
    if index.dtype != torch.int32 or index.dim() != 1:
        raise InputError(f"{index_name} must be a 1-D torch.int32 tensor, but got "
                         f"{index.dtype} of shape {tuple(index.shape)}")


@torch.library.custom_op(f"{NAMESPACE}::masked_grouped_mm", mutates_args=())
def _masked_grouped_mm(a: Tensor, b: Tensor, sfa: Tensor, sfb: Tensor, masked_m: Tensor,
                       expected_m: int = -1, artifacts: str = DEFAULT,
                       alpha: Tensor | None = None,
                       out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    return lookup(artifacts).masked_grouped_mm(
        a, b, sfa, sfb, masked_m, expected_m=None if expected_m == -1 else expected_m,
        alpha=alpha, out_dtype=out_dtype)


@_masked_grouped_mm.register_fake
def _masked_grouped_mm_fake(a: Tensor, b: Tensor, sfa: Tensor, sfb: Tensor, masked_m: Tensor,
                            expected_m: int = -1, artifacts: str = DEFAULT,
                            alpha: Tensor | None = None,
                            out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """The masked op's trace-time checks (runtime/masked.py is the authority) and its output:
    (E, max_m, N) in out_dtype; rows past masked_m[e] are left unwritten by the kernel.
    expected_m: -1 for none (a schema int cannot be None-defaulted portably)."""
    if a.dim() != 3 or b.dim() != 3:
        raise InputError(f"a must be (E, max_m, K/2) and b (E, N, K/2), but got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    _fake_dtypes(a, b, sfa, sfb, "masked_m", masked_m)
    _fake_devices(a, (("b", b), ("sfa", sfa), ("sfb", sfb), ("masked_m", masked_m),
                      ("alpha", alpha)))
    check_masked_sizes(a.shape[0], a.shape[1], a.shape[2], tuple(b.shape), masked_m.shape[0],
                       tuple(sfa.shape), tuple(sfb.shape), require=_require)
    if expected_m < -1:
        raise InputError(f"expected_m must be -1 (none) or an int >= 0 (a host hint of the rows "
                         f"per expert), but got {expected_m}")
    _fake_alpha(alpha, b.shape[0])
    if out_dtype not in _OUT:
        raise InputError(f"out_dtype must be one of {list(_OUT)}, but got {out_dtype}")
    return a.new_empty((a.shape[0], a.shape[1], b.shape[1]), dtype=out_dtype)


def masked_grouped_mm(a: Tensor, b: Tensor, sfa: Tensor, sfb: Tensor, masked_m: Tensor, *,
                      expected_m: int | None = None, artifacts: str = DEFAULT,
                      alpha: Tensor | None = None,
                      out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """torch.ops.nvfp4.masked_grouped_mm with keyword arguments (GroupedGemm.masked_grouped_mm
    as a custom op: the masked layout, masked_m on the device, traceable by torch.compile)."""
    return torch.ops.nvfp4.masked_grouped_mm(a, b, sfa, sfb, masked_m,
                                             -1 if expected_m is None else expected_m,
                                             artifacts, alpha, out_dtype)


def scaled_grouped_mm(a: Tensor, b: Tensor, sfa: Tensor, sfb: Tensor, offs: Tensor, *,
                      artifacts: str = DEFAULT, alpha: Tensor | None = None,
                      out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """torch.ops.nvfp4.scaled_grouped_mm with keyword arguments (GroupedGemm.scaled_grouped_mm
    as a custom op: one stacked weight tensor, device offsets, traceable by torch.compile)."""
    return torch.ops.nvfp4.scaled_grouped_mm(a, b, sfa, sfb, offs, artifacts, alpha, out_dtype)


def grouped_gemm(a: Sequence[Tensor], b: Sequence[Tensor], sfa: Sequence[Tensor],
                 sfb: Sequence[Tensor], *, out: Sequence[Tensor] | None = None,
                 artifacts: str = DEFAULT, alpha: Tensor | None = None,
                 out_dtype: torch.dtype = torch.float16) -> list[Tensor]:
    """The op with keyword arguments: `out=` selects `grouped_gemm_out` and returns `out`
    (whose dtype then decides the output type)."""
    if out is None:
        return torch.ops.nvfp4.grouped_gemm(list(a), list(b), list(sfa), list(sfb), artifacts,
                                            alpha, out_dtype)
    out = list(out)
    torch.ops.nvfp4.grouped_gemm_out(list(a), list(b), list(sfa), list(sfb), out, artifacts,
                                     alpha)
    return out


@torch.library.custom_op(f"{NAMESPACE}::act_quant_experts", mutates_args=())
def _act_quant_experts(x: Tensor, offs: Tensor, input_scale: Tensor,
                       artifacts: str = DEFAULT) -> tuple[Tensor, Tensor]:
    return lookup(artifacts).quantize_experts(x, offs, input_scale)


@_act_quant_experts.register_fake
def _act_quant_experts_fake(x: Tensor, offs: Tensor, input_scale: Tensor,
                            artifacts: str = DEFAULT) -> tuple[Tensor, Tensor]:
    """The eager checks (runtime/activations.py) and the outputs: a uint8 (T, K // 2), sfa
    e4m3 1-D with room for any routing."""
    x = _check_x(x, 2, "(T, K)")
    offs = _check_offs(offs, x.device)
    _check_scales(input_scale, offs.shape[0], x.device)
    return _quantize_experts_fake(x, offs, input_scale)


@torch.library.custom_op(f"{NAMESPACE}::act_quant_masked", mutates_args=())
def _act_quant_masked(x: Tensor, input_scale: Tensor, artifacts: str = DEFAULT,
                      masked_m: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return lookup(artifacts).quantize_masked(x, input_scale, masked_m)


@_act_quant_masked.register_fake
def _act_quant_masked_fake(x: Tensor, input_scale: Tensor, artifacts: str = DEFAULT,
                           masked_m: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The eager checks and the outputs: a uint8 (E, max_m, K // 2), sfa e4m3 (E, blocked)."""
    x = _check_masked_x(x)
    _check_scales(input_scale, x.shape[0], x.device)
    _check_masked_m(masked_m, x.shape[0], x.device)
    return _quantize_masked_fake(x, input_scale, masked_m)
