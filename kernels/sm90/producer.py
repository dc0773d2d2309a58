"""v3's producer (warp 0; a mixin of Sm90GroupedGemm, kernels/sm90/grouped_gemm.py): the
descriptor templates and the first tile's weight stages during phase 1 (_producer_prologue),
then the tile loop that patches each next group's descriptors one tile ahead and TMA-loads the
weight stages (b_pipe) and the fp16 A ring (a_pipe), with stream_a waiting for staged A rows."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float16, Int32, Int64

from kernels import tables
from kernels.device_offsets import row_ends, staged_start

from . import tma
from .config import K_TILE, SUB_K
from .ptx import prefetch_tensormap
from .structure import OP_A, OP_B, OP_SFB, PACKED_ROW_BYTES, SCALE_BOX, SUB_STEPS


class TileProducer:
    """v3's producer warp: descriptors, weight stages and fp16 A tiles."""

    @cute.jit
    def _a16_offset(self, cta, group) -> Int64:
        """Byte offset of group `group`'s fp16 A in the staging area. A device-offsets kernel
        reads it off its ROW_ENDS table (one k for all experts), since the list kernel's sum
        over the groups before it is a chain of `group` loads (docs/lab_notebook.md, 17th
        session: the slowest step of a decode tile at E = 128)."""
        sizes = cta.sizes
        offset = Int64(0)
        if cutlass.const_expr(self.config.device_offsets):
            offset = (Int64(staged_start(row_ends(cta.prefix, cta.num_groups), group))
                      * Int64(sizes[group, tables.COL_K] * 2))
        else:
            for g in cutlass.range(group, unroll=1):
                offset += Int64(sizes[g, tables.COL_M]) * Int64(sizes[g, tables.COL_K] * 2)
        return offset

    @cute.jit
    def _first_tile_prefetch(self, cta, start) -> tuple:
        """(group, weight stages) of this CTA's first tile that _producer_prologue loads before
        the grid barrier: the weights do not depend on phase 1. (-1, 0) without a tile. The
        walk to the group goes from `start` (_first_group)."""
        group = Int32(-1)
        pre = Int32(0)
        if cta.first_tile < cta.tile_end:
            group, _, _, k = self._group_of(cta.first_tile, start, cta.prefix, cta.sizes)
            pre = cutlass.min(Int32(self.stages), self._k_stages(k))
        return group, pre

    @cute.jit
    def _producer_prologue(self, mainloop, cta) -> tuple:
        """Warp 0 during phase 1: the descriptor templates, set 0 patched for the first tile's
        group, and that tile's first weight stages in flight while the other warps stage A.
        Returns _first_tile_prefetch's (group, stages)."""
        bidx = cta.bidx
        ws = cute.make_ptr(Int64, mainloop.desc_base, cute.AddressSpace.gmem, assumed_align=128)
        self._copy_templates(mainloop.atoms, ws, bidx)
        self._stamp_prologue(1)
        group, pre = self._first_tile_prefetch(cta, self._first_group(mainloop.storage, cta))
        if pre > 0:
            _, m, n, k = self._group_of(cta.first_tile, group, cta.prefix, cta.sizes)
            self._patch_descriptors_a16(mainloop, ws, cta, Int32(0), group, m, n, k)
            self._stamp_prologue(2)
            _, tile_n_idx = self._tile_coords(cta.first_tile, group, cta.prefix, m)
            b_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                   self.stages)
            d_b = self._desc(ws, bidx, 0, OP_B)
            d_sfb = self._desc(ws, bidx, 0, OP_SFB)
            for kt in cutlass.range(0, 0 + pre, unroll=1):
                b_state = self._produce_b(mainloop, b_state, d_b, d_sfb, kt,
                                          tile_n_idx * self.tile_n)
                self._stamp_prologue(3, kt)
        return group, pre

    @cute.jit
    def _produce_b(self, mainloop, b_state, d_b, d_sfb, kt, row_b, trace=None) -> Any:
        """One weight stage (packed rows and their scales) into the next b_pipe slot; returns
        the advanced state (the caller rebinds it: the DSL threads loop-carried state through
        plain local variables, not through attributes a helper changes)."""
        b_pipe, storage = mainloop.b_pipe, mainloop.storage
        b_pipe.producer_acquire(b_state)
        self._stamp_stage(trace, kt, 0)
        bar = b_pipe.producer_get_barrier(b_state)
        stage = b_state.index
        tma.tma_load(d_b, storage.packed_b.data_ptr() + stage * (self.tile_n * PACKED_ROW_BYTES),
                     bar, (kt * PACKED_ROW_BYTES, row_b))
        tma.tma_load(d_sfb, storage.scale_b.data_ptr() + stage * self.sfb_stage_bytes,
                     bar, (0, kt * SCALE_BOX[1], row_b // 128))
        b_pipe.producer_commit(b_state)
        self._stamp_stage(trace, kt, 1)
        b_state.advance()
        return b_state

    @cute.jit
    def _produce_a(self, mainloop, a_state, d_a, kt, row_a, trace=None) -> Any:
        """The fp16 A tiles of one stage's K (SUB_STEPS slots of the A ring); returns the
        advanced state, as _produce_b."""
        a_pipe = mainloop.a_pipe
        a16 = mainloop.storage.a16.data_ptr()
        # inline_a: the converter warps fill the ring (inline_a.py), never this warp.
        for s in cutlass.range_constexpr(0 if self.config.inline_a else SUB_STEPS):
            a_pipe.producer_acquire(a_state)
            self._stamp_stage(trace, kt, 2 + s)
            tma.tma_load(d_a, a16 + a_state.index * (self.tile_m * SUB_K),
                         a_pipe.producer_get_barrier(a_state), (kt * K_TILE + s * SUB_K, row_a))
            a_pipe.producer_commit(a_state)
            a_state.advance()
        return a_state

    @cute.jit
    def _producer_a16(self, mainloop, cta, progress=None, first=None) -> None:
        """After the grid barrier; _producer_prologue has copied the templates and loaded the
        first tile's first `pre` weight stages with descriptor set 0. With stream_a there is no
        grid barrier: `progress` (streamed.py) lets each tile's A loads wait for their chunks.
        `first`: the prologue's (group, pre), kept in registers; None looks them up again."""
        ws = cute.make_ptr(Int64, mainloop.desc_base, cute.AddressSpace.gmem, assumed_align=128)
        b_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        a_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                               self.config.a_slots)
        if cutlass.const_expr(first is None):
            prev_group, pre = self._first_tile_prefetch(cta, self._first_group(mainloop.storage,
                                                                                cta))
        else:
            prev_group, pre = first
        for _ in cutlass.range(pre, unroll=1):
            b_state.advance()
        b_state, a_state = self._producer_tiles_ahead(mainloop, ws, cta, b_state, a_state, pre,
                                                      prev_group, progress)
        mainloop.b_pipe.producer_tail(b_state)
        if cutlass.const_expr(not self.config.inline_a):
            mainloop.a_pipe.producer_tail(a_state)

    @cute.jit
    def _tile_loads(self, ws, cta, desc_set, tile, group, m, progress=None) -> tuple:
        """What a tile's loads need: the B, A and weight-scale descriptors of set `desc_set`,
        the tile's first A row and weight row, and with stream_a (`progress`, streamed.py) the
        (progress, A row end, grid) wait for _stage_a_ready, else None."""
        bidx = cta.bidx
        tile_m_idx, tile_n_idx = self._tile_coords(tile, group, cta.prefix, m)
        d_b = self._desc(ws, bidx, desc_set, OP_B)
        d_a = self._desc(ws, bidx, desc_set, OP_A)
        d_sfb = self._desc(ws, bidx, desc_set, OP_SFB)
        row_a = tile_m_idx * self.tile_m
        row_b = tile_n_idx * self.tile_n
        wait = None
        if cutlass.const_expr(progress is not None):
            wait = (progress, self._row_end(cta.sizes, group, row_a, m), cta.grid)
        return d_b, d_a, d_sfb, row_a, row_b, wait

    @cute.jit
    def _producer_tiles_ahead(self, mainloop, ws, cta, b_state, a_state, pre, prev_group,
                              progress=None) -> tuple:
        """patch_ahead's tile loop. A tile's loads go in this order: its first A stage (and its
        second weight stage), then the look-ahead (the next tile's group, found by a table walk,
        patched into the next descriptor set), then each weight stage one stage before its A,
        with the next tile's first weight stage before this tile's last A. So a tile start
        waits neither for weights issued after the previous tile's last A slot came free nor
        for the producer's per-tile work (docs/lab_notebook.md, tenth session). The first tile's
        first `pre` (>= 1) weight stages come from the prologue. Returns the pipeline states."""
        sizes, prefix = cta.sizes, cta.prefix
        first, step, end, bidx = cta.first_tile, cta.tile_step, cta.tile_end, cta.bidx
        ready = Int32(0)
        desc_set = Int32(0)
        ahead_set = Int32(0)  # the newest patched set and the group it holds (the prologue's)
        ahead_group = prev_group
        group, m, k = Int32(0), Int32(0), Int32(0)
        if first < end:
            # From the first tile's group (_first_tile_prefetch's), not from group 0.
            group, m, _, k = self._group_of(first, prev_group, prefix, sizes)
        tile = first
        while tile < end:
            trace = self._tile_trace(tile, cta)
            if group != prev_group:
                desc_set = ahead_set  # patched while the previous tile loaded
                prev_group = group
            stages = self._k_stages(k)
            d_b, d_a, d_sfb, row_a, row_b, wait = self._tile_loads(ws, cta, desc_set, tile, group,
                                                                   m, progress)
            # Stage 0: the second weight stage unless the prologue loaded it, then the A.
            second = cutlass.min(stages - 1, 1) - cutlass.min(cutlass.max(pre - 1, 0), 1)
            for _ in cutlass.range(second, unroll=1):
                b_state = self._produce_b(mainloop, b_state, d_b, d_sfb, 1, row_b, trace)
            ready = self._stage_a_ready(wait, ready, 0, 0, trace)
            a_state = self._produce_a(mainloop, a_state, d_a, 0, row_a, trace)
            # The look-ahead, now that the tile's first loads are out.
            next_group, nm, nk = group, m, k
            has_next = Int32(0)
            if tile + step < end:
                has_next = Int32(1)
                next_group, nm, nn, nk = self._group_of(tile + step, group, prefix, sizes)
                if next_group != ahead_group:
                    ahead_set = self._next_set(ahead_set)
                    self._patch_descriptors_a16(mainloop, ws, cta, ahead_set, next_group, nm, nn,
                                                nk)
                    for o in cutlass.range_constexpr(len(mainloop.atoms)):
                        prefetch_tensormap(self._desc(ws, bidx, ahead_set, o).toint())
                    ahead_group = next_group
            _, next_tile_n = self._tile_coords(tile + step, next_group, prefix, nm)
            # Stages 1..: A only while the next weight stage is the prologue's, then each
            # weight stage one ahead of its A, the next tile's first, and the last A.
            for kt in cutlass.range(1, pre - 1, unroll=1):
                ready = self._stage_a_ready(wait, ready, kt, 0, None)
                a_state = self._produce_a(mainloop, a_state, d_a, kt, row_a, trace)
            for kt in cutlass.range(cutlass.max(pre - 1, 1), stages - 1, unroll=1):
                b_state = self._produce_b(mainloop, b_state, d_b, d_sfb, kt + 1, row_b, trace)
                ready = self._stage_a_ready(wait, ready, kt, 0, None)
                a_state = self._produce_a(mainloop, a_state, d_a, kt, row_a, trace)
            for _ in cutlass.range(has_next, unroll=1):
                b_state = self._produce_b(mainloop, b_state, self._desc(ws, bidx, ahead_set, OP_B),
                                          self._desc(ws, bidx, ahead_set, OP_SFB), 0,
                                          next_tile_n * self.tile_n)
            for _ in cutlass.range(cutlass.min(stages - 1, 1), unroll=1):  # stages >= 2
                ready = self._stage_a_ready(wait, ready, stages - 1, 0, None)
                a_state = self._produce_a(mainloop, a_state, d_a, stages - 1, row_a, trace)
            group, m, k = next_group, nm, nk
            pre = Int32(1)  # the next tile's first weight stage is on its way
            tile += step
        return b_state, a_state

    @cute.jit
    def _stage_a_ready(self, wait, ready, kt, kb, trace) -> Int32:
        """With stream_a (`wait` not None), wait until stage kt's A rows are staged (and in a
        trace, stamp the first tile's first such wait); returns `ready` updated."""
        if cutlass.const_expr(wait is not None):
            progress, row_end, grid = wait
            ready = self._wait_stage_a(progress, ready, row_end, kt, grid)
            self._stamp_a_wait(trace, kt, kb)
        return ready

    @cute.jit
    def _patch_descriptors_a16(self, mainloop, ws, cta, desc_set, group, m, n, k) -> None:
        """Patch set `desc_set` for `group` (m, n, k): its weights, its staged fp16 A and its
        weight scales."""
        ptrs = cta.ptrs
        row_bytes = k // 2
        scale_k = k // 64
        a16_ptr = cute.make_ptr(Float16, mainloop.a16_base + self._a16_offset(cta, group),
                                cute.AddressSpace.gmem, assumed_align=16)
        tensors = (
            self._bytes_tensor(ptrs[group, tables.PTR_B], (n, row_bytes), (row_bytes, 1)),
            cute.make_tensor(a16_ptr, cute.make_layout((m, k), stride=(k, 1))),
            self._scale_tensor(ptrs[group, tables.PTR_SFB], n, scale_k),
        )
        self._install_descriptors(mainloop.atoms, tensors, ws, cta.bidx, desc_set)
