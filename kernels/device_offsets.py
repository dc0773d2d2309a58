"""Device-offsets table derivation shared by the kernel families (Config.device_offsets; the
serving contract of issue 26 and the masked layout of issue 27).

A mixin: the kernel class provides `tile_m`, `tile_n` (the CTA tile's A rows and B rows, for the
tile prefix), `c_dtype`, `config.masked` and `_lane_scan(count, lane)` (a warp's inclusive prefix
sum and total). `_derive_tables` is run by one warp of each CTA before the kernel's roles start:
it writes the list kernel's pointer, problem-size and CTA-prefix tables (kernels/tables.py) for
this call into the CTA's own slot of the workspace (runtime.formats.offsets_tables_bytes).

A fourth table, ROW_ENDS, follows the CTA prefix: expert g's end row in the order phase 1
stages the rows (experts back to back: the clamped offsets themselves, or the running sum of the
clamped masked_m), for the roles that need an expert's staged rows (row_ends).

Offsets layout (torch's scaled_grouped_mm 2D x 3D): expert g owns rows offs[g-1] .. offs[g] of a
and c; each offset is clamped to [0, T] and the ends made non-decreasing (a running maximum)
before any pointer is formed, so no offs value moves an access outside a, c or sfa's bound of
round_up(T, 128) + 128 E blocked rows. Masked layout: expert g's rows start at g * max_m,
masked_m[g] clamped to [0, max_m] of them are valid. Each lane of the warp takes a run of
consecutive experts; shuffle scans give the running maximum, the CTA-tile prefix and the A-scale
row prefix.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from kernels import tables
from runtime.formats import (
    POINTER_ROW_BYTES,
    PROBLEM_ROW_BYTES,
    SCALE_ROWS,
    blocked_scale_numel,
    offsets_tables_bytes,
    scale_cols,
)

SCAN_STEPS = 5  # shuffle-scan steps over a warp's 32 lanes


@cute.jit
def lane_scan(count, lane) -> tuple:
    """A warp's lanes each hold a count: returns this lane's inclusive prefix sum and the
    warp's total, by a shuffle scan."""
    end = count
    for d in cutlass.range_constexpr(SCAN_STEPS):
        below = cute.arch.shuffle_sync_up(end, 1 << d)
        if lane >= (1 << d):
            end = end + below
    return end, cute.arch.shuffle_sync(end, 31)


def row_ends(prefix: cute.Tensor, num_groups) -> cute.Tensor:
    """The ROW_ENDS table (module docstring) of the slot whose CTA prefix is `prefix`: it
    starts right after the prefix's num_groups + 1 cells."""
    at = prefix.iterator.toint() + Int64(4) * Int64(num_groups + 1)
    return cute.make_tensor(cute.make_ptr(Int32, at, cute.AddressSpace.gmem, assumed_align=4),
                            cute.make_layout(num_groups))


@cute.jit
def staged_start(ends: cute.Tensor, g) -> Int32:
    """Expert g's first row in the staged order: ROW_ENDS[g - 1], or 0 for g = 0 (read
    branch-free: ends[0] times 0)."""
    return ends[cutlass.max(g - 1, Int32(0))] * cutlass.min(g, Int32(1))


