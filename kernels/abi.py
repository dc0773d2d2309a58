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

from dataclasses import dataclass, field
from typing import Any

from runtime.manifest import CALL_OPERANDS, OPERANDS, SCALARS, TABLES, pack_offsets


class AbiError(Exception):
    """An argument cannot be described as launch-ABI slots."""


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
                raise AbiError(f"argument {name!r} is a dynamic layout {t}; pass its extents "
                               "as Int32")
        else:
            raise AbiError(f"argument {name!r} has MLIR type {t}, which has no recorded lowering")
    return slots


class KernelArgs:
    """Arguments of one `@cute.kernel` launch, each with the runtime rule that fills it."""

    def __init__(self, operands: tuple[str, ...] = CALL_OPERANDS,
                 scalars: tuple[str, ...] = SCALARS) -> None:
        # The names operand and scalar parameters may carry: the GEMMs' by default, the
        # activation quantizers' (runtime.manifest.QUANT_*) for those kernels.
        self._operands, self._scalars = operands, scalars
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

    def operand(self, name: str, ptr: Any, which: str) -> Any:
        """The device address of a caller tensor, set per call (device-offsets kernels)."""
        if which not in self._operands:
            raise AbiError(f"operand {which!r} must be one of {self._operands}")
        return self._add(name, ptr, "operand", {"operand": which})

    def scalar(self, name: str, value: Any, which: str) -> Any:
        """A 32-bit value the runtime computes per call."""
        if which not in self._scalars:
            raise AbiError(f"scalar {which!r} must be one of {self._scalars}")
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
            if rec.kind in ("table", "tma_template", "scalar", "operand") and len(rec.slots) != 1:
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
