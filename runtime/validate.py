"""Input checks of `grouped_gemm`, run before anything is launched (Runtime rules).

`check_inputs` is the entry point. Its fast path reads each tensor's attributes once, builds no
strings and returns shapes, device and data pointers; at the first doubt it defers to the
detailed checks, which either raise the exact error or accept (e.g. an unaligned but empty
view). Host time per call is part of the product (measured on the H200 host: ~0.1 us per
tensor attribute, so string formatting and helper calls in the common path cost as much as the
checks themselves).

The detailed checks are pure functions over `TensorDesc`, a small description of each tensor
(dtype, device, layout, shape, strides, data pointer, element size): `describe` turns a tensor
into one and passes anything else through, so the checks also name a non-tensor argument. A
test can therefore hand them CUDA tensors that do not exist (another GPU, an unaligned device
pointer) on a machine with no GPU. They run in three phases, in this order:
1. `structure_of`: containers, types, layout, dtypes, shapes, scale sizes, contiguity.
2. `placement_of`: one CUDA device for all tensors, and the 16-byte alignment TMA needs.
3. `overlap_of`: no output shares a byte with an input or another output (the launch path runs
   it lazily, see runtime/api.py).
`check_constraints` says which group breaks a kernel's k / n multiple when no kernel serves a
call. Messages follow "x must be ..., but got ..." and name the argument and group index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .errors import InputError
from .formats import blocked_scale_numel

Shape = tuple[int, int, int]

# Packed e2m1 pairs: torch.float4_e2m1fn_x2 where this torch has it, else raw bytes.
_FP4 = tuple(d for d in (getattr(torch, "float4_e2m1fn_x2", None), torch.uint8) if d is not None)
_SF = (torch.float8_e4m3fn, torch.uint8)
_FP4_NAMES = " or ".join(str(d) for d in _FP4)
_SF_NAMES = " or ".join(str(d) for d in _SF)
ALIGN = 16  # TMA needs 16-byte aligned global addresses
# Output element types, by manifest name (runtime.manifest.OUT_DTYPES): one kernel per type.
OUT_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
_OUT = tuple(OUT_TORCH_DTYPES.values())
_OUT_NAMES = " or ".join(str(d) for d in _OUT)
_LISTS = ("a_list", "b_list", "sfa_list", "sfb_list", "out")


# --------------------------------------------------------------------------------------------
# Fast path
# --------------------------------------------------------------------------------------------


def _fast(a_list: Any, b_list: Any, sfa_list: Any, sfb_list: Any, out: Any,
          cuda: bool = True) -> tuple[tuple[Shape, ...], int, tuple[list[int], ...]] | None:
    """The common case in one pass, or None when anything needs a closer look.

    Must never accept what the detailed checks reject (tested). `cuda=False` skips the device
    test so the CPU tests can compare both paths.
    """
    seq = (list, tuple)
    if (type(a_list) not in seq or type(b_list) not in seq or type(sfa_list) not in seq
            or type(sfb_list) not in seq or (out is not None and type(out) not in seq)):
        return None
    count = len(a_list)
    if (not count or len(b_list) != count or len(sfa_list) != count or len(sfb_list) != count
            or (out is not None and len(out) != count)):
        return None
    fp4, sf = _FP4, _SF
    c_dtype = getattr(out[0], "dtype", None) if out is not None else None
    if out is not None and c_dtype not in _OUT:
        return None
    shapes = []
    pa, pb, psa, psb, pc = [], [], [], [], []
    try:
        ordinal = a_list[0].get_device() if cuda else -1
        if cuda and ordinal < 0:
            return None
        for g in range(count):
            a, b, sa, sb = a_list[g], b_list[g], sfa_list[g], sfb_list[g]
            if (a.dtype not in fp4 or b.dtype not in fp4 or sa.dtype not in sf
                    or sb.dtype not in sf):
                return None
            ash, bsh = a.shape, b.shape
            if len(ash) != 2 or len(bsh) != 2:
                return None
            m, half_k = ash
            n, b_half_k = bsh
            if b_half_k != half_k or half_k <= 0 or half_k % 8:
                return None
            # formats.blocked_scale_numel, inlined: two calls per group cost about 1 us per
            # 8-group call on this path (measured); the fast-path tests build their scales
            # with blocked_scale_numel, so a disagreement fails them.
            cols = (half_k + 31) // 32 * 4  # ceil(k / 64) * 4 scale columns, k = 2 * half_k
            if (sa.numel() != (m + 127) // 128 * 128 * cols
                    or sb.numel() != (n + 127) // 128 * 128 * cols):
                return None
            if not (a.is_contiguous() and b.is_contiguous() and sa.is_contiguous()
                    and sb.is_contiguous()):
                return None
            if cuda and (a.get_device() != ordinal or b.get_device() != ordinal
                         or sa.get_device() != ordinal or sb.get_device() != ordinal):
                return None
            ptrs = (a.data_ptr(), b.data_ptr(), sa.data_ptr(), sb.data_ptr())
            if (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3]) & (ALIGN - 1):
                return None
            if out is not None:
                c = out[g]
                if (c.dtype is not c_dtype or c.shape != (m, n) or not c.is_contiguous()
                        or (cuda and c.get_device() != ordinal)):
                    return None
                pc_g = c.data_ptr()
                if pc_g & (ALIGN - 1):
                    return None
                pc.append(pc_g)
            pa.append(ptrs[0])
            pb.append(ptrs[1])
            psa.append(ptrs[2])
            psb.append(ptrs[3])
            shapes.append((m, n, 2 * half_k))
    except (AttributeError, TypeError, ValueError, RuntimeError):
        # Not tensors, not unpackable, or no storage (sparse, nested): the detailed checks
        # say what.
        return None
    return tuple(shapes), ordinal, (pa, pb, psa, psb, pc)


def check_inputs(a_list: Any, b_list: Any, sfa_list: Any, sfb_list: Any,
                 out: Any) -> tuple[tuple[Shape, ...], int, tuple[list[int], ...]]:
    """Validate a call. Returns (m, n, k) per group, the device ordinal, and the data pointers
    of (a, b, sfa, sfb, out) per group (out's list is empty when `out` is None)."""
    fast = _fast(a_list, b_list, sfa_list, sfb_list, out)
    if fast is not None:
        return fast
    descs = describe_call(a_list, b_list, sfa_list, sfb_list, out)
    shapes, ordinal = check_described(*descs)
    ptrs = tuple([d.data_ptr for d in seq] for seq in descs[:4])
    outs = [d.data_ptr for d in descs[4]] if descs[4] is not None else []
    return shapes, ordinal, (*ptrs, outs)


# --------------------------------------------------------------------------------------------
# Tensor descriptions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorDesc:
    """What the detailed checks read from a tensor; build one by hand to test a case that
    needs hardware this machine lacks (`dataclasses.replace(describe(t), device=...)`)."""

    dtype: torch.dtype
    device: torch.device
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    data_ptr: int
    itemsize: int
    layout: torch.layout = torch.strided
    nested: bool = False  # a nested tensor (no single shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        """Bytes from data_ptr to one past the last element (0 when empty)."""
        if not self.shape:
            return self.itemsize
        if any(s <= 0 for s in self.shape):
            return 0
        last = sum((s - 1) * st for s, st in zip(self.shape, self.stride, strict=False))
        return (last + 1) * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        """torch's rule: row-major strides, ignoring dims of size 1; empty is contiguous."""
        if (self.nested or self.layout is not torch.strided
                or len(self.stride) != len(self.shape)):
            return False
        if 0 in self.shape:
            return True
        expected = 1
        for size, st in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size != 1:
                if st != expected:
                    return False
                expected *= size
        return True


def describe(t: Any) -> Any:
    """A TensorDesc of `t`, or `t` itself when it is not a tensor (the checks name its type)."""
    if not isinstance(t, torch.Tensor):
        return t
    layout, nested = t.layout, bool(t.is_nested)
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    if not nested:  # nested tensors have no single shape or strides
        shape = tuple(int(s) for s in t.shape)
        if layout is torch.strided:
            stride = tuple(int(s) for s in t.stride())
    try:
        ptr = int(t.data_ptr())
    except RuntimeError:  # no storage (sparse): the layout check reports it first
        ptr = 0
    return TensorDesc(dtype=t.dtype, device=t.device, shape=shape, stride=stride,
                      data_ptr=ptr, itemsize=t.element_size(), layout=layout, nested=nested)


def describe_call(a_list: Any, b_list: Any, sfa_list: Any, sfb_list: Any,
                  out: Any) -> tuple[Any, Any, Any, Any, Any]:
    """The five arguments with every tensor inside a list or tuple described; containers of
    another type (and a bare tensor in place of a list) are kept for the checks to name."""
    def seq(value: Any) -> Any:
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Tensor):
            return [describe(t) for t in value]
        return value

    return (seq(a_list), seq(b_list), seq(sfa_list), seq(sfb_list),
            None if out is None else seq(out))


