"""The one check of a manifest entry's launch data, shared by `runtime.load`, `verify`,
`package` and the builder's reuse of old entries.

`manifest.parse_manifest` checks JSON types; this checks what the launch and the dispatch read
from an entry: the served shapes (the dispatch parse), every value a device table holds
(int32 problem sizes), shared memory, block, cluster, tile and grid. Before it existed, verify
skipped these and a wheel that `runtime.load` refused could be packaged (issue 28).
"""

from __future__ import annotations

from typing import Any

from .dispatch import dynamic_groups, exact_groups
from .errors import ManifestError
from .manifest import KernelEntry
from .plan import grid_size

# 227 KiB: the largest dynamic shared memory a block can opt in to on sm_90 and sm_100.
MAX_DYNAMIC_SMEM = 227 * 1024
MAX_BLOCK = (1024, 1024, 64)  # per-dimension limits of a CUDA block
MAX_THREADS = 1024
MAX_CLUSTER = 16  # non-portable cluster size limit (8 portable)
INT32_LIMIT = 2**31  # problem_sizes and cta_prefix are int32 tables


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _fail(e: KernelEntry, field: str, want: str, got: Any) -> ManifestError:
    return ManifestError(f"kernel {e.name!r}: {field} must be {want}, but got {got!r}; "
                         "rebuild the artifacts with `python build_kernels.py build --force`")


def _check_shapes(e: KernelEntry) -> None:
    """The dispatch parse, plus the int32 range of every value the problem-size table holds."""
    dyn = dynamic_groups(e)
    if dyn is not None:
        rows, max_m = dyn
        for i, (n, k) in enumerate(rows):
            if n >= INT32_LIMIT or k >= INT32_LIMIT:
                raise _fail(e, f"constraints.dynamic_m.groups[{i}]", "n, k < 2^31", [n, k])
        if max_m is not None and max_m >= INT32_LIMIT:
            raise _fail(e, "constraints.dynamic_m.max_m", "< 2^31", max_m)
        return
    for i, (m, n, k) in enumerate(exact_groups(e)):
        if min(m, n, k) < 0 or max(m, n, k) >= INT32_LIMIT or m * n >= INT32_LIMIT:
            raise _fail(e, f"constraints.groups[{i}]",
                        "m, n, k in 0..2^31-1 with m * n < 2^31", [m, n, k])


def check_entry(e: KernelEntry) -> None:
    """ManifestError naming the field unless `e` can be dispatched to and launched."""
    _check_shapes(e)
    if not _positive(e.acc_stages):
        raise _fail(e, "acc_stages", "a positive int", e.acc_stages)
    if not _positive(e.cubin_bytes):
        raise _fail(e, "cubin_bytes", "a positive int", e.cubin_bytes)
    if e.sm_count is not None and not _positive(e.sm_count):
        raise _fail(e, "sm_count", "a positive int or null", e.sm_count)
    if not 0 <= e.dynamic_smem <= MAX_DYNAMIC_SMEM:
        raise _fail(e, "dynamic_smem", f"in 0..{MAX_DYNAMIC_SMEM} bytes (227 KiB, the opt-in "
                    "limit per block)", e.dynamic_smem)
    if (not all(1 <= d <= top for d, top in zip(e.block, MAX_BLOCK))
            or e.block[0] * e.block[1] * e.block[2] > MAX_THREADS):
        raise _fail(e, "block", f"(x, y, z) with each >= 1, at most {MAX_BLOCK} and "
                    f"x * y * z <= {MAX_THREADS}", list(e.block))
    if not all(d >= 1 for d in e.cluster) or e.cluster[0] * e.cluster[1] * e.cluster[2] \
            > MAX_CLUSTER:
        raise _fail(e, "cluster", f"(x, y, z) with each >= 1 and x * y * z <= {MAX_CLUSTER}",
                    list(e.cluster))
    for dim in ("m", "n"):
        if not _positive(e.tile.get(dim)):
            raise _fail(e, f"tile.{dim}", "a positive int", e.tile.get(dim))
    if "k" in e.tile and not _positive(e.tile["k"]):
        raise _fail(e, "tile.k", "a positive int", e.tile["k"])
    grid_size(e, 1, 1)  # the grid policy, as the planner reads it
