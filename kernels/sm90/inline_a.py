"""inline_a (a mixin of Sm90GroupedGemm; Config.inline_a, decode tiles of tile_m <= 32): no
phase 1 and no grid barrier. Warps 1 and 2 of the producer warpgroup convert each tile's packed A
rows into the fp16 ring themselves, taking turns at batches of steps as the consumers free its
slots (staging.py's inline layout); warp 3 stores C tiles, and warp 0 loads only weights. A
decode call's phase 1 is 3-8 us of launch-to-first-tile latency (the last CTA's staging and the
grid barrier's round trips, docs/lab_notebook.md, twentieth session); the price is A converted
once per n-tile instead of once per call, as much conversion per step as a consumer warp's."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from kernels import tables

from .config import INLINE_A_ROWS, INLINE_A_WARPS, SUB_K
from .dequant import half_step_vectors, load_half_step
from .ptx import st_shared_v4
from .staging import inline_row_offsets, inline_smem_offset, inline_step_offsets
from .structure import SUB_STEPS


class InlineA:
    """inline_a's roles: the converter warps, and the role dispatch without phase 1."""

    def _converter_warps(self) -> int:
        """Producer-warpgroup warps that convert A (0 unless inline_a): INLINE_A_WARPS."""
        return INLINE_A_WARPS if self.config.inline_a else 0

    @cute.jit
    def _roles_inline(self, mainloop, cta, tidx, warp_idx) -> None:
        """Warp 0: descriptors and weights (prologue, then the tile loop); warps 1..converters:
        A; the other warps of warpgroup 0: C tiles; then the consumers. No grid barrier: each
        A slot is ready when every lane of its converter warp has arrived on it."""
        cute.arch.barrier()  # the first-group post (_run) and the pipelines' barriers
        self._split_roles(mainloop, cta, tidx, warp_idx,
                          lambda: self._producer_a16(mainloop, cta,
                                                     first=self._producer_prologue(mainloop,
                                                                                   cta)),
                          lambda: self._inline_helpers(mainloop, cta, tidx, warp_idx))

    @cute.jit
    def _inline_helpers(self, mainloop, cta, tidx, warp_idx) -> None:
        """Warps 1..3: the converter warps first, then the storers."""
        converters = self._converter_warps()
        if warp_idx <= converters:
            self._convert_tiles(mainloop, cta, warp_idx - 1, tidx % 32)
        else:
            self._store_tiles(mainloop.storage, cta, tidx - 32 * (1 + converters))

    @cute.jit
    def _convert_tiles(self, mainloop, cta, warp, lane) -> None:
        """Converter warp `warp` (0 or 1) of this CTA's tiles. Each tile's 64-K steps, in the
        consumers' order, form batches of one 256-K stage (lane 2 r + h loads half h of each
        step of row r, and of row r + 16 at tile_m 32); the two warps take the batches in turn,
        numbered across tiles, so each has two stages' time for its loads' latency. Half h is
        the step's words of parity h (dequant.load_half_step). Each step
        is converted and stored once its slot is free, fenced for the wgmma (async proxy), and
        every lane arrives on the slot's full barrier (INLINE_A_ARRIVALS). Rows past the
        group's m read its last row (their C rows are never stored); chunks past k (a last
        stage running past it) are zeros, as TMA's fill was."""
        sizes, ptrs, prefix = cta.sizes, cta.ptrs, cta.prefix
        a_pipe = mainloop.a_pipe
        a16 = mainloop.storage.a16.data_ptr().toint()
        slot_bytes = self.tile_m * SUB_K * 2
        slots = self.config.a_slots
        rows = self.tile_m // INLINE_A_ROWS  # rows per lane
        batch_steps = SUB_STEPS  # a batch is one 256-K stage
        ahead = batch_steps if rows == 1 else 2
        r = lane // 2
        h = lane % 2
        step = Int32(0)  # the running step count of the A ring (slot and phase)
        batch = Int32(0)
        tile = cta.first_tile
        group = Int32(0)
        if tile < cta.tile_end:
            group = self._first_group(mainloop.storage, cta)
        while tile < cta.tile_end:
            group, m, _, k = self._group_of(tile, group, prefix, sizes)
            tile_m_idx, _ = self._tile_coords(tile, group, prefix, m)
            a_rows, sf_rows = [], []
            for j in cutlass.range_constexpr(rows):
                row = cutlass.min(tile_m_idx * self.tile_m + j * INLINE_A_ROWS + r, m - 1)
                a_off, sf_off = inline_row_offsets(row, k)
                a_rows.append(ptrs[group, tables.PTR_A] + Int64(a_off))
                sf_rows.append(ptrs[group, tables.PTR_SFA] + Int64(sf_off))
            k_steps = k // SUB_K
            for b in cutlass.range(self._k_stages(k), unroll=1):
                if batch % INLINE_A_WARPS == warp:
                    # Step t's loads (this lane's half of the step per row) go out `ahead`
                    # steps before its conversion: the whole stage at once at tile_m 16; at 32,
                    # whose 8 loads would not fit the producer's registers, two steps ahead.
                    words, scales = [], []
                    for t in cutlass.range_constexpr(batch_steps + ahead):
                        if cutlass.const_expr(t < batch_steps):
                            # A step past k reads the last one (valid memory), converted as 0.
                            ca, cs = inline_step_offsets(
                                cutlass.min(b * batch_steps + t, k_steps - 1))
                            for j in cutlass.range_constexpr(rows):
                                w, sc = load_half_step(a_rows[j] + Int64(ca),
                                                       sf_rows[j] + Int64(cs), h)
                                words.append(w)
                                scales.append(sc)
                        if cutlass.const_expr(t >= ahead):
                            u = t - ahead
                            # All ones for a step inside k, zero past it.
                            keep = Uint32((b * batch_steps + u - k_steps) >> 31)
                            slot = (step + u) % slots
                            # The producer's parity: a fresh barrier's "previous phase" (1) passes.
                            a_pipe.sync_object_empty.wait(slot, ((step + u) // slots + 1) % 2)
                            base = a16 + slot * slot_bytes
                            for j in cutlass.range_constexpr(rows):
                                i = u * rows + j
                                vector = half_step_vectors([w & keep for w in words[i]],
                                                           scales[i])
                                for q in cutlass.range_constexpr(4):
                                    st_shared_v4(base + inline_smem_offset(r + j * INLINE_A_ROWS, h,
                                                                           q), *vector(q))
                            # Each lane fences its own stores for the wgmma (async proxy) and
                            # arrives itself. A lane-0 arrival after a warp barrier is as exact
                            # and no faster (twenty-second session, run 7).
                            cute.arch.fence_view_async_shared()
                            cute.arch.mbarrier_arrive(a_pipe.sync_object_full.get_barrier(slot))
                batch += 1
                step += batch_steps
            tile += cta.tile_step