def check_described(a: Any, b: Any, sfa: Any, sfb: Any,
                    out: Any) -> tuple[tuple[Shape, ...], int]:
    """Phases 1 and 2 over descriptions: (m, n, k) per group and the device ordinal."""
    shapes = structure_of(a, b, sfa, sfb, out)
    return shapes, placement_of(a, b, sfa, sfb, out)


# --------------------------------------------------------------------------------------------
# Phase 1: structure
# --------------------------------------------------------------------------------------------


def _sequence(name: str, value: Any, count: int | None) -> Sequence[Any]:
    if (isinstance(value, (torch.Tensor, TensorDesc))
            or not isinstance(value, (list, tuple))):
        kind = "Tensor" if isinstance(value, TensorDesc) else type(value).__name__
        raise InputError(f"{name} must be a list or tuple of tensors, but got {kind}")
    if count is None and not value:
        raise InputError(f"{name} must hold at least one tensor (one per group), but got an "
                         "empty list")
    if count is not None and len(value) != count:
        raise InputError(f"{name} must have {count} tensors (one per group, like a_list), "
                         f"but got {len(value)}")
    return value


def _tensor(name: str, t: Any, dtypes: tuple[torch.dtype, ...], names: str) -> TensorDesc:
    if isinstance(t, torch.Tensor):
        t = describe(t)
    if not isinstance(t, TensorDesc):
        raise InputError(f"{name} must be a torch.Tensor, but got {type(t).__name__}")
    if t.nested:
        raise InputError(f"{name} must be a dense tensor (layout torch.strided), but got a "
                         "nested tensor")
    if t.layout is not torch.strided:
        raise InputError(f"{name} must be a dense tensor (layout torch.strided), but got "
                         f"layout {t.layout}")
    if t.dtype not in dtypes:
        raise InputError(f"{name} must have dtype {names}, but got {t.dtype}")
    if any(s < 0 for s in t.shape):
        raise InputError(f"{name} must have sizes >= 0, but got shape {t.shape}")
    return t


