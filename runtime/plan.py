"""Launch plans: everything that depends only on (kernel, problem shapes, device).

Pure host arithmetic (no torch, no driver), so it is cached per (kernel, shapes, device) and
tested on CPU. Per call only the pointer table changes (`pointer_table_bytes`).

Table layouts come from the entry's `tables` record (written by kernels/tables.py); the runtime
never spells a column order itself:
- problem_sizes: (G, len(columns)) of (m, n, k, l = 1) in the recorded column order.
- cta_prefix: (G + 1,) prefix sums of tiles_g = ceil(m / tile.m) * ceil(n / tile.n).
- pointers: (G, len(columns)) device addresses of (a, b, sfa, sfb, c) in the recorded order.
- tensormap_workspace: grid * bytes_per_cta bytes, written by the kernel.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ArtifactError, ManifestError
from .manifest import KernelEntry

Shape = tuple[int, int, int]
_INT_FORMATS = {"int32": "i", "int64": "q"}
# Sub-table alignment inside the combined (problem_sizes, cta_prefix) device buffer; matches
# the tensormap workspace alignment and covers any vector load a kernel may use.
TABLE_ALIGN = 128


def _table(entry: KernelEntry, name: str) -> dict[str, Any]:
    t = entry.tables.get(name)
    if not isinstance(t, dict):
        raise ManifestError(f"kernel {entry.name!r}: tables.{name} must be an object, "
                            f"but got {t!r}")
    return t


def _format(entry: KernelEntry, name: str) -> str:
    dtype = _table(entry, name).get("dtype")
    if dtype not in _INT_FORMATS:
        raise ManifestError(f"kernel {entry.name!r}: tables.{name}.dtype must be one of "
                            f"{sorted(_INT_FORMATS)}, but got {dtype!r}")
    return _INT_FORMATS[dtype]


def _columns(entry: KernelEntry, name: str, allowed: Sequence[str]) -> tuple[str, ...]:
    cols = _table(entry, name).get("columns")
    if (not isinstance(cols, list) or not cols or len(set(cols)) != len(cols)
            or any(c not in allowed for c in cols)):
        raise ManifestError(f"kernel {entry.name!r}: tables.{name}.columns must be distinct "
                            f"names from {list(allowed)}, but got {cols!r}")
    return tuple(cols)


def pointer_columns(entry: KernelEntry) -> tuple[str, ...]:
    """Operand order of a pointer-table row ('a', 'b', 'sfa', 'sfb', 'c' in recorded order)."""
    return _columns(entry, "pointers", ("a", "b", "sfa", "sfb", "c"))


def problem_sizes_bytes(entry: KernelEntry, shapes: Sequence[Shape]) -> bytes:
    cols = _columns(entry, "problem_sizes", ("m", "n", "k", "l"))
    fmt = _format(entry, "problem_sizes")
    values = []
    for m, n, k in shapes:
        row = {"m": m, "n": n, "k": k, "l": 1}
        values.extend(row[c] for c in cols)
    return struct.pack(f"<{len(values)}{fmt}", *values)


def cta_prefix(shapes: Sequence[Shape], tile_m: int, tile_n: int) -> tuple[int, ...]:
    """Prefix sums of output tiles per group; entry G is the total."""
    out = [0]
    for m, n, _ in shapes:
        out.append(out[-1] + (-(-m // tile_m)) * (-(-n // tile_n)))
    return tuple(out)


def grid_size(entry: KernelEntry, total_tiles: int, sm_count: int) -> int:
    """CTAs to launch. Persistent: min(total tiles, SMs x CTAs per SM), rounded up to a whole
    number of clusters (the kernel clamps each CTA's tile range, so spare CTAs exit)."""
    policy = entry.grid.get("policy")
    if policy != "persistent":
        raise ManifestError(f"kernel {entry.name!r}: grid.policy must be 'persistent', "
                            f"but got {policy!r}")
    per_sm = entry.grid.get("ctas_per_sm")
    if isinstance(per_sm, bool) or not isinstance(per_sm, int) or per_sm < 1:
        raise ManifestError(f"kernel {entry.name!r}: grid.ctas_per_sm must be a positive int, "
                            f"but got {per_sm!r}")
    if total_tiles <= 0:
        return 0
    cx, cy, cz = entry.cluster
    if cy != 1 or cz != 1:
        raise ManifestError(f"kernel {entry.name!r}: a persistent 1-D grid needs cluster "
                            f"(x, 1, 1), but got {entry.cluster}")
    grid = min(total_tiles, sm_count * per_sm)
    return -(-grid // cx) * cx


@dataclass(frozen=True)
class Plan:
    """The shape-only part of a launch."""

    entry: KernelEntry
    shapes: tuple[Shape, ...]
    problem_sizes: bytes  # packed table, manifest column order and dtype
    cta_prefix: tuple[int, ...]
    total_tiles: int
    grid: int
    workspace_bytes: int
    plan_tables: bytes  # problem_sizes at 0, cta_prefix at cta_prefix_offset (one upload)
    cta_prefix_offset: int
    pointer_columns: tuple[str, ...]
    pointer_format: str  # struct code of one pointer-table cell

    @property
    def num_groups(self) -> int:
        return len(self.shapes)


def make_plan(entry: KernelEntry, shapes: Sequence[Shape], sm_count: int) -> Plan:
    """Plan `shapes` for `entry` on a device with `sm_count` SMs (read from the device)."""
    if entry.sm_count is not None and entry.sm_count != sm_count:
        raise ArtifactError(
            f"kernel {entry.name!r} was built for {entry.sm_count} SMs (baked into the cubin), "
            f"but the device has {sm_count}; rebuild it for this device"
        )
    tile_m, tile_n = entry.tile.get("m"), entry.tile.get("n")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in (tile_m, tile_n)):
        raise ManifestError(f"kernel {entry.name!r}: tile must have positive int 'm' and 'n', "
                            f"but got {entry.tile!r}")
    shapes = tuple((int(m), int(n), int(k)) for m, n, k in shapes)
    prefix = cta_prefix(shapes, tile_m, tile_n)
    total = prefix[-1]
    grid = grid_size(entry, total, sm_count)
    per_cta = _table(entry, "tensormap_workspace").get("bytes_per_cta")
    if isinstance(per_cta, bool) or not isinstance(per_cta, int) or per_cta < 0:
        raise ManifestError(f"kernel {entry.name!r}: tables.tensormap_workspace.bytes_per_cta "
                            f"must be a non-negative int, but got {per_cta!r}")
    sizes = problem_sizes_bytes(entry, shapes)
    pfmt = _format(entry, "cta_prefix")
    prefix_bytes = struct.pack(f"<{len(prefix)}{pfmt}", *prefix)
    offset = -(-len(sizes) // TABLE_ALIGN) * TABLE_ALIGN
    combined = sizes + bytes(offset - len(sizes)) + prefix_bytes
    return Plan(
        entry=entry,
        shapes=shapes,
        problem_sizes=sizes,
        cta_prefix=prefix,
        total_tiles=total,
        grid=grid,
        workspace_bytes=grid * per_cta,
        plan_tables=combined,
        cta_prefix_offset=offset,
        pointer_columns=pointer_columns(entry),
        pointer_format=_pointer_format(entry),
    )


def _pointer_format(entry: KernelEntry) -> str:
    fmt = _format(entry, "pointers")
    if fmt != "q":
        raise ManifestError(f"kernel {entry.name!r}: tables.pointers.dtype must be 'int64' to "
                            "hold device addresses")
    return fmt


def pointer_table_bytes(plan: Plan, rows: Sequence[int]) -> bytes:
    """The pointer table from its flattened rows (already in column order)."""
    return struct.pack(f"<{len(rows)}{plan.pointer_format}", *rows)
