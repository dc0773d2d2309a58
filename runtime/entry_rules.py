"""The one check of a manifest's launch data, shared by `runtime.load`, `verify`, `package` and
the builder's reuse of old entries.

`manifest.parse_manifest` checks JSON types into typed records; this checks the values the
launch and the dispatch read: per kernel (`check_kernel`) shared memory, block, cluster, tile,
grid and table layouts; per set entry (`check_entry`) the served shapes and every value a device
table holds (int32 problem sizes). Before it existed, verify skipped these and a wheel that
`runtime.load` refused could be packaged (issue 28).
"""

from __future__ import annotations

from typing import Any

from .errors import ManifestError
from .formats import INT32_LIMIT, POINTER_COLUMNS, PROBLEM_COLUMNS
from .manifest import Kernel, KernelEntry

# 227 KiB: the largest dynamic shared memory a block can opt in to on sm_90 and sm_100.
MAX_DYNAMIC_SMEM = 227 * 1024
MAX_BLOCK = (1024, 1024, 64)  # per-dimension limits of a CUDA block
MAX_THREADS = 1024
MAX_CLUSTER = 16  # non-portable cluster size limit (8 portable)
TABLE_ALIGN = 128  # header_bytes keeps the per-CTA slots on this boundary (runtime/plan.py)
# Bound on each tensormap workspace byte count: the runtime allocates header + grid x
# bytes_per_cta + A elements x bytes_per_a_element (real kernels: a few KiB, 2 per element).
MAX_WORKSPACE_FIELD = 2**40


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _fail(what: str, name: str, field: str, want: str, got: Any) -> ManifestError:
    return ManifestError(f"{what} {name!r}: {field} must be {want}, but got {got!r}; "
                         "rebuild the artifacts with `python build_kernels.py build --force`")


def check_serves(e: KernelEntry) -> None:
    """The served shapes: positive n, k (dynamic m), int32 cells and m * n < 2^31 (exact)."""
    s = e.serves
    if s.dynamic_m:
        # An expert set repeats one row E times (manifest._rows shares it): check it once.
        rows = s.groups[:1] if s.one_row else s.groups
        for i, (n, k) in enumerate(rows):
            if n <= 0 or k <= 0:
                raise ManifestError(f"kernel {e.name!r}: serves.dynamic_m.groups[{i}] must "
                                    f"have n, k > 0, but got {[n, k]}")
            if n >= INT32_LIMIT or k >= INT32_LIMIT:
                raise _fail("kernel", e.name, f"serves.dynamic_m.groups[{i}]", "n, k < 2^31",
                            [n, k])
        if s.max_m is not None and not 1 <= s.max_m < INT32_LIMIT:
            raise ManifestError(f"kernel {e.name!r}: serves.dynamic_m.max_m must be a positive "
                                f"int below 2^31 or null, but got {s.max_m!r}")
        return
    for i, (m, n, k) in enumerate(s.groups):
        if min(m, n, k) < 0 or max(m, n, k) >= INT32_LIMIT or m * n >= INT32_LIMIT:
            raise _fail("kernel", e.name, f"serves.groups[{i}]",
                        "m, n, k in 0..2^31-1 with m * n < 2^31", [m, n, k])


def check_entry(e: KernelEntry) -> None:
    """ManifestError naming the field unless the set entry can be dispatched to."""
    check_serves(e)
    if not _positive(e.acc_stages):
        raise _fail("kernel", e.name, "acc_stages", "a positive int", e.acc_stages)


