"""The device-offsets kernel (Config.device_offsets): the serving contract of issue 26.

The call is torch's scaled_grouped_mm 2D x 3D layout, with nothing computed on the host:
    a (T, K/2) packed fp4, rows grouped by expert; b (E, N, K/2); sfa blocked, each expert's
    rows padded to 128 (expert g's scales start at row sum_{i<g} round_up(m_i, 128)); sfb
    (E, blocked(N, K)); c (T, N); offs (E,) int32 cumulative end offsets (expert g owns rows
    offs[g-1] .. offs[g]).
The kernel takes the operands' base addresses, offs, T, N and K as parameters. Each CTA's first
warp derives the list kernel's three tables (kernels/tables.py layouts) from them into the CTA's
own slot of the workspace (runtime.formats.offsets_tables_bytes, after the descriptor sets), the
CTA synchronizes, and the kernel runs exactly as the list kernel does on those tables. One
launch per call and no per-call host work: a captured graph serves every routing.

Bad offsets cannot move an access out of bounds: each offset is clamped to [0, T] and the ends
are made non-decreasing (a running maximum) before any pointer is formed, so every expert's rows
lie inside a and c and its scale rows inside sfa's bound of round_up(T, 128) + 128 E rows.

Each lane of the warp takes a run of consecutive experts; shuffle scans give the running
maximum, the CTA-tile prefix and the A-scale row prefix. Every CTA reads E offsets and writes
about 60 E bytes: for E = 256, 15 KB per CTA, read back from L1/L2 by its own roles.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from kernels import tables
from kernels.abi import KernelArgs
from runtime.formats import (
    POINTER_ROW_BYTES,
    PROBLEM_ROW_BYTES,
    SCALE_ROWS,
    blocked_scale_numel,
    offsets_tables_bytes,
    scale_cols,
)

from .grouped_gemm import Sm90GroupedGemm

_SCAN_STEPS = 5  # shuffle-scan steps over a warp's 32 lanes


class Sm90OffsetsGemm(Sm90GroupedGemm):
    """Sm90GroupedGemm with the call's tables derived on the device from its offsets."""

    # ------------------------------------------------------------------ host (trace time)
    @cute.jit
    def __call__(
        self,
        offs: cute.Pointer,
        a: cute.Pointer,
        b: cute.Pointer,
        sfa: cute.Pointer,
        sfb: cute.Pointer,
        c: cute.Pointer,
        workspace: cute.Pointer,
        grid_barrier: cute.Pointer,
        alpha: cute.Pointer,
        num_groups: Int32,
        rows: Int32,
        n: Int32,
        k: Int32,
        num_ctas: Int32,
    ) -> None:
        args = KernelArgs()
        self._record_templates(args)
        if cutlass.const_expr(self.config.masked):
            args.operand("masked_m", offs, "masked_m")
        else:
            args.operand("offs", offs, "offs")
        for name, ptr in (("a", a), ("b", b), ("sfa", sfa), ("sfb", sfb), ("c", c)):
            args.operand(name, ptr, name)
        self._record_state(args, workspace, grid_barrier, alpha, num_groups)
        if cutlass.const_expr(self.config.masked):
            args.scalar("max_m", rows, "max_m")
        else:
            args.scalar("rows", rows, "rows")
        args.scalar("n", n, "n")
        args.scalar("k", k, "k")
        self._launch(args, num_ctas)

    # ------------------------------------------------------------------ device
    @cute.kernel
    def kernel(
        self,
        tma_b: cute.CopyAtom,
        tma_a: cute.CopyAtom,
        tma_sfb: cute.CopyAtom,
        tma_sfa: cute.CopyAtom,
        offs: cute.Pointer,
        a: cute.Pointer,
        b: cute.Pointer,
        sfa: cute.Pointer,
        sfb: cute.Pointer,
        c: cute.Pointer,
        workspace: cute.Pointer,
        grid_barrier: cute.Pointer,
        alpha: cute.Pointer,
        num_groups: Int32,
        rows: Int32,
        n: Int32,
        k: Int32,
    ) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        slot = (self._descriptors_end(workspace.toint(), grid)
                + Int64(bidx) * Int64(offsets_tables_bytes(num_groups)))
        sizes_at = slot + Int64(POINTER_ROW_BYTES) * Int64(num_groups)
        prefix_at = sizes_at + Int64(PROBLEM_ROW_BYTES) * Int64(num_groups)
        if warp_idx == 0:
            self._derive_tables(offs, (a, b, sfa, sfb, c), slot, sizes_at, prefix_at,
                                num_groups, rows, n, k, tidx)
        # The tables (plain global stores of warp 0) are read by every role from here on.
        cute.arch.barrier()
        gmem = cute.AddressSpace.gmem
        self._run((tma_b, tma_a, tma_sfb, tma_sfa),
                  cute.make_ptr(Int32, sizes_at, gmem, assumed_align=8),
                  cute.make_ptr(Int64, slot, gmem, assumed_align=16),
                  cute.make_ptr(Int32, prefix_at, gmem, assumed_align=8),
                  workspace, grid_barrier, alpha, num_groups, tidx, warp_idx, bidx, grid)

    @cute.jit
    def _clamped_end(self, ends: cute.Tensor, g: Int32, rows: Int32, below: Int32) -> Int32:
        """Expert g's end row: offs[g] clamped to [0, rows], and at least `below` (the previous
        expert's end: the running maximum)."""
        return cutlass.max(cutlass.min(cutlass.max(ends[g], Int32(0)), rows), below)

    @cute.jit
    def _derive_tables(self, offs, operands, slot, sizes_at, prefix_at, num_groups, rows, n,
                       k, lane) -> None:
        """Warp 0: the pointer, problem-size and CTA-prefix tables of this call (module
        docstring) at `slot`, `sizes_at` and `prefix_at`. Lane l takes experts
        [l * per, l * per + count)."""
        gmem = cute.AddressSpace.gmem
        ends = cute.make_tensor(offs, cute.make_layout(num_groups))
        ptrs = cute.make_tensor(cute.make_ptr(Int64, slot, gmem, assumed_align=16),
                                cute.make_layout((num_groups, 5), stride=(5, 1)))
        sizes = cute.make_tensor(cute.make_ptr(Int32, sizes_at, gmem, assumed_align=8),
                                 cute.make_layout((num_groups, 4), stride=(4, 1)))
        prefix = cute.make_tensor(cute.make_ptr(Int32, prefix_at, gmem, assumed_align=8),
                                  cute.make_layout(num_groups + 1))
        per = (num_groups + 31) // 32
        first = lane * per
        count = cutlass.max(cutlass.min(first + per, num_groups) - first, Int32(0))
        if cutlass.const_expr(self.config.masked):
            self._masked_tables(ends, operands, ptrs, sizes, prefix, num_groups, rows, n, k,
                                lane, first, count)
        else:
            self._offsets_tables(ends, operands, ptrs, sizes, prefix, num_groups, rows, n, k,
                                 lane, first, count)

    @cute.jit
    def _masked_tables(self, masked_m, operands, ptrs, sizes, prefix, num_groups, max_m, n, k,
                       lane, first, count) -> None:
        """The masked layout (Config.masked): expert g's rows start at g * max_m in a and c, its
        scales at blocked row g * round_up(max_m, 128) of sfa; masked_m[g] clamped to [0, max_m]
        rows are valid."""
        a, b, sfa, sfb, c = operands
        tiles_n = (n + self.tile_n - 1) // self.tile_n
        tiles = Int32(0)
        for i in cutlass.range(count, unroll=1):
            m = cutlass.min(cutlass.max(masked_m[first + i], Int32(0)), max_m)
            tiles += (m + self.tile_m - 1) // self.tile_m * tiles_n
        tiles_end, tiles_total = self._lane_scan(tiles, lane)
        tile0 = tiles_end - tiles
        a_expert = Int64(max_m) * Int64(k // 2)
        b_expert = Int64(n) * Int64(k // 2)
        sfa_expert = Int64(blocked_scale_numel(max_m, k))
        sfb_expert = Int64(blocked_scale_numel(n, k))
        c_expert = Int64(max_m) * Int64(n) * Int64(self.c_dtype.width // 8)
        for i in cutlass.range(count, unroll=1):
            g = first + i
            m = cutlass.min(cutlass.max(masked_m[g], Int32(0)), max_m)
            ptrs[g, tables.PTR_A] = a.toint() + Int64(g) * a_expert
            ptrs[g, tables.PTR_B] = b.toint() + Int64(g) * b_expert
            ptrs[g, tables.PTR_SFA] = sfa.toint() + Int64(g) * sfa_expert
            ptrs[g, tables.PTR_SFB] = sfb.toint() + Int64(g) * sfb_expert
            ptrs[g, tables.PTR_C] = c.toint() + Int64(g) * c_expert
            sizes[g, tables.COL_M] = m
            sizes[g, tables.COL_N] = n
            sizes[g, tables.COL_K] = k
            sizes[g, tables.COL_L] = Int32(1)
            prefix[g] = tile0
            tile0 += (m + self.tile_m - 1) // self.tile_m * tiles_n
        if lane == 31:
            prefix[num_groups] = tiles_total

    @cute.jit
    def _offsets_tables(self, ends, operands, ptrs, sizes, prefix, num_groups, rows, n, k,
                        lane, first, count) -> None:
        """The offsets layout (torch's 2D x 3D form; module docstring)."""
        a, b, sfa, sfb, c = operands

        # The running maximum of the clamped offsets at the end of the previous lanes' experts.
        top = Int32(0)
        for i in cutlass.range(count, unroll=1):
            top = self._clamped_end(ends, first + i, rows, top)
        for d in cutlass.range_constexpr(_SCAN_STEPS):
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
            tiles += (m + self.tile_m - 1) // self.tile_m * tiles_n
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
        for i in cutlass.range(count, unroll=1):
            g = first + i
            nxt = self._clamped_end(ends, g, rows, end)
            m = nxt - end
            ptrs[g, tables.PTR_A] = a.toint() + Int64(end) * a_row
            ptrs[g, tables.PTR_B] = b.toint() + Int64(g) * b_expert
            ptrs[g, tables.PTR_SFA] = sfa.toint() + Int64(scale0) * sfa_row
            ptrs[g, tables.PTR_SFB] = sfb.toint() + Int64(g) * sfb_expert
            ptrs[g, tables.PTR_C] = c.toint() + Int64(end) * c_row
            sizes[g, tables.COL_M] = m
            sizes[g, tables.COL_N] = n
            sizes[g, tables.COL_K] = k
            sizes[g, tables.COL_L] = Int32(1)
            prefix[g] = tile0
            tile0 += (m + self.tile_m - 1) // self.tile_m * tiles_n
            scale0 += (m + SCALE_ROWS - 1) // SCALE_ROWS * SCALE_ROWS
            end = nxt
        if lane == 31:
            prefix[num_groups] = tiles_total
