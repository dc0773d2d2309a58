"""The staged-A kernel's roles under Config.stream_k (a mixin of Sm90GroupedGemm): the producer
and consumers walk the same work items, whole tiles for the full waves and then K pieces of the
last wave's tiles (kernels/sm90/stream_k.py), and the consumers pass partial sums between CTAs
through the workspace. Phase 1 and the grid barrier are staged.py's, unchanged.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, Int64, Uint32

from kernels import tables

from .config import K_TILE
from .ptx import (ld_acquire_gpu_u32, ld_global_cg_v4_f32, nanosleep, red_add_release_gpu_u32,
                  st_global_v4_f32)
from .stream_k import dp_tiles, piece, unit_owner, unit_range



_NO_END = 1 << 30  # k_end of a whole tile before it is clamped to the tile's stages
_SK_BARRIER = 2  # named barrier of the consumer warps (0 is the CTA's, 1 is v2's step barrier)


class StreamK:
    """Stream-K variants of the staged-A producer and consumers."""

    @cute.jit
    def _sk_units(self, t_dp, sizes, prefix, num_groups) -> Int32:
        """Stream-K units (weight stages) of the tiles from t_dp on."""
        units = Int32(0)
        for g in cutlass.range(num_groups, unroll=1):
            lo = cutlass.max(prefix[g], t_dp)
            hi = prefix[g + 1]
            if hi > lo:
                units += (hi - lo) * (sizes[g, tables.COL_K] // K_TILE)
        return units

    @cute.jit
    def _sk_tile(self, unit, t_dp, sizes, prefix, num_groups) -> tuple:
        """(tile, its first unit) of stream-K unit `unit`."""
        base = Int32(0)
        tile = Int32(0)
        start = Int32(0)
        found = Int32(0)
        for g in cutlass.range(num_groups, unroll=1):
            lo = cutlass.max(prefix[g], t_dp)
            hi = prefix[g + 1]
            stages = sizes[g, tables.COL_K] // K_TILE
            if found == 0 and hi > lo:
                count = (hi - lo) * stages
                if unit < base + count:
                    offset = (unit - base) // stages
                    tile = lo + offset
                    start = base + offset * stages
                    found = Int32(1)
                base += count
        return tile, start

    @cute.jit
    def _sk_next(self, dp_left, tile_dp, u_lo, u_hi, t_dp, grid, sizes, prefix,
                 num_groups) -> tuple:
        """The next work item: (tile, k_begin, k_end (_NO_END for a whole tile), the tile's
        first unit, dp_left, next DP tile, u_hi)."""
        tile = Int32(0)
        kb = Int32(0)
        ke = Int32(_NO_END)
        ts = Int32(0)
        if dp_left > 0:
            tile = tile_dp
            tile_dp = tile_dp + grid
            dp_left = dp_left - 1
        else:
            tile, ts = self._sk_tile(u_hi - 1, t_dp, sizes, prefix, num_groups)
            kb, ke = piece(u_lo, u_hi, ts, cutlass.max)
            u_hi = ts + kb
        return tile, kb, ke, ts, dp_left, tile_dp, u_hi

    @cute.jit
    def _sk_range(self, sizes, prefix, total_tiles, bidx, grid, num_groups) -> tuple:
        """(tiles computed whole, stream-K units, this CTA's first unit, its unit end)."""
        t_dp = dp_tiles(total_tiles, grid)
        units = self._sk_units(t_dp, sizes, prefix, num_groups)
        u_lo, u_hi = unit_range(bidx, units, grid)
        return t_dp, units, u_lo, u_hi

    @cute.jit
    def _sk_first(self, sizes, prefix, total_tiles, bidx, grid, num_groups, sk_range) -> tuple:
        """(group, weight stages to prefetch, tile, k_begin) of this CTA's first work item
        (`sk_range` from _sk_range); group -1 and 0 stages without one."""
        t_dp, _, u_lo, u_hi = sk_range
        tile, kb, ke, _, _, _, _ = self._sk_next(total_tiles // grid, bidx, u_lo, u_hi, t_dp,
                                                 grid, sizes, prefix, num_groups)
        group = Int32(-1)
        pre = Int32(0)
        if bidx < t_dp or u_hi > u_lo:
            group, _, _, k = self._group_of(tile, Int32(0), prefix, sizes)
            pre = cutlass.min(Int32(self.stages), cutlass.min(ke, k // K_TILE) - kb)
        return group, pre, tile, kb

    @cute.jit
    def _producer_sk(self, tma_b, tma_a16, tma_sfb, storage, b_pipe, a_pipe, sizes, ptrs,
                     prefix, desc_base, a16_base, total_tiles, bidx, grid, num_groups) -> None:
        atoms = (tma_b, tma_a16, tma_sfb)
        ws = cute.make_ptr(Int64, desc_base, cute.AddressSpace.gmem, assumed_align=128)
        b_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        a_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                               self.config.a_slots)
        sk_range = self._sk_range(sizes, prefix, total_tiles, bidx, grid, num_groups)
        t_dp, _, u_lo, u_hi = sk_range
        prev_group, pre, _, _ = self._sk_first(sizes, prefix, total_tiles, bidx, grid,
                                               num_groups, sk_range)
        for _ in cutlass.range(pre, unroll=1):
            b_state.advance()
        dp_left = total_tiles // grid
        tile_dp = bidx
        desc_set = Int32(0)
        while dp_left > 0 or u_hi > u_lo:
            tile, kb, ke, _, dp_left, tile_dp, u_hi = self._sk_next(
                dp_left, tile_dp, u_lo, u_hi, t_dp, grid, sizes, prefix, num_groups)
            group, m, n, k = self._group_of(tile, Int32(0), prefix, sizes)
            ke = cutlass.min(ke, k // K_TILE)
            desc_set, prev_group = self._patch_on_group_change(
                atoms, ws, bidx, desc_set, prev_group, ptrs, sizes, group, a16_base, m, n, k)
            b_state, a_state, _ = self._produce_piece(
                ws, bidx, desc_set, storage, b_pipe, a_pipe, b_state, a_state, tile, group,
                prefix, m, kb, pre, ke)
            pre = Int32(0)
        b_pipe.producer_tail(b_state)
        a_pipe.producer_tail(a_state)

    @cute.jit
    def _consumer_sk(self, tiled_mma, storage, b_pipe, a_pipe, sizes, ptrs, prefix,
                     total_tiles, bidx, grid, num_groups, sk_base, ct) -> None:
        (frag_a, frag_w, words_w, acc, coords, num_kblocks, packed_b,
         scale_b) = self._consumer_operands(tiled_mma, storage, ct)
        consumers = pipeline.NamedBarrier(barrier_id=_SK_BARRIER,
                                          num_threads=self.consumer_threads)

        b_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        a_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                               self.config.a_slots)
        prev_slot = Int32(0)
        t_dp, units, u_lo, u_hi = self._sk_range(sizes, prefix, total_tiles, bidx, grid,
                                                 num_groups)
        dp_left = total_tiles // grid
        tile_dp = bidx
        while dp_left > 0 or u_hi > u_lo:
            tile, kb, ke, ts, dp_left, tile_dp, u_hi = self._sk_next(
                dp_left, tile_dp, u_lo, u_hi, t_dp, grid, sizes, prefix, num_groups)
            group, m, n, k = self._group_of(tile, Int32(0), prefix, sizes)
            stages = k // K_TILE
            ke = cutlass.min(ke, stages)
            tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
            scale_row0 = (tile_n_idx * self.tile_n) % 128
            b_state, a_state, prev_slot = self._k_loop(
                tiled_mma, acc, frag_a, frag_w, words_w, num_kblocks, packed_b, scale_b, b_pipe,
                a_pipe, b_state, a_state, prev_slot, kb, ke, scale_row0, ct)
            if kb > 0:  # the K before this piece: the partial of the unit's owner
                owner = unit_owner(ts + kb - 1, units, grid)
                self._sk_add_partial(acc, sk_base + owner * self.sk_slot_bytes, ct, consumers)
            if ke < stages:  # the K after it: another CTA finishes this tile
                self._sk_write_partial(acc, sk_base + bidx * self.sk_slot_bytes, ct, consumers)
            else:
                self._store_tile(acc, coords, ptrs[group, tables.PTR_C], m, n,
                                 tile_m_idx * self.tile_m, tile_n_idx * self.tile_n,
                                 self._c_scale(group))

    @cute.jit
    def _sk_add_partial(self, acc, slot, ct, consumers) -> None:
        """Wait for the partial in `slot` (its flag set), then add it to acc. Element 4 i + j of
        consumer thread ct sits at 16 (i * consumer threads + ct) + 4 j."""
        flag = slot + self.sk_flag_offset
        if ct == 0:
            ready = ld_acquire_gpu_u32(flag)
            while ready == Uint32(0):
                nanosleep(32)
                ready = ld_acquire_gpu_u32(flag)
        consumers.arrive_and_wait()
        for i in cutlass.range_constexpr(cute.size(acc) // 4):
            v = ld_global_cg_v4_f32(slot + (i * self.consumer_threads + ct) * 16)
            for j in cutlass.range_constexpr(4):
                acc[4 * i + j] = acc[4 * i + j] + v[j]

    @cute.jit
    def _sk_write_partial(self, acc, slot, ct, consumers) -> None:
        """acc to `slot` (layout of _sk_add_partial), then its flag raised."""
        for i in cutlass.range_constexpr(cute.size(acc) // 4):
            st_global_v4_f32(slot + (i * self.consumer_threads + ct) * 16, acc[4 * i],
                             acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3])
        cute.arch.fence_acq_rel_gpu()
        consumers.arrive_and_wait()
        if ct == 0:
            red_add_release_gpu_u32(slot + self.sk_flag_offset, 1)