def check_kernel(k: Kernel) -> None:
    """ManifestError naming the field unless the kernel can be launched."""
    def fail(field: str, want: str, got: Any) -> ManifestError:
        return _fail("kernel", k.name, field, want, got)

    if not _positive(k.acc_stages):
        raise fail("acc_stages", "a positive int", k.acc_stages)
    if not _positive(k.cubin_bytes):
        raise fail("cubin_bytes", "a positive int", k.cubin_bytes)
    if k.sm_count is not None and not _positive(k.sm_count):
        raise fail("sm_count", "a positive int or null", k.sm_count)
    if not 0 <= k.dynamic_smem <= MAX_DYNAMIC_SMEM:
        raise fail("dynamic_smem", f"in 0..{MAX_DYNAMIC_SMEM} bytes (227 KiB, the opt-in "
                   "limit per block)", k.dynamic_smem)
    if (not all(1 <= d <= top for d, top in zip(k.block, MAX_BLOCK))
            or k.block[0] * k.block[1] * k.block[2] > MAX_THREADS):
        raise fail("block", f"(x, y, z) with each >= 1, at most {MAX_BLOCK} and "
                   f"x * y * z <= {MAX_THREADS}", list(k.block))
    if not all(d >= 1 for d in k.cluster) or k.cluster[0] * k.cluster[1] * k.cluster[2] \
            > MAX_CLUSTER:
        raise fail("cluster", f"(x, y, z) with each >= 1 and x * y * z <= {MAX_CLUSTER}",
                   list(k.cluster))
    for dim in ("m", "n", "k"):
        value = getattr(k.tile, dim)
        if (dim != "k" or value is not None) and not _positive(value):
            raise fail(f"tile.{dim}", "a positive int", value)
    if k.grid.policy != "persistent":
        raise fail("grid.policy", "'persistent'", k.grid.policy)
    if not _positive(k.grid.ctas_per_sm):
        raise fail("grid.ctas_per_sm", "a positive int", k.grid.ctas_per_sm)
    if k.cluster[1:] != (1, 1):
        raise fail("cluster", "(x, 1, 1) (a persistent 1-D grid)", list(k.cluster))
    for name in ("k_multiple", "n_multiple"):
        if not _positive(getattr(k.limits, name)):
            raise fail(f"limits.{name}", "a positive int", getattr(k.limits, name))
    _check_tables(k, fail)


def _check_tables(k: Kernel, fail: Any) -> None:
    t = k.tables
    # The runtime packs a row in any recorded column order (runtime/plan.py size_index,
    # runtime/device.py _row_index), but every column the kernels index must be there, once:
    # a missing one packed rows of the wrong width.
    for name, allowed in (("problem_sizes", PROBLEM_COLUMNS), ("pointers", POINTER_COLUMNS)):
        cols = getattr(t, name).columns
        if sorted(cols) != sorted(allowed):
            raise fail(f"tables.{name}.columns", f"{list(allowed)} in some order, each once",
                       list(cols))
    for name, dtype, why in (("problem_sizes", "int32", "the kernels read int32 sizes"),
                             ("cta_prefix", "int32", "the kernels read int32 tile counts"),
                             ("pointers", "int64", "it holds device addresses")):
        if getattr(t, name).dtype != dtype:
            raise fail(f"tables.{name}.dtype", f"{dtype!r} ({why})", getattr(t, name).dtype)
    ws = t.tensormap_workspace
    for name in ("bytes_per_cta", "header_bytes", "bytes_per_a_element"):
        if getattr(ws, name) < 0:
            raise fail(f"tables.tensormap_workspace.{name}", "a non-negative int",
                       getattr(ws, name))
        if getattr(ws, name) >= MAX_WORKSPACE_FIELD:
            raise fail(f"tables.tensormap_workspace.{name}", "below 2^40 (1 TiB)",
                       getattr(ws, name))
    if ws.header_bytes % TABLE_ALIGN:
        raise fail("tables.tensormap_workspace.header_bytes", f"a multiple of {TABLE_ALIGN}",
                   ws.header_bytes)
    # The header is the kernel's cross-CTA state (a grid barrier or stream_a's progress
    # counters), which it reads through its own parameter: a captured launch gives it a
    # persistent zeroed copy, not the graph's workspace.
    barrier = any(p.kind == "table" and p.table == "grid_barrier" for p in k.params)
    if bool(ws.header_bytes) != barrier:
        raise ManifestError(
            f"kernel {k.name!r}: tables.tensormap_workspace.header_bytes is {ws.header_bytes} "
            f"but the kernel {'has' if barrier else 'has no'} grid_barrier parameter; a zeroed "
            "header and a grid_barrier parameter come together")