def _packed_2d(name: str, t: TensorDesc, what: str) -> tuple[int, int]:
    if len(t.shape) != 2:
        raise InputError(f"{name} must be 2-D {what}, but got shape {t.shape}")
    return t.shape[0], t.shape[1]


def _contiguous(name: str, t: TensorDesc) -> None:
    if not t.is_contiguous:
        raise InputError(f"{name} must be contiguous, but got strides {t.stride} "
                         f"for shape {t.shape}")


def structure_of(a_list: Any, b_list: Any, sfa_list: Any, sfb_list: Any,
                 out: Any) -> tuple[Shape, ...]:
    """Phase 1 over descriptions (tensors are described on the fly): everything but devices
    and addresses. Returns (m, n, k) per group."""
    a_seq = _sequence("a_list", a_list, None)
    g_count = len(a_seq)
    b_seq = _sequence("b_list", b_list, g_count)
    sfa_seq = _sequence("sfa_list", sfa_list, g_count)
    sfb_seq = _sequence("sfb_list", sfb_list, g_count)
    out_seq = None if out is None else _sequence("out", out, g_count)
    out_dtype = None
    shapes = []
    for g in range(g_count):
        a = _tensor(f"a_list[{g}]", a_seq[g], _FP4, _FP4_NAMES)
        b = _tensor(f"b_list[{g}]", b_seq[g], _FP4, _FP4_NAMES)
        sfa = _tensor(f"sfa_list[{g}]", sfa_seq[g], _SF, _SF_NAMES)
        sfb = _tensor(f"sfb_list[{g}]", sfb_seq[g], _SF, _SF_NAMES)
        m, half_k = _packed_2d(f"a_list[{g}]", a, "(m, k/2) packed fp4")
        n, b_half_k = _packed_2d(f"b_list[{g}]", b, "(n, k/2) packed fp4")
        if b_half_k != half_k:
            raise InputError(f"b_list[{g}].shape[1] must equal a_list[{g}].shape[1] = {half_k} "
                             f"(k/2 bytes, k = {2 * half_k}), but got {b_half_k}")
        if half_k <= 0 or half_k % 8:
            raise InputError(f"a_list[{g}].shape[1] (k/2) must be a positive multiple of 8 "
                             f"(k a multiple of 16: one scale per 16 values), but got {half_k}")
        k = 2 * half_k
        for name, t, rows in ((f"sfa_list[{g}]", sfa, m), (f"sfb_list[{g}]", sfb, n)):
            want = blocked_scale_numel(rows, k)
            if t.numel != want:
                raise InputError(
                    f"{name} must have {want} elements (blocked scale layout: "
                    f"ceil({rows}/128)*128 rows x ceil({k}/64)*4 scale columns), "
                    f"but got {t.numel} (shape {t.shape})")
        for name, t in ((f"a_list[{g}]", a), (f"b_list[{g}]", b), (f"sfa_list[{g}]", sfa),
                        (f"sfb_list[{g}]", sfb)):
            _contiguous(name, t)
        if out_seq is not None:
            c = _tensor(f"out[{g}]", out_seq[g], _OUT, _OUT_NAMES)
            if g and c.dtype != out_dtype:
                raise InputError(f"out[{g}] must have out[0]'s dtype {out_dtype} (one kernel "
                                 f"writes every group), but got {c.dtype}")
            out_dtype = c.dtype
            if c.shape != (m, n):
                raise InputError(f"out[{g}] must have shape (m, n) = {(m, n)}, but got "
                                 f"{c.shape}")
            _contiguous(f"out[{g}]", c)
        shapes.append((m, n, k))
    return tuple(shapes)


