"""v2 of the sm_90a kernel (Config.a_fp16 false): no staging phase; one TMA stage carries
packed weights and packed A, and the consumer warpgroups convert their A rows per 64-K step into
swizzled shared memory (a named barrier per step) as well as the weights. A mixin of
Sm90GroupedGemm (kernels/sm90/grouped_gemm.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, Int64, Uint32
from cutlass.cute.nvgpu import warpgroup

from kernels import tables

from . import tma
from .config import FP16_BUFFERS, K_TILE, SCALE_STAGE_BYTES, SUB_K
from .dequant import dequant_chunk, dequant_word_w, scales_w
from .fp4_bits import permuted_chunk
from .ptx import ld_shared_u16, ld_shared_v2, ld_shared_v4, prmt, st_shared_v2, st_shared_v4
from .smem_layout import scale_word_offset
from .structure import OP_A, OP_B, OP_SFA, OP_SFB, PACKED_ROW_BYTES, SCALE_BOX, SUB_STEPS


class PerTileA:
    """v2: the consumers convert A per tile as well as the weights."""

    @cute.jit
    def _kernel_v2(self, atoms, storage, tables_, workspace, tidx, warp_idx) -> None:
        """One TMA pipeline for packed A and B and both scales; warp 0 produces, the consumer
        warpgroups convert both operands. `atoms`: the B, A, weight-scale and A-scale TMA
        templates; `tables_`: _context's arguments."""
        mainloop = self._tma_pipeline(
            storage.mbar, self.stages,
            (self.tile_n + self.tile_m) * PACKED_ROW_BYTES + 2 * SCALE_STAGE_BYTES)

        cta = self._context(*tables_)

        # All 384 threads fit in the register file at the compiled count (ptxas reports 168),
        # so no setmaxnreg rebalancing: it is only safe when ptxas can honour the lower limit
        # in the producer path, which patches descriptors with 64-bit values.
        if warp_idx == 0:
            self._producer(atoms, storage, mainloop, cta, workspace)
        if warp_idx >= 4:
            self._consumer(self._tiled_mma(), self._fp16_a_layout(), storage, mainloop, cta,
                           tidx - 128)

    @cute.jit
    def _producer(self, atoms, storage, mainloop, cta, workspace) -> None:
        """Warp 0: for each tile, patch the descriptors on a group change and load its K
        stages (both operands' packed rows and scales) into `mainloop`."""
        sizes, prefix = cta.sizes, cta.prefix
        total_tiles, bidx, grid = cta.total_tiles, cta.bidx, cta.grid
        ws = cute.make_ptr(Int64, workspace.toint(), cute.AddressSpace.gmem, assumed_align=128)
        self._copy_templates(atoms, ws, bidx)

        packed_b = storage.packed_b.data_ptr()
        packed_a = storage.packed_a.data_ptr()
        scale_b = storage.scale_b.data_ptr()
        scale_a = storage.scale_a.data_ptr()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        group = Int32(0)
        prev_group = Int32(-1)
        desc_set = Int32(self.desc_sets - 1)  # the first group patches set 0
        tile = bidx
        while tile < total_tiles:
            group, m, n, k = self._group_of(tile, group, prefix, sizes)
            if group != prev_group:
                desc_set = self._next_set(desc_set)
                self._patch_descriptors(atoms, ws, cta, desc_set, group, m, n, k)
                prev_group = group
            tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
            d_b = self._desc(ws, bidx, desc_set, OP_B)
            d_a = self._desc(ws, bidx, desc_set, OP_A)
            d_sfb = self._desc(ws, bidx, desc_set, OP_SFB)
            d_sfa = self._desc(ws, bidx, desc_set, OP_SFA)
            row_a = tile_m_idx * self.tile_m
            row_b = tile_n_idx * self.tile_n
            for kt in cutlass.range(k // K_TILE, unroll=1):
                mainloop.producer_acquire(state)
                bar = mainloop.producer_get_barrier(state)
                stage = state.index
                col = kt * PACKED_ROW_BYTES
                tma.tma_load(d_b, packed_b + stage * (self.tile_n * PACKED_ROW_BYTES), bar,
                             (col, row_b))
                tma.tma_load(d_a, packed_a + stage * (self.tile_m * PACKED_ROW_BYTES), bar,
                             (col, row_a))
                tma.tma_load(d_sfb, scale_b + stage * SCALE_STAGE_BYTES, bar,
                             (0, kt * SCALE_BOX[1], row_b // 128))
                tma.tma_load(d_sfa, scale_a + stage * SCALE_STAGE_BYTES, bar,
                             (0, kt * SCALE_BOX[1], row_a // 128))
                mainloop.producer_commit(state)
                state.advance()
            tile += grid
        mainloop.producer_tail(state)

    @cute.jit
    def _patch_descriptors(self, atoms, ws, cta, desc_set, group, m, n, k) -> None:
        """Point this CTA's descriptor set at group `group` (whole warp; one lane writes)."""
        ptrs = cta.ptrs
        row_bytes = k // 2
        scale_k = k // 64  # 512-byte atoms per 128-row block
        tensors = (
            self._bytes_tensor(ptrs[group, tables.PTR_B], (n, row_bytes), (row_bytes, 1)),
            self._bytes_tensor(ptrs[group, tables.PTR_A], (m, row_bytes), (row_bytes, 1)),
            self._scale_tensor(ptrs[group, tables.PTR_SFB], n, scale_k),
            self._scale_tensor(ptrs[group, tables.PTR_SFA], m, scale_k),
        )
        self._install_descriptors(atoms, tensors, ws, cta.bidx, desc_set)

    @cute.jit
    def _consumer(self, tiled_mma, fa_layout, storage, mainloop, cta, ct) -> None:
        sizes, ptrs, prefix = cta.sizes, cta.ptrs, cta.prefix
        total_tiles, bidx, grid = cta.total_tiles, cta.bidx, cta.grid
        fp16_a = storage.fp16_a.get_tensor(fa_layout.outer, swizzle=fa_layout.inner)
        frag_a, frag_w, words_w, acc, coords, num_kblocks = self._mma_fragments(tiled_mma,
                                                                                fp16_a, ct)
        step_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.consumer_threads)

        packed_b = storage.packed_b.data_ptr().toint()
        packed_a = storage.packed_a.data_ptr().toint()
        scale_b = storage.scale_b.data_ptr().toint()
        scale_a = storage.scale_a.data_ptr().toint()
        f16_a = storage.fp16_a.data_ptr().toint()
        fa_stride = self.tile_m * SUB_K * 2  # bytes per fp16 buffer

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        step = Int32(0)
        group = Int32(0)
        tile = bidx
        while tile < total_tiles:
            group, m, n, k = self._group_of(tile, group, prefix, sizes)
            tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
            a_row0_in_block = (tile_m_idx * self.tile_m) % 128
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            for kt in cutlass.range(k // K_TILE, unroll=1):  # noqa: B007 - the DSL loop counts K tiles; the body uses its state
                mainloop.consumer_wait(state)
                stage = state.index
                for s in cutlass.range_constexpr(SUB_STEPS):
                    buf = step % FP16_BUFFERS
                    # Three buffers: the buffer written now was last read by the wgmma of step
                    # `step - 3`, which every consumer warpgroup retired (wait_group(1) at the end
                    # of step - 2) before arriving at the barrier of step - 1.
                    self._dequant_b_fragment(
                        words_w[s % 2], ct, s,
                        packed_b + stage * (self.tile_n * PACKED_ROW_BYTES),
                        scale_b + stage * SCALE_STAGE_BYTES)
                    self._dequant_rows(
                        self.tile_m, ct, s,
                        packed_a + stage * (self.tile_m * PACKED_ROW_BYTES),
                        scale_a + stage * SCALE_STAGE_BYTES, a_row0_in_block,
                        f16_a + buf * fa_stride)
                    if s == SUB_STEPS - 1:
                        mainloop.consumer_release(state)
                    # Generic-proxy stores must be visible to the async proxy (wgmma) ...
                    cute.arch.fence_proxy("async.shared", space="cta")
                    # ... and every consumer's rows written before either warpgroup reads them.
                    step_barrier.arrive_and_wait()
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(num_kblocks):
                        cute.gemm(tiled_mma, acc, frag_w[s % 2][None, None, kb],
                                  frag_a[None, None, kb, buf], acc)
                    warpgroup.commit_group()
                    warpgroup.wait_group(1)
                    step += 1
                state.advance()
            warpgroup.wait_group(0)
            self._store_tile(acc, coords, ptrs[group, tables.PTR_C], m, n,
                             tile_m_idx * self.tile_m, tile_n_idx * self.tile_n,
                             self._c_scale(cta, group))
            tile += grid

    @cute.jit
    def _dequant_rows(self, rows: int, ct: Int32, s: int, packed: Int32, scales: Int32,
                      scale_row0: Int32, dst: Int32) -> None:
        """Dequantize sub-step `s` (64 K) of `rows` packed rows into an fp16 wgmma tile.

        Thread `ct` of 256 takes `rows / 32` consecutive words (8 e2m1 each) of one row. Packed
        and fp16 tiles are both 128B-swizzled: 16-byte chunk c of row r sits at c ^ (r % 8).
        """
        words = rows // 32  # 4 (16 bytes) for 128 rows, 2 (8 bytes) for 64 rows
        per_row = 8 // words  # threads sharing one row's 64 K
        r = ct // per_row
        part = ct % per_row
        first_word = part * words  # in 0..7: 8 words = 32 bytes = 64 K per row per sub-step
        chunk = 2 * s + first_word // 4
        src = packed + r * PACKED_ROW_BYTES + ((chunk ^ (r % 8)) * 16) + (first_word % 4) * 4
        sr = scale_row0 + r
        scale_at = scale_word_offset(sr, s, 1, base=scales) + first_word // 2
        if cutlass.const_expr(words == 4):
            w = ld_shared_v4(src)
            outs = dequant_chunk(w, ld_shared_u16(scale_at))
        else:
            w = ld_shared_v2(src)
            # One scale for both words; it may be the high byte of its aligned 16-bit pair,
            # so it is splatted into both halves and half 0 is used.
            odd = (first_word // 2) % 2
            both = scales_w(ld_shared_u16(scale_at - odd))
            one = prmt(both, 0, Uint32(0x1010) + Uint32(odd) * Uint32(0x2222))
            outs = [dequant_word_w(w[i], one, 0) for i in range(words)]
        # K order of the register B operand (see _dequant_b_fragment): output pair q of word j
        # (0..7) belongs at K 32 (j // 4) + 8 q + 2 (j % 4), i.e. 16-byte chunk 4 (j // 4) + q
        # at byte 4 (j % 4): this thread's words fill one slice of 4 chunks.
        for q in cutlass.range_constexpr(4):
            chunk, byte = permuted_chunk(first_word, q)
            dst_at = dst + r * (SUB_K * 2) + ((chunk ^ (r % 8)) * 16) + byte
            if cutlass.const_expr(words == 4):
                st_shared_v4(dst_at, outs[0][q], outs[1][q], outs[2][q], outs[3][q])
            else:
                st_shared_v2(dst_at, outs[0][q], outs[1][q])