class DeviceOffsets:
    """The table derivation of a device-offsets kernel (module docstring)."""

    def _record_call(self, args, index, operands) -> None:
        """Record the call's parameters in the families' shared order: the index tensor (offs,
        or masked_m with Config.masked), the operands a, b, sfa, sfb, c (the runtime's
        OffsetsPlan packs them in this order)."""
        name = "masked_m" if self.config.masked else "offs"
        args.operand(name, index, name)
        for op, ptr in zip(("a", "b", "sfa", "sfb", "c"), operands):
            args.operand(op, ptr, op)

    def _record_dims(self, args, rows, n, k) -> None:
        """Record rows (max_m with Config.masked), n and k, the last scalars of the call."""
        name = "max_m" if self.config.masked else "rows"
        args.scalar(name, rows, name)
        args.scalar("n", n, "n")
        args.scalar("k", k, "k")

    @cute.jit
    def _tables_in_slot(self, slots_base, bidx, index, operands, num_groups, rows, n, k, tidx,
                        warp_idx, first_tile_of=None) -> tuple:
        """The prologue of every device-offsets kernel: warp 0 derives this CTA's tables into
        its slot (slots_base + bidx * offsets_tables_bytes(E), past the CTAs' descriptors), the
        CTA synchronizes, and (problem sizes, pointers, CTA prefix) pointers come back. Given
        `first_tile_of` (the call's tile count -> this CTA's first tile), a fourth value: the
        group owning that tile in warp 0 (-1 when the CTA has none; undefined in other warps),
        found while deriving, so no role looks it up in the prefix table."""
        slot = slots_base + Int64(bidx) * Int64(offsets_tables_bytes(num_groups))
        sizes_at = slot + Int64(POINTER_ROW_BYTES) * Int64(num_groups)
        prefix_at = sizes_at + Int64(PROBLEM_ROW_BYTES) * Int64(num_groups)
        first_group = Int32(-1)
        if warp_idx == 0:
            first_group = self._derive_tables(index, operands, slot, sizes_at, prefix_at,
                                              num_groups, rows, n, k, tidx, first_tile_of)
        # The tables (plain global stores of warp 0) are read by every role from here on.
        cute.arch.barrier()
        gmem = cute.AddressSpace.gmem
        pointers = (cute.make_ptr(Int32, sizes_at, gmem, assumed_align=8),
                    cute.make_ptr(Int64, slot, gmem, assumed_align=16),
                    cute.make_ptr(Int32, prefix_at, gmem, assumed_align=8))
        if cutlass.const_expr(first_tile_of is None):
            return pointers
        return (*pointers, first_group)

    @cute.jit
    def _clamped_end(self, ends: cute.Tensor, g: Int32, rows: Int32, below: Int32) -> Int32:
        """Expert g's end row: offs[g] clamped to [0, rows], and at least `below` (the previous
        expert's end: the running maximum)."""
        return cutlass.max(cutlass.min(cutlass.max(ends[g], Int32(0)), rows), below)

    def _tiles_of(self, m, tiles_n):
        """CTA tiles of an expert with m rows (ceil(m / tile_m) m-tiles of tiles_n n-tiles)."""
        return (m + self.tile_m - 1) // self.tile_m * tiles_n

    @cute.jit
    def _write_row(self, ptrs, sizes, prefix, g, addresses, m, n, k, first_tile) -> None:
        """Expert g's row of the three tables: its (a, b, sfa, sfb, c) addresses, (m, n, k, 1)
        and the first CTA tile it owns. `addresses` are callables, each traced at its store:
        the kernels' instruction order (and the cubins run on the H200) stay as they were."""
        for col, address in zip((tables.PTR_A, tables.PTR_B, tables.PTR_SFA, tables.PTR_SFB,
                                 tables.PTR_C), addresses):
            ptrs[g, col] = address()
        sizes[g, tables.COL_M] = m
        sizes[g, tables.COL_N] = n
        sizes[g, tables.COL_K] = k
        sizes[g, tables.COL_L] = Int32(1)
        prefix[g] = first_tile

    @cute.jit
    def _derive_tables(self, offs, operands, slot, sizes_at, prefix_at, num_groups, rows, n,
                       k, lane, first_tile_of=None) -> Int32:
        """Warp 0: the pointer, problem-size and CTA-prefix tables of this call (module
        docstring) at `slot`, `sizes_at` and `prefix_at`. Lane l takes experts
        [l * per, l * per + count). Returns the group owning tile first_tile_of(tiles) in
        every lane (-1 for none; -1 without first_tile_of)."""
        gmem = cute.AddressSpace.gmem
        ends = cute.make_tensor(offs, cute.make_layout(num_groups))
        ptrs = cute.make_tensor(cute.make_ptr(Int64, slot, gmem, assumed_align=16),
                                cute.make_layout((num_groups, 5), stride=(5, 1)))
        sizes = cute.make_tensor(cute.make_ptr(Int32, sizes_at, gmem, assumed_align=8),
                                 cute.make_layout((num_groups, 4), stride=(4, 1)))
        prefix = cute.make_tensor(cute.make_ptr(Int32, prefix_at, gmem, assumed_align=8),
                                  cute.make_layout(num_groups + 1))
        ends_out = row_ends(prefix, num_groups)
        per = (num_groups + 31) // 32
        first = lane * per
        count = cutlass.max(cutlass.min(first + per, num_groups) - first, Int32(0))
        owner = Int32(-1)
        if cutlass.const_expr(self.config.masked):
            owner = self._masked_tables(ends, operands, ptrs, sizes, prefix, ends_out,
                                        num_groups, rows, n, k, lane, first, count,
                                        first_tile_of)
        else:
            owner = self._offsets_tables(ends, operands, ptrs, sizes, prefix, ends_out,
                                         num_groups, rows, n, k, lane, first, count,
                                         first_tile_of)
        if cutlass.const_expr(first_tile_of is not None):
            for d in cutlass.range_constexpr(SCAN_STEPS):  # at most one lane owns it
                owner = cutlass.max(owner, cute.arch.shuffle_sync_bfly(owner, 1 << d))
        return owner

    @staticmethod
    def _owns(tile, tile0, m_tiles) -> Int32:
        """1 when `tile` is one of the m_tiles CTA tiles from tile0 (an expert's), else 0."""
        return Int32(tile >= tile0) * Int32(tile < tile0 + m_tiles)

    @cute.jit
    def _masked_tables(self, masked_m, operands, ptrs, sizes, prefix, ends_out, num_groups,
                       max_m, n, k, lane, first, count, first_tile_of=None) -> Int32:
        """The masked layout (Config.masked): expert g's rows start at g * max_m in a and c, its
        scales at blocked row g * round_up(max_m, 128) of sfa; masked_m[g] clamped to [0, max_m]
        rows are valid."""
        a, b, sfa, sfb, c = operands
        tiles_n = (n + self.tile_n - 1) // self.tile_n
        tiles = Int32(0)
        valid = Int32(0)
        for i in cutlass.range(count, unroll=1):
            m = cutlass.min(cutlass.max(masked_m[first + i], Int32(0)), max_m)
            tiles += self._tiles_of(m, tiles_n)
            valid += m
        tiles_end, tiles_total = self._lane_scan(tiles, lane)
        valid_end, _ = self._lane_scan(valid, lane)
        tile0 = tiles_end - tiles
        staged_end = valid_end - valid  # the valid rows staged before this lane's experts
        a_expert = Int64(max_m) * Int64(k // 2)
        b_expert = Int64(n) * Int64(k // 2)
        sfa_expert = Int64(blocked_scale_numel(max_m, k))
        sfb_expert = Int64(blocked_scale_numel(n, k))
        c_expert = Int64(max_m) * Int64(n) * Int64(self.c_dtype.width // 8)
        owner = Int32(-1)
        wanted = Int32(0) if first_tile_of is None else first_tile_of(tiles_total)
        for i in cutlass.range(count, unroll=1):
            g = first + i
            m = cutlass.min(cutlass.max(masked_m[g], Int32(0)), max_m)
            if cutlass.const_expr(first_tile_of is not None):
                if self._owns(wanted, tile0, self._tiles_of(m, tiles_n)) != 0:
                    owner = g
            self._write_row(ptrs, sizes, prefix, g,
                            (lambda: a.toint() + Int64(g) * a_expert,
                             lambda: b.toint() + Int64(g) * b_expert,
                             lambda: sfa.toint() + Int64(g) * sfa_expert,
                             lambda: sfb.toint() + Int64(g) * sfb_expert,
                             lambda: c.toint() + Int64(g) * c_expert), m, n, k, tile0)
            tile0 += self._tiles_of(m, tiles_n)
            staged_end += m
            ends_out[g] = staged_end
        if lane == 31:
            prefix[num_groups] = tiles_total
        return owner

    @cute.jit
    def _offsets_tables(self, ends, operands, ptrs, sizes, prefix, ends_out, num_groups, rows,
                        n, k, lane, first, count, first_tile_of=None) -> Int32:
        """The offsets layout (torch's 2D x 3D form; module docstring)."""
        a, b, sfa, sfb, c = operands

        # The running maximum of the clamped offsets at the end of the previous lanes' experts.
        top = Int32(0)
        for i in cutlass.range(count, unroll=1):
            top = self._clamped_end(ends, first + i, rows, top)
        for d in cutlass.range_constexpr(SCAN_STEPS):
            below = cute.arch.shuffle_sync_up(top, 1 << d)
            if lane >= (1 << d):
                top = cutlass.max(top, below)
        start = cute.arch.shuffle_sync_up(top, 1)
        if lane == 0:
            start = Int32(0)

        # This lane's CTA tiles and padded A-scale rows; the scans give where they start.
        tiles_n = (n + self.tile_n - 1) // self.tile_n
        end = start
        tiles = Int32(0)
        scale_rows = Int32(0)
        for i in cutlass.range(count, unroll=1):
            nxt = self._clamped_end(ends, first + i, rows, end)
            m = nxt - end
            tiles += self._tiles_of(m, tiles_n)
            scale_rows += (m + SCALE_ROWS - 1) // SCALE_ROWS * SCALE_ROWS
            end = nxt
        tiles_end, tiles_total = self._lane_scan(tiles, lane)
        scale_end, _ = self._lane_scan(scale_rows, lane)

        tile0 = tiles_end - tiles
        scale0 = scale_end - scale_rows
        a_row = Int64(k // 2)
        b_expert = Int64(n) * Int64(k // 2)
        sfa_row = Int64(scale_cols(k))
        sfb_expert = Int64(blocked_scale_numel(n, k))
        c_row = Int64(n) * Int64(self.c_dtype.width // 8)
        end = start
        owner = Int32(-1)
        wanted = Int32(0) if first_tile_of is None else first_tile_of(tiles_total)
        for i in cutlass.range(count, unroll=1):
            g = first + i
            nxt = self._clamped_end(ends, g, rows, end)
            m = nxt - end
            if cutlass.const_expr(first_tile_of is not None):
                if self._owns(wanted, tile0, self._tiles_of(m, tiles_n)) != 0:
                    owner = g
            self._write_row(ptrs, sizes, prefix, g,
                            (lambda: a.toint() + Int64(end) * a_row,
                             lambda: b.toint() + Int64(g) * b_expert,
                             lambda: sfa.toint() + Int64(scale0) * sfa_row,
                             lambda: sfb.toint() + Int64(g) * sfb_expert,
                             lambda: c.toint() + Int64(end) * c_row), m, n, k, tile0)
            tile0 += self._tiles_of(m, tiles_n)
            scale0 += (m + SCALE_ROWS - 1) // SCALE_ROWS * SCALE_ROWS
            ends_out[g] = nxt
            end = nxt
        if lane == 31:
            prefix[num_groups] = tiles_total
        return owner