def check_structure(a_list: Any, b_list: Any, sfa_list: Any, sfb_list: Any,
                    out: Any) -> tuple[Shape, ...]:
    """Phase 1 on the call's own arguments. Returns (m, n, k) per group."""
    return structure_of(*describe_call(a_list, b_list, sfa_list, sfb_list, out))


# --------------------------------------------------------------------------------------------
# Phase 2: placement
# --------------------------------------------------------------------------------------------


def _named(a_list: Sequence[Any], b_list: Sequence[Any], sfa_list: Sequence[Any],
           sfb_list: Sequence[Any], out: Sequence[Any] | None) -> list[tuple[str, TensorDesc]]:
    named = []
    for lname, seq in zip(_LISTS, (a_list, b_list, sfa_list, sfb_list, out), strict=True):
        if seq is not None:
            named.extend((f"{lname}[{g}]", describe(t)) for g, t in enumerate(seq))
    return named


def placement_of(a_list: Sequence[Any], b_list: Sequence[Any], sfa_list: Sequence[Any],
                 sfb_list: Sequence[Any], out: Sequence[Any] | None) -> int:
    """Phase 2 over descriptions (after phase 1): one CUDA device for all tensors, 16-byte
    aligned data. Returns the device ordinal."""
    named = _named(a_list, b_list, sfa_list, sfb_list, out)
    first = named[0][1]
    if first.device.type != "cuda":
        raise InputError(f"a_list[0] must be a CUDA tensor, but got a tensor on {first.device}")
    ordinal = first.device.index if first.device.index is not None else 0
    for name, t in named:
        if t.device.type != "cuda":
            raise InputError(f"{name} must be a CUDA tensor, but got a tensor on {t.device}")
        if (t.device.index if t.device.index is not None else 0) != ordinal:
            raise InputError(f"{name} must be on cuda:{ordinal} (the device of a_list[0]), "
                             f"but got {t.device}")
        if t.numel and t.data_ptr % ALIGN:
            raise InputError(f"{name} must start at a {ALIGN}-byte aligned address (TMA), "
                             f"but got data_ptr {t.data_ptr:#x}")
    return ordinal


def check_placement(a_list: Sequence[torch.Tensor], b_list: Sequence[torch.Tensor],
                    sfa_list: Sequence[torch.Tensor], sfb_list: Sequence[torch.Tensor],
                    out: Sequence[torch.Tensor] | None) -> int:
    """Phase 2 on the call's own tensors. Returns the device ordinal."""
    return placement_of(a_list, b_list, sfa_list, sfb_list, out)


# --------------------------------------------------------------------------------------------
# Phase 3: overlap
# --------------------------------------------------------------------------------------------


def overlap_of(a_list: Sequence[Any], b_list: Sequence[Any], sfa_list: Sequence[Any],
               sfb_list: Sequence[Any], out: Sequence[Any]) -> None:
    """No output may share a byte with an input or another output (over descriptions).

    One sort and sweep: for intervals in start order, an overlap involving an output is seen at
    the later interval of the pair, either as a later output starting before the furthest end
    so far, or as any interval starting before the furthest output end so far.
    """
    spans = []
    for name, t in _named(a_list, b_list, sfa_list, sfb_list, out):
        n = t.nbytes
        if n:
            spans.append((t.data_ptr, t.data_ptr + n, name.startswith("out["), name))
    spans.sort()
    end_all, name_all = -1, ""
    end_out, name_out = -1, ""
    for start, end, is_out, name in spans:
        if is_out and start < end_all:
            raise InputError(f"{name} must not overlap any other argument, but it overlaps "
                             f"{name_all}")
        if start < end_out:
            raise InputError(f"{name_out} must not overlap any other argument, but it overlaps "
                             f"{name}")
        if end > end_all:
            end_all, name_all = end, name
        if is_out and end > end_out:
            end_out, name_out = end, name


