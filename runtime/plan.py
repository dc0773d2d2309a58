"""Launch plans: everything that depends only on (kernel, problem shapes, device).

Pure host arithmetic (no torch, no driver), so it is cached per (kernel, shapes, device) and
tested on CPU. Per call only the pointer table changes (`pointer_table_bytes`).

Table layouts come from the kernel's typed `tables` record (written by kernels/tables.py); the
runtime never spells a column order itself:
- problem_sizes: (G, len(columns)) of (m, n, k, l = 1) in the recorded column order.
- cta_prefix: (G + 1,) prefix sums of tiles_g = ceil(m / tile.m) * ceil(n / tile.n).
- pointers: (G, len(columns)) device addresses of (a, b, sfa, sfb, c) in the recorded order.
- tensormap_workspace: header_bytes (zeroed by the runtime when it allocates the workspace, left
  zeroed by every launch), then grid * bytes_per_cta bytes, then sum(m * k) * bytes_per_a_element
  (the kernel's own fp16 copy of A); all but the header written by the kernel. Launches of
  kernels with different header_bytes never share a workspace (runtime/device.py).
- alpha: one float32 per group, the caller's device tensor; without one, the plan's own G ones
  (`ones_offset` into plan_tables), so alpha = None launches the same kernel with no extra
  upload or allocation (graph capture included).
- grid_barrier: the kernel's barrier, header_bytes zeroed bytes (a kernel has this parameter
  exactly when its workspace has a header): an eager launch's workspace header, or for a
  launch under graph capture a persistent zeroed copy of its own beside its tables.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from .errors import ArtifactError, InputError
from .manifest import KernelEntry
from .records import Record

Shape = tuple[int, int, int]
_INT_FORMATS = {"int32": "i", "int64": "q"}
_FORMAT_LIMITS = {"i": 2**31, "q": 2**63}  # exclusive upper bound of a table cell
# Sub-table alignment inside the combined (problem_sizes, cta_prefix) device buffer; matches
# the tensormap workspace alignment and covers any vector load a kernel may use.
TABLE_ALIGN = 128


def pack_aligned(*parts: bytes) -> tuple[bytes, tuple[int, ...]]:
    """The parts back to back, each starting on a TABLE_ALIGN boundary (zero bytes between),
    and where each starts: how several device tables share one upload."""
    image, starts = b"", []
    for part in parts:
        image = image.ljust(-(-len(image) // TABLE_ALIGN) * TABLE_ALIGN, b"\0")
        starts.append(len(image))
        image += part
    return image, tuple(starts)


def ones_image(groups: int) -> bytes:
    """`groups` float32 ones: the alpha a launch reads when the call gives none."""
    return struct.pack(f"<{groups}f", *(1.0,) * groups)


def _format(dtype: str) -> str:
    return _INT_FORMATS[dtype]


def pointer_columns(entry: KernelEntry) -> tuple[str, ...]:
    """Operand order of a pointer-table row ('a', 'b', 'sfa', 'sfb', 'c' in recorded order)."""
    return entry.tables.pointers.columns


def problem_sizes_bytes(entry: KernelEntry, shapes: Sequence[Shape]) -> bytes:
    t = entry.tables.problem_sizes
    values = []
    for m, n, k in shapes:
        row = {"m": m, "n": n, "k": k, "l": 1}
        values.extend(row[c] for c in t.columns)
    return struct.pack(f"<{len(values)}{_format(t.dtype)}", *values)


def cta_prefix(shapes: Sequence[Shape], tile_m: int, tile_n: int) -> tuple[int, ...]:
    """Prefix sums of output tiles per group; entry G is the total."""
    out = [0]
    for m, n, _ in shapes:
        out.append(out[-1] + (-(-m // tile_m)) * (-(-n // tile_n)))
    return tuple(out)


def grid_size(entry: KernelEntry, total_tiles: int, sm_count: int) -> int:
    """CTAs to launch. Persistent: min(total tiles, SMs x CTAs per SM), rounded up to a whole
    number of clusters (the kernel clamps each CTA's tile range, so spare CTAs exit); with
    grid.every_sm (stream-K kernels, which split tiles' K over every CTA) SMs x CTAs per SM
    whatever the tile count."""
    every_sm = entry.grid.every_sm
    per_sm = entry.grid.ctas_per_sm  # policy "persistent" and cluster (x, 1, 1): entry_rules
    if total_tiles <= 0:
        return 0
    cx = entry.cluster[0]
    grid = sm_count * per_sm if every_sm else min(total_tiles, sm_count * per_sm)
    return -(-grid // cx) * cx


class Plan(Record):
    """The shape-only part of a launch.

    entry, shapes ((m, n, k) per group), problem_sizes (packed table, manifest column order and
    dtype), cta_prefix, total_tiles, grid, workspace_bytes, workspace_header (its leading bytes
    that must be zero before the first launch), plan_tables (problem_sizes at 0,
    cta_prefix at cta_prefix_offset, G float32 ones at ones_offset: one upload),
    cta_prefix_offset, ones_offset, pointer_columns,
    pointer_format (struct code of one pointer-table cell).
    """

    entry: KernelEntry
    shapes: Sequence[Shape]
    problem_sizes: bytes
    cta_prefix: tuple[int, ...]
    total_tiles: int
    grid: int
    workspace_bytes: int
    workspace_header: int
    plan_tables: bytes
    cta_prefix_offset: int
    ones_offset: int
    pointer_columns: tuple[str, ...]
    pointer_format: str

    @property
    def num_groups(self) -> int:
        return len(self.shapes)


class _Layout(Record):
    """What make_plan reads from an entry, validated once per entry (dynamic-m calls plan a
    new shape list nearly every call): tile_m, tile_n, per_cta (workspace bytes per CTA),
    size_index (problem_sizes columns as indices into (m, n, k, l)), size_format,
    prefix_format, pointer_columns, pointer_format."""

    tile_m: int
    tile_n: int
    per_cta: int
    header: int
    a_element: int
    size_index: tuple[int, ...]
    size_format: str
    prefix_format: str
    pointer_columns: tuple[str, ...]
    pointer_format: str


_LAYOUTS: dict[int, tuple[KernelEntry, _Layout]] = {}  # id(entry) -> (entry, layout)


def _layout(entry: KernelEntry) -> _Layout:
    hit = _LAYOUTS.get(id(entry))
    if hit is not None and hit[0] is entry:
        return hit[1]
    # Every value here was checked when the manifest was parsed (runtime/entry_rules.py).
    t, ws = entry.tables, entry.tables.tensormap_workspace
    layout = _Layout(
        tile_m=entry.tile.m, tile_n=entry.tile.n, per_cta=ws.bytes_per_cta,
        header=ws.header_bytes, a_element=ws.bytes_per_a_element,
        size_index=tuple("mnkl".index(c) for c in t.problem_sizes.columns),
        size_format=_format(t.problem_sizes.dtype), prefix_format=_format(t.cta_prefix.dtype),
        pointer_columns=t.pointers.columns, pointer_format=_format(t.pointers.dtype))
    if len(_LAYOUTS) > 4096:  # entries are few; only tests make thousands
        _LAYOUTS.clear()
    _LAYOUTS[id(entry)] = (entry, layout)  # the entry is kept, so its id is not reused
    return layout


def make_plan(entry: KernelEntry, shapes: Sequence[Shape], sm_count: int) -> Plan:
    """Plan `shapes` for `entry` on a device with `sm_count` SMs (read from the device)."""
    if entry.sm_count is not None and entry.sm_count != sm_count:
        raise ArtifactError(
            f"kernel {entry.name!r} was built for {entry.sm_count} SMs (baked into the cubin), "
            f"but the device has {sm_count}; rebuild it for this device"
        )
    lay = _layout(entry)
    shapes = tuple((int(m), int(n), int(k)) for m, n, k in shapes)
    tile_m, tile_n = lay.tile_m, lay.tile_n
    prefix = [0]
    total = 0
    a_elements = 0
    for m, n, k in shapes:
        total += (-(-m // tile_m)) * (-(-n // tile_n))
        prefix.append(total)
        a_elements += m * k
    grid = grid_size(entry, total, sm_count)
    idx = lay.size_index
    if idx == (0, 1, 2, 3):
        values = [v for m, n, k in shapes for v in (m, n, k, 1)]
    else:
        values = [(m, n, k, 1)[i] for m, n, k in shapes for i in idx]
    if values and (max(values) >= _FORMAT_LIMITS[lay.size_format] or min(values) < 0) \
            or total >= _FORMAT_LIMITS[lay.prefix_format]:
        _check_cells(entry, shapes, lay.size_format, lay.prefix_format, total)
    sizes = struct.pack(f"<{len(values)}{lay.size_format}", *values)
    prefix_bytes = struct.pack(f"<{len(prefix)}{lay.prefix_format}", *prefix)
    # The alpha of a call that gives none (runtime/device.py).
    ones = ones_image(len(shapes))
    combined, (_, offset, ones_offset) = pack_aligned(sizes, prefix_bytes, ones)
    return Plan(
        entry=entry,
        shapes=shapes,
        problem_sizes=sizes,
        cta_prefix=tuple(prefix),
        total_tiles=total,
        grid=grid,
        workspace_bytes=lay.header + grid * lay.per_cta + a_elements * lay.a_element,
        workspace_header=lay.header,
        plan_tables=combined,
        cta_prefix_offset=offset,
        ones_offset=ones_offset,
        pointer_columns=lay.pointer_columns,
        pointer_format=lay.pointer_format,
    )


def _check_cells(entry: KernelEntry, shapes: Sequence[Shape], size_format: str,
                 prefix_format: str, total_tiles: int) -> None:
    """InputError unless every problem size and the tile count fit their table cells (a raw
    struct.error from the packing said nothing about which argument was too large)."""
    limit = _FORMAT_LIMITS[size_format]
    for g, shape in enumerate(shapes):
        for dim, v in zip("mnk", shape):
            if not 0 <= v < limit:
                raise InputError(
                    f"group {g}: {dim} must be in 0..{limit - 1} (kernel {entry.name!r} stores "
                    f"problem sizes as {'int32' if size_format == 'i' else 'int64'}), but got {v}")
    if total_tiles >= _FORMAT_LIMITS[prefix_format]:
        raise InputError(f"the call's output tiles must number < {_FORMAT_LIMITS[prefix_format]} "
                         f"(kernel {entry.name!r}'s cta_prefix table), but got {total_tiles}")


def pointer_table_bytes(plan: Plan, rows: Sequence[int]) -> bytes:
    """The pointer table from its flattened rows (already in column order)."""
    return struct.pack(f"<{len(rows)}{plan.pointer_format}", *rows)
