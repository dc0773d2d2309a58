"""Launch-ABI recording for CuTe DSL kernels (build time only).

A kernel's `@cute.jit` host function builds every argument of its `@cute.kernel` through a
`KernelArgs` collector, naming for each one the rule the runtime uses to fill it. The `.entry`
parameter slots of each argument are derived from the same traced objects (their MLIR types),
so the manifest's ABI comes from the objects that built the kernel and is then checked against
the PTX `.entry` list by the builder (`builder/ptx.py`).

Lowering rules observed with nvidia-cutlass-dsl 4.8.1 (and checked on the H200 with
`cuFuncGetParamInfo`): i32 -> 4 bytes; pointer -> 8 bytes; TMA atom -> 128-byte CUtensorMap,
align 64, passed as a grid constant; coordinate tensor -> one i32 per dynamic extent, nothing if
static. Anything else must be declared with an explicit size (`zeros`) and is checked against PTX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from runtime.manifest import OPERANDS, SCALARS, TABLES, pack_offsets


class AbiError(Exception):
    """An argument cannot be described as launch-ABI slots."""


# The swizzle of a composed smem layout, "S<bits,base,shift>", and its TMA name.
_SWIZZLE_RE = re.compile(r"S<(\d+),(\d+),(\d+)>")
_TMA_TYPE_RE = re.compile(
    r"non_exec_tiled_tma_load<(?P<arch>\w+), (?P<elem>\w+), copy_bits = (?P<bits>\d+), "
    r'tma_gbasis = <"\((?P<box>[^)]*)\):\((?P<basis>[^)]*)\)">, tma_format = (?P<fmt>\w+)>'
)
_TMA_FORMAT = {"U8": "UINT8", "U16": "UINT16", "U32": "UINT32", "U64": "UINT64", "F16": "FLOAT16",
               "U4": "16U4_ALIGN8B", "S32": "INT32"}
_ELEM_BITS = {"i8": 8, "i16": 16, "i32": 32, "i64": 64, "f16": 16, "bf16": 16, "f32": 32,
              "f4E2M1FN": 4, "f8E4M3FN": 8}


@dataclass
class ArgRecord:
    name: str
    kind: str  # one of runtime.manifest.PARAM_KINDS, or "static" (lowers to no parameter)
    slots: list[tuple[int, int]]  # (size, align) of each .entry parameter it lowers to
    extra: dict[str, Any] = field(default_factory=dict)


def _mlir_types(value: Any) -> list[str]:
    from cutlass.cutlass_dsl import extract_mlir_values

    return [str(v.type) for v in extract_mlir_values(value)]


def slots_of(value: Any, name: str) -> list[tuple[int, int]]:
    """The (size, align) of each `.entry` parameter a traced kernel argument lowers to."""
    if isinstance(value, int) and not hasattr(value, "ir_value"):
        return []  # a Python int is a compile-time constant
    slots = []
    for t in _mlir_types(value):
        if t.startswith("!cute_nvgpu.atom.non_exec_tiled_tma_load"):
            slots.append((128, 64))
        elif t.startswith("!cute.ptr<"):
            slots.append((8, 8))
        elif t == "i32":
            slots.append((4, 4))
        elif t == "i64":
            slots.append((8, 8))
        elif t.startswith("!cute.coord_tensor<"):
            shape = t.split('"')[3].split(":")[0]
            slots.extend([(4, 4)] * shape.count("?"))
        elif t.startswith("!cute.layout<") or t.startswith("!cute.composed_layout<"):
            if "?" in t:
                raise AbiError(f"argument {name!r} is a dynamic layout {t}; pass its extents as Int32")
        else:
            raise AbiError(f"argument {name!r} has MLIR type {t}, which has no recorded lowering")
    return slots


def swizzle_bytes(smem_layout: Any, elem_bits: int) -> str:
    """TMA swizzle name for a (possibly composed) smem layout built by the kernel."""
    text = str(getattr(smem_layout, "inner", smem_layout))
    m = _SWIZZLE_RE.search(text)
    if not m or int(m.group(1)) == 0:
        return "NONE"
    bits, base = int(m.group(1)), int(m.group(2))
    unit_bytes = (1 << base) * elem_bits // 8
    if unit_bytes != 16:
        raise AbiError(f"swizzle {m.group(0)} over {elem_bits}-bit elements is not a TMA swizzle")
    return {1: "32B", 2: "64B", 3: "128B"}[bits]


def tma_geometry(atom: Any, placeholder_shape: tuple[int, ...], placeholder_stride: tuple[int, ...],
                 swizzle: str, l2_promotion: str) -> dict[str, Any]:
    """cuTensorMapEncodeTiled arguments for a TMA atom, read from the atom's traced type.

    The atom type carries the box and which tensor mode each descriptor dimension walks
    (`tma_gbasis`, e.g. "(128,8):(1@1,1@0)": dim 0 has box 128 over tensor mode 1). The
    placeholder tensor (the one the atom was made from) gives dims and byte strides in that order.
    """
    (t,) = _mlir_types(atom)
    m = _TMA_TYPE_RE.search(t)
    if not m:
        raise AbiError(f"cannot read TMA geometry from atom type {t}")
    box = [int(x) for x in m.group("box").split(",")]
    modes = [int(b.split("@")[1]) for b in m.group("basis").split(",")]
    fmt = _TMA_FORMAT.get(m.group("fmt"))
    if fmt is None:
        raise AbiError(f"TMA format {m.group('fmt')} has no cuTensorMapEncodeTiled dtype mapping")
    elem_bits = _ELEM_BITS.get(m.group("elem"))
    if elem_bits is None:
        raise AbiError(f"TMA element type {m.group('elem')} has no recorded width")
    dims = [int(placeholder_shape[mode]) for mode in modes]
    strides = [int(placeholder_stride[mode]) * elem_bits // 8 for mode in modes]
    if strides[0] * 8 != elem_bits:
        raise AbiError(f"descriptor dim 0 of atom {t} is not the contiguous tensor mode")
    return {
        "dtype": fmt,
        "dims": dims,
        "strides": strides[1:],
        "box": box,
        "element_strides": [1] * len(box),
        "swizzle": swizzle,
        "interleave": "NONE",
        "l2_promotion": l2_promotion,
        "oob_fill": "NONE",
    }


class KernelArgs:
    """Arguments of one `@cute.kernel` launch, each with the runtime rule that fills it."""

    def __init__(self) -> None:
        self._values: list[Any] = []
        self.records: list[ArgRecord] = []

    def _add(self, name: str, value: Any, kind: str, extra: dict[str, Any],
             slots: list[tuple[int, int]] | None = None) -> Any:
        if any(r.name == name for r in self.records):
            raise AbiError(f"argument {name!r} is added twice")
        self._values.append(value)
        self.records.append(ArgRecord(name, kind, slots_of(value, name) if slots is None else slots,
                                      extra))
        return value

    def table(self, name: str, ptr: Any, table: str) -> Any:
        """A pointer to a device table the runtime builds (see runtime/plan.py)."""
        if table not in TABLES:
            raise AbiError(f"table {table!r} must be one of {TABLES}")
        return self._add(name, ptr, "table", {"table": table})

    def tma_template(self, name: str, atom: Any, operand: str, geometry: dict[str, Any]) -> Any:
        """A TMA descriptor the runtime encodes once per device from `geometry`."""
        if operand not in OPERANDS:
            raise AbiError(f"operand {operand!r} must be one of {OPERANDS}")
        return self._add(name, atom, "tma_template", {"operand": operand, "tma": geometry})

    def scalar(self, name: str, value: Any, which: str) -> Any:
        """A 32-bit value the runtime computes per call."""
        if which not in SCALARS:
            raise AbiError(f"scalar {which!r} must be one of {SCALARS}")
        return self._add(name, value, "scalar", {"value": which})

    def zeros(self, name: str, value: Any, size: int, align: int) -> Any:
        """Opaque kernel state the host passes as zeros (e.g. a tcgen05 TiledMma)."""
        return self._add(name, value, "zeros", {}, slots=[(size, align)])

    def static(self, name: str, value: Any) -> Any:
        """An argument that must lower to no parameter (static layout, static TMA tensor)."""
        rec = self._add(name, value, "static", {})
        if self.records[-1].slots:
            raise AbiError(f"argument {name!r} was declared static but lowers to "
                           f"{self.records[-1].slots}")
        return rec

    def values(self) -> list[Any]:
        return list(self._values)

    def params(self) -> list[dict[str, Any]]:
        """The launch ABI in manifest form: one dict per `.entry` parameter, in order."""
        flat: list[tuple[ArgRecord, int, tuple[int, int]]] = []
        for rec in self.records:
            for i, slot in enumerate(rec.slots):
                flat.append((rec, i, slot))
        offsets = pack_offsets([s for _, _, s in flat])
        out = []
        for (rec, i, (size, align)), offset in zip(flat, offsets):
            if rec.kind in ("table", "tma_template", "scalar") and len(rec.slots) != 1:
                raise AbiError(f"{rec.kind} argument {rec.name!r} lowers to {len(rec.slots)} "
                               "parameters, expected 1")
            name = rec.name if len(rec.slots) == 1 else f"{rec.name}.{i}"
            out.append({"name": name, "kind": rec.kind, "offset": offset, "size": size,
                        "align": align, **rec.extra})
        return out


@dataclass
class CompiledKernel:
    """What a family's `compile_kernel` hands back to the builder worker."""

    symbol: str
    cubin: bytes
    ptx: str
    params: list[dict[str, Any]]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    dynamic_smem: int
    grid: dict[str, Any]
    tile: dict[str, int]
    tables: dict[str, Any]
    constraints: dict[str, Any]
    sm_count: int | None = None