def check_no_overlap(a_list: Sequence[torch.Tensor], b_list: Sequence[torch.Tensor],
                     sfa_list: Sequence[torch.Tensor], sfb_list: Sequence[torch.Tensor],
                     out: Sequence[torch.Tensor]) -> None:
    """Phase 3 on the call's own tensors (after phases 1 and 2 accepted them)."""
    overlap_of(a_list, b_list, sfa_list, sfb_list, out)


# --------------------------------------------------------------------------------------------
# Against the built kernels
# --------------------------------------------------------------------------------------------


def check_constraints(shapes: Sequence[Shape], kernels: Sequence[Any], arch: str | None) -> None:
    """InputError naming the group and argument when a call's k or n is one that no kernel
    built for `arch` can take (constraints.k_multiple / n_multiple of every such kernel).

    For the miss path of kernel selection, where it turns "no kernel serves these shapes" into
    the reason: cheap, but not free, so it need not run on calls a kernel serves. Returns
    quietly when some kernel's multiples admit every group (the NoKernelError that follows
    lists what was built).
    """
    built = [e for e in kernels if e.arch == arch]
    if not built:
        return
    for key, what, arg in (("k_multiple", "k", "2 * a_list[{g}].shape[1]"),
                           ("n_multiple", "n", "b_list[{g}].shape[0]")):
        multiples = sorted({int(e.constraints.get(key) or 1) for e in built})
        col = 2 if what == "k" else 1
        for g, shape in enumerate(shapes):
            value = shape[col]
            if all(value % q for q in multiples):
                want = (f"a multiple of {multiples[0]}" if len(multiples) == 1
                        else f"a multiple of one of {multiples}")
                raise InputError(
                    f"{what} of group {g} ({arg.format(g=g)}) must be {want} "
                    f"(constraints.{key} of the {len(built)} {arch} kernel(s) built), "
                    f"but got {value}")


def out_dtype_name(out: Any, out_dtype: Any) -> str:
    """The manifest name of a validated call's output type: out's dtype when `out` is given
    (check_inputs has made every group's the same), else `out_dtype`."""
    dtype = out[0].dtype if out is not None and len(out) else out_dtype
    for name, d in OUT_TORCH_DTYPES.items():
        if dtype is d:
            return name
    raise InputError(f"out_dtype must be {_OUT_NAMES}, but got {dtype!r}")


def check_alpha(alpha: Any, groups: int, ordinal: int, name: str = "alpha") -> int:
    """The device address of a per-group alpha: a contiguous float32 CUDA tensor of shape
    (groups,) on the call's device. Never reads its values (no sync; graph-capturable)."""
    if not isinstance(alpha, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor of float32 of shape ({groups},) on "
                         f"cuda:{ordinal}, or None, but got {type(alpha).__name__}")
    if alpha.layout is not torch.strided or alpha.is_nested:
        raise InputError(f"{name} must be a dense tensor (layout torch.strided), but got "
                         f"{'a nested tensor' if alpha.is_nested else f'layout {alpha.layout}'}")
    if alpha.dtype is not torch.float32:
        raise InputError(f"{name} must have dtype torch.float32 (one fp32 scale per group), "
                         f"but got {alpha.dtype}")
    if tuple(alpha.shape) != (groups,):
        raise InputError(f"{name} must have shape ({groups},) (one value per group), but got "
                         f"{tuple(alpha.shape)}")
    if alpha.device.type != "cuda":
        raise InputError(f"{name} must be a CUDA tensor on cuda:{ordinal} (it is read by the "
                         f"kernel, never on the host), but got a tensor on {alpha.device}")
    if alpha.get_device() != ordinal:
        raise InputError(f"{name} must be on the call's device cuda:{ordinal}, but got "
                         f"{alpha.device}")
    if groups > 1 and alpha.stride(0) != 1:
        raise InputError(f"{name} must be contiguous, but got stride {alpha.stride()}")
    return alpha.data_ptr()


def check_out_overlap(out: torch.Tensor | None, named: tuple[tuple[str, Any], ...],
                      out_name: str = "out") -> None:
    """out must share no byte with an input (the kernel would read what it writes): the list
    API's rule (validate.overlap_of), for a call's one out and its named input tensors."""
    if out is None or not out.numel():
        return
    start = out.data_ptr()
    end = start + out.numel() * out.element_size()
    for name, x in named:
        if x is not None and x.numel():
            p = x.data_ptr()
            if p < end and start < p + x.numel() * x.element_size():
                raise InputError(f"{out_name} must not overlap any other argument, but it "
                                 f"overlaps {name}")
