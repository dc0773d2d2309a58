"""v3's consumers (the consumer warpgroups; a mixin of Sm90GroupedGemm): per tile, each 64-K
step converts the weights into a register fragment (weights.py) and issues RS wgmma on the A
ring's slot, one step in flight; the accumulator then goes to the storers (epilogue.py)."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, Uint32
from cutlass.cute.nvgpu import warpgroup

from .config import SUB_K
from .context import MmaOperands
from .structure import PACKED_ROW_BYTES, SUB_STEPS


class _Slot:
    """A pipeline position by buffer index alone: consumer_release reads only `.index`, and a
    lagged release must not copy the live PipelineState inside dynamic control flow."""

    def __init__(self, index: Any) -> None:
        self.index = index


class TileConsumer:
    """v3's consumer warpgroups: the K loop of each tile, then the hand-over."""

    def _mma_fragments(self, tiled_mma, a_smem, ct) -> tuple:
        """One consumer thread's wgmma operands: the fragments of the shared fp16 A tiles
        `a_smem`, two weight register fragments (a step writes one while the previous step's
        wgmma may still read the other; wait_group(1) retires the one before that) and their
        32-bit words, the accumulator, its coordinates and the k-blocks per step."""
        thr_mma = tiled_mma.get_slice(ct)
        frag_a = tiled_mma.make_fragment_B(thr_mma.partition_B(a_smem))
        frag_w = [tiled_mma.make_fragment_A(thr_mma.partition_shape_A((self.tile_n, SUB_K)))
                  for _ in range(2)]
        words_w = [cute.recast_tensor(f, Uint32) for f in frag_w]
        acc = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((self.tile_n, self.tile_m)), Float32)
        coords = thr_mma.partition_C(cute.make_identity_tensor((self.tile_n, self.tile_m)))
        return frag_a, frag_w, words_w, acc, coords, cute.size(frag_w[0], mode=[2])

    def _consumer_operands(self, tiled_mma, mainloop, ct) -> MmaOperands:
        """A consumer thread's view of the tile: the A ring's wgmma fragments, two weight
        fragments (and their words), the accumulator, its coordinates, k-blocks per step, the
        weight stages' shared addresses and the two pipelines (context.MmaOperands)."""
        storage = mainloop.storage
        a16_layout = self._a16_layout()
        a16 = storage.a16.get_tensor(a16_layout.outer, swizzle=a16_layout.inner)
        frag_a, frag_w, words_w, acc, coords, num_kblocks = self._mma_fragments(tiled_mma,
                                                                                a16, ct)
        packed_b = storage.packed_b.data_ptr().toint()
        scale_b = storage.scale_b.data_ptr().toint()
        return MmaOperands(tiled_mma=tiled_mma, frag_a=frag_a, frag_w=frag_w, words_w=words_w,
                           acc=acc, coords=coords, num_kblocks=num_kblocks, packed_b=packed_b,
                           scale_b=scale_b, b_pipe=mainloop.b_pipe, a_pipe=mainloop.a_pipe)

    @cute.jit
    def _consumer_a16(self, mainloop, cta, ct) -> None:
        """Consumer warpgroups (`ct` 0.. over their threads): each of this CTA's tiles through
        the K loop, then handed over to the storers (_hand_over_tile)."""
        step, end = cta.tile_step, cta.tile_end
        mma = self._consumer_operands(self._tiled_mma(), mainloop, ct)

        b_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        a_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                               self.config.a_slots)
        prev_slot = Int32(0)
        group = Int32(0)
        tile = cta.first_tile
        # The storers write C, so a tile's k and scale row are all the consumers need: they
        # walk the group table for their first tile only, and each hand-over brings the next
        # tile's from the storers (_store_tiles).
        k = Int32(0)
        scale_row0 = Int32(0)
        if tile < end:
            group, k, scale_row0 = self._consumer_tile(
                tile, self._first_group(mainloop.storage, cta), cta.prefix, cta.sizes)
        while tile < end:
            b_state, a_state, prev_slot, trace = self._tile_k_loop(
                mma, cta, b_state, a_state, prev_slot, tile, k, scale_row0, ct)
            k, scale_row0 = self._hand_over_tile(mma.acc, mma.coords, mainloop.storage, trace)
            tile += step

    @cute.jit
    def _tile_k_loop(self, mma, cta, b_state, a_state, prev_slot, tile, k, scale_row0,
                     ct) -> tuple:
        """A data-parallel consumer's whole tile (_k_loop over its k), with a trace's tile
        start and K-loop end stamped; returns _k_loop's results and the tile's trace handle."""
        trace = self._tile_trace(tile, cta, ct)
        self._stamp_tile(trace, 0)
        b_state, a_state, prev_slot = self._k_loop(mma, b_state, a_state, prev_slot, 0,
                                                   self._k_stages(k), scale_row0, ct, trace)
        self._stamp_tile(trace, 1)
        return b_state, a_state, prev_slot, trace

    @cute.jit
    def _consumer_tile(self, tile, group, prefix, sizes) -> tuple:
        """A consumer's view of `tile`: its group, k, and its first weight row within its
        128-row scale block (0 unless tile_n 192)."""
        group, m, _, k = self._group_of(tile, group, prefix, sizes)
        _, tile_n_idx = self._tile_coords(tile, group, prefix, m)
        return group, k, (tile_n_idx * self.tile_n) % 128

    @cute.jit
    def _k_loop(self, mma, b_state, a_state, prev_slot, kb, ke, scale_row0, ct,
                trace=None) -> tuple:
        """Weight stages kb..ke-1 of one tile into acc, zeroed first: each 64-K step
        dequantizes the weights into a register fragment and issues its wgmma on the A ring's
        slot, one step in flight. Returns the advanced pipeline states and the last A slot,
        already released (the caller rebinds them, as _produce_b's)."""
        packed_b, scale_b, words_w = mma.packed_b, mma.scale_b, mma.words_w
        b_pipe, a_pipe = mma.b_pipe, mma.a_pipe
        mma.acc.fill(0.0)
        mma.tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        for kt in cutlass.range(kb, ke, unroll=1):
            b_pipe.consumer_wait(b_state)
            stage = b_state.index
            stage_b = packed_b + stage * (self.tile_n * PACKED_ROW_BYTES)
            stage_s = scale_b + stage * self.sfb_stage_bytes
            if cutlass.const_expr(self.config.w_prefetch):
                loaded = self._load_b_step(ct, 0, stage_b, stage_s, scale_row0)
            for s in cutlass.range_constexpr(SUB_STEPS):
                self._stamp_step(trace, kt, s, 0)
                if cutlass.const_expr(self.config.w_prefetch):
                    self._convert_b_step(words_w[s % 2], loaded)
                    if cutlass.const_expr(s + 1 < SUB_STEPS):
                        # The next step's shared-memory words, issued before this step's
                        # waits and wgmma so their latency is off the next step's chain.
                        loaded = self._load_b_step(ct, s + 1, stage_b, stage_s, scale_row0)
                else:
                    self._dequant_b_fragment(words_w[s % 2], ct, s, stage_b, stage_s,
                                             scale_row0)
                if s == SUB_STEPS - 1:
                    # The stage was read with ld.shared (the generic proxy) and its refill is
                    # a TMA write (the async proxy), so a proxy fence orders the two. Without
                    # it the arrive did not wait for this step's loads, and in about 1 call in
                    # 40 of an inline_a kernel the refill landed before some of them read
                    # (docs/lab_notebook.md, twenty-second session).
                    cute.arch.fence_view_async_shared()
                    b_pipe.consumer_release(b_state)
                a_pipe.consumer_wait(a_state)
                self._stamp_step(trace, kt, s, 1)
                slot = a_state.index
                warpgroup.fence()
                self._step_mma(mma, s, slot)
                warpgroup.commit_group()
                self._stamp_step(trace, kt, s, 2)
                warpgroup.wait_group(1)
                self._stamp_step(trace, kt, s, 3)
                # The previous step's wgmma has retired: its A slot may be refilled. (The
                # first step of a piece has none: the previous piece's end released it.)
                if cutlass.const_expr(s > 0):
                    a_pipe.consumer_release(_Slot(prev_slot))
                else:
                    if kt > kb:
                        a_pipe.consumer_release(_Slot(prev_slot))
                prev_slot = slot
                a_state.advance()
            b_state.advance()
        warpgroup.wait_group(0)
        a_pipe.consumer_release(_Slot(prev_slot))
        return b_state, a_state, prev_slot

    @cute.jit
    def _step_mma(self, mma, s: cutlass.Constexpr, slot) -> None:
        """Issue one 64-K step's wgmmas: the weights converted into frag_w[s % 2] times the A
        ring's `slot`, into the accumulator (the caller fences and commits)."""
        for kblk in cutlass.range_constexpr(mma.num_kblocks):
            cute.gemm(mma.tiled_mma, mma.acc, mma.frag_w[s % 2][None, None, kblk],
                      mma.frag_a[None, None, kblk, slot], mma.acc)
