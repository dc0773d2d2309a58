"""The stream-K schedule of the staged-A kernel (Config.stream_k), as formulas on integers that
the kernel traces and CPU tests check (no DSL import).

The call's T tiles split in two: the first T_dp = (T // G) * G are data-parallel (CTA b takes
tiles b, b + G, ...: whole waves), and the K stages of the remaining T - T_dp tiles (less than
one wave) form one unit space of U units, cut into G contiguous ranges, one per CTA. A CTA
walks its range from the end, one tile piece at a time, so the piece it leaves unfinished (its
range's last, which ends inside a tile) is the first it computes: it writes that piece's fp32
partial sums to its own workspace slot and raises its flag. The piece that starts inside a
tile is its last: it waits for the owner of the unit just before it, adds that partial, and
either stores the tile or, when it also ends inside the tile, passes the sum on. Every CTA
writes at most one partial, and every wait is on a partial its owner computed first.
"""

from __future__ import annotations

from typing import Any


def dp_tiles(total_tiles: Any, grid: Any) -> Any:
    """Tiles computed whole, data-parallel: the full waves."""
    return (total_tiles // grid) * grid


def unit_range(cta: Any, units: Any, grid: Any) -> tuple[Any, Any]:
    """[u0, u1) of the stream-K units that CTA `cta` computes."""
    return cta * units // grid, (cta + 1) * units // grid


def unit_owner(unit: Any, units: Any, grid: Any) -> Any:
    """The CTA whose unit_range holds `unit`: the largest c with c * units // grid <= unit."""
    return ((unit + 1) * grid - 1) // units


def piece(u_lo: Any, u_hi: Any, tile_start: Any, max_fn: Any = max) -> tuple[Any, Any]:
    """(k_begin, k_end) in stages of the piece that ends at unit u_hi - 1 of a tile whose units
    start at tile_start, for a CTA whose range starts at u_lo."""
    return max_fn(u_lo, tile_start) - tile_start, u_hi - tile_start
