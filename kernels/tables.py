"""Layouts of the device tables a grouped kernel reads (build time; recorded in the manifest).

The kernels index these tables with the column numbers below, and `tables_record()` writes the
same layout into each manifest entry, from which the runtime builds the tables. The runtime never
spells a column order itself.

- problem_sizes: int32 (G, 4) = (m, n, k, l) per group; l is 1.
- pointers: int64 (G, 5) = device addresses of (a, b, sfa, sfb, c) per group.
- cta_prefix: int32 (G + 1,): prefix sums of output tiles per group,
  tiles_g = ceil(m_g / tile_m) * ceil(n_g / tile_n); entry G is the total.
- tensormap_workspace: `bytes_per_cta` bytes of global scratch per launched CTA, 128-byte aligned,
  where the kernel patches its per-group TMA descriptors. Written by the kernel, so never shared
  by launches that can overlap. Optional keys (absent means 0):
  `header_bytes` at the start of the workspace, zeroed by the runtime when it allocates the
  workspace, with the per-CTA slots after it. Every launch leaves the header in a state the next
  launch of a kernel with the same header size accepts (the grid barrier: zeroed again; the
  stream_a progress header: its epoch advanced and the bank the next launch uses zeroed), and
  the runtime never gives kernels of different header sizes one header. A kernel with a header
  takes a `grid_barrier` table parameter and keeps its state there: the runtime passes the
  header (eager launches) or a persistent zeroed copy (launches under graph capture, whose
  workspace comes uninitialized from the graph's pool); `bytes_per_a_element`: after the per-CTA slots the workspace holds
  every group's A converted by the kernel, sum over groups of m * k elements of that size, each
  group's rows contiguous from the end of the previous group's.
"""

from __future__ import annotations

from typing import Any

# The column orders and the tensormap size have one owner, shared with the builder and runtime.
from runtime.formats import (  # noqa: F401 - re-exported: the kernels read them from here
    COL_K,
    COL_L,
    COL_M,
    COL_N,
    POINTER_COLUMNS,
    PROBLEM_COLUMNS,
    PTR_A,
    PTR_B,
    PTR_C,
    PTR_SFA,
    PTR_SFB,
    TENSORMAP_BYTES,
)


def tables_record(num_tensormaps: int, header_bytes: int = 0,
                  bytes_per_a_element: int = 0, extra_bytes_per_cta: int = 0) -> dict[str, Any]:
    """The `tables` field of a manifest entry for a kernel that patches `num_tensormaps` maps
    (and keeps `extra_bytes_per_cta` more scratch per CTA)."""
    workspace: dict[str, Any] = {
        "bytes_per_cta": num_tensormaps * TENSORMAP_BYTES + extra_bytes_per_cta,
        "align": TENSORMAP_BYTES}
    if header_bytes:
        workspace["header_bytes"] = header_bytes
    if bytes_per_a_element:
        workspace["bytes_per_a_element"] = bytes_per_a_element
    return {
        "problem_sizes": {"dtype": "int32", "columns": list(PROBLEM_COLUMNS)},
        "pointers": {"dtype": "int64", "columns": list(POINTER_COLUMNS)},
        "cta_prefix": {"dtype": "int32"},
        "tensormap_workspace": workspace,
    }
