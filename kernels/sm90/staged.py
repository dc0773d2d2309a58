"""v3 of the sm_90a kernel (Config.a_fp16): A is converted to fp16 once per call by every CTA
(phase 1), a grid barrier follows, and the persistent tile loop TMA-loads fp16 A tiles into a
ring the wgmma reads while the consumers convert only the weights (kernels/sm90/weights.py).
A mixin of Sm90GroupedGemm (kernels/sm90/grouped_gemm.py), whose module docstring has the whole
data path."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float16, Float32, Int32, Int64, Uint32
from cutlass.cute.nvgpu import warpgroup

from kernels import tables

from . import tma
from .config import C_ROW_PAD, K_TILE, LANE_GROUPS, SUB_K, register_split_fits
from .dequant import dequant_chunk
from .fp4_bits import permuted_chunk
from .ptx import (atom_add_acq_rel_gpu_u32, fence_proxy_async_global, ld_acquire_gpu_u32,
                  ld_global_nc_u16, ld_global_nc_v4, ld_relaxed_gpu_u32, ld_shared_v4, nanosleep,
                  prefetch_tensormap, red_add_release_gpu_u32, select_bits, st_global_v4,
                  st_relaxed_gpu_u32)
from .staging import (A_CHUNK_K, EPOCH_OFFSET, PAIR_SEND, PAIR_STORES, chunk_addresses,
                      pair_store_offset)
from .structure import OP_A, OP_B, OP_SFB, PACKED_ROW_BYTES, SCALE_BOX, SUB_STEPS, WARPGROUP

# Registers per thread where the consumers need more than an even split of the register file:
# the producer warpgroup gives up all but the first number, the consumers take the second.
# Three consumer warpgroups (512 threads, 128 each at launch): 128 * 56 + 384 * 152 = 65536.
# Two at tile_m 256 (a 128-register accumulator; 384 threads, 168 each at launch):
# 128 * 56 + 256 * 224 = 64512.
REGISTER_SPLITS = {3: (56, 152), 2: (56, 224)}
# With stream_a the producer warpgroup's warps 1..3 also stage A, and 56 registers are too few
# for them (ptxas spills); three consumer warpgroups still fit at 144: 128 * 64 + 384 * 144.
STREAM_A_SPLIT = (64, 144)
for _wgs, (_producer, _consumer) in (*REGISTER_SPLITS.items(), (3, STREAM_A_SPLIT)):
    assert register_split_fits(_wgs, _producer, _consumer), (_wgs, _producer, _consumer)
# The grid barrier: an arrival counter, then the generation word on its own 64-byte line, at
# the kernel's grid_barrier parameter. The runtime zeroes it once and every launch leaves the
# counter at zero. The workspace keeps HEADER_BYTES unused at its start: they are the eager
# launches' barrier (runtime/device.py).
HEADER_BYTES = 128
BARRIER_GENERATION = 64
STAGE_UNROLL = 4  # staging chunks whose loads one thread has in flight at once
# async_epilogue: warps 1..3 store the tiles the consumers leave in shared memory. Named barriers
# between the two sides (0 is the CTA's, 1 v2's step barrier; 2 was stream-K's): the C
# tile is free to write, and it is full.
STORERS = 3 * 32
_C_FREE, _C_FULL = 3, 4


class _Slot:
    """A pipeline position by buffer index alone: consumer_release reads only `.index`, and a
    lagged release must not copy the live PipelineState inside dynamic control flow."""

    def __init__(self, index: Any) -> None:
        self.index = index


class StagedA:
    """v3: A staged to fp16 once per call, then the tile loop."""

    @cute.jit
    def _kernel_a16(self, tma_b, tma_a16, tma_sfb, storage, problem_sizes, pointers,
                    cta_prefix, alpha_table, workspace, grid_barrier, num_groups, tidx, warp_idx,
                    bidx, grid) -> None:
        """Phase 1: every thread of every CTA converts a share of all groups' A to fp16 in the
        workspace; grid barrier. Phase 2: the persistent tile loop, with TMA loading fp16 A
        tiles into a ring the wgmma reads directly, and only the weights converted per tile.
        With stream_a the two overlap (_roles_streamed, streamed.py)."""
        b_pipe = self._tma_pipeline(storage.mbar, self.stages,
                                    self.tile_n * PACKED_ROW_BYTES + self.sfb_stage_bytes)
        a_pipe = self._tma_pipeline(storage.mbar_a, self.config.a_slots,
                                    self.tile_m * SUB_K * 2)
        cta = self._context(problem_sizes, pointers, cta_prefix, alpha_table, num_groups, bidx,
                            grid)
        ws_base = workspace.toint()
        a16_base = self._past_descriptors(ws_base, grid)
        if cutlass.const_expr(self.config.trace):
            a16_base = self._start_trace(workspace, a16_base, tidx, bidx, grid)
        desc_base = ws_base + self.header_bytes
        if cutlass.const_expr(self.config.stream_a):
            self._roles_streamed(tma_b, tma_a16, tma_sfb, storage, b_pipe, a_pipe, cta, desc_base,
                                 a16_base, grid_barrier.toint(), num_groups, tidx, warp_idx)
        else:
            self._roles_barrier(tma_b, tma_a16, tma_sfb, storage, b_pipe, a_pipe, cta, desc_base,
                                a16_base, grid_barrier, num_groups, tidx, warp_idx)

    def _past_descriptors(self, ws_base, grid) -> Int64:
        """Workspace address past the zeroed header and every CTA's descriptor sets, where the
        trace records (Config.trace) and then the fp16 A begin (runtime/plan.py)."""
        return ws_base + self.header_bytes + grid * (self.desc_sets * tma.MAPS_PER_SET
                                                     * tma.TENSORMAP_BYTES)

    @cute.jit
    def _roles_streamed(self, tma_b, tma_a16, tma_sfb, storage, b_pipe, a_pipe, cta, desc_base,
                        a16_base, header, num_groups, tidx, warp_idx) -> None:
        """stream_a (streamed.py): no phase of its own. Warp 0 produces, warps 1..3 stage A and
        then store C tiles, the consumers start at once."""
        sizes, ptrs, prefix = cta.sizes, cta.ptrs, cta.prefix
        total_tiles, bidx, grid = cta.total_tiles, cta.bidx, cta.grid
        # The launch's epoch (streamed.py), read before the CTA barrier: so every read of it in
        # this CTA happens before the stagers' first count, and CTA 0, which advances it only
        # after every count (acquiring them), cannot make a CTA of this launch see the next
        # launch's. That order comes from the barrier and the counts' release, so the read
        # itself is relaxed: an acquire load made every thread wait for it (CCTL.IVALL) before
        # the barrier (no measurable change on the H200 either way, bench/RESULTS.md, eleventh
        # session).
        epoch = ld_relaxed_gpu_u32(header + EPOCH_OFFSET)
        lane_tables = self._stager_tables(sizes, ptrs, num_groups, tidx % 32)
        cute.arch.barrier()  # and the pipelines' mbarriers are initialized before any role waits
        split = self._register_split()
        if warp_idx < 4:
            if cutlass.const_expr(split is not None):
                cute.arch.warpgroup_reg_dealloc(split[0])
            if warp_idx == 0:
                self._producer_streamed(tma_b, tma_a16, tma_sfb, storage, b_pipe, a_pipe, sizes,
                                        ptrs, prefix, desc_base, a16_base, header, epoch,
                                        total_tiles, bidx, grid, num_groups, tidx)
            else:
                self._stage_streamed(lane_tables, num_groups, a16_base,
                                     self._progress_bank(header, epoch), tidx - 32, bidx, grid)
                self._store_tiles(storage, cta, tidx - 32)
        else:
            if cutlass.const_expr(split is not None):
                cute.arch.warpgroup_reg_alloc(split[1])
            self._consumer_a16(self._tiled_mma(), storage, b_pipe, a_pipe, sizes, ptrs, prefix,
                               total_tiles, bidx, grid, tidx - WARPGROUP)

    @cute.jit
    def _roles_barrier(self, tma_b, tma_a16, tma_sfb, storage, b_pipe, a_pipe, cta, desc_base,
                       a16_base, grid_barrier, num_groups, tidx, warp_idx) -> None:
        """Phase 1 (all warps but warp 0 stage A), the grid barrier, then the roles."""
        sizes, ptrs, prefix = cta.sizes, cta.ptrs, cta.prefix
        total_tiles, bidx, grid = cta.total_tiles, cta.bidx, cta.grid
        # The grid barrier's generation before this CTA arrives, read now so that its round
        # trip overlaps the staging: it cannot move before every CTA, this one included, has
        # arrived.
        seen = Uint32(0)
        if tidx == 32:
            seen = ld_acquire_gpu_u32(grid_barrier.toint() + BARRIER_GENERATION)
        if warp_idx == 0:
            self._producer_prologue(tma_b, tma_a16, tma_sfb, storage, b_pipe, sizes, ptrs,
                                    prefix, desc_base, a16_base, total_tiles, bidx)
        else:
            self._stage_a(sizes, ptrs, num_groups, a16_base, tidx - 32, bidx, grid)
        cute.arch.barrier()
        if tidx == 32:
            self._grid_barrier(grid_barrier.toint(), grid, seen)
        cute.arch.barrier()
        # The fp16 A just written (generic proxy, other CTAs) is read by TMA (async proxy).
        fence_proxy_async_global()

        # Each role is called from two places below: its arguments, written once.
        producer_args = (tma_b, tma_a16, tma_sfb, storage, b_pipe, a_pipe, sizes, ptrs, prefix,
                         desc_base, a16_base, total_tiles, bidx, grid)
        consumer_args = (storage, b_pipe, a_pipe, sizes, ptrs, prefix, total_tiles, bidx, grid)
        split = self._register_split()
        if cutlass.const_expr(split is not None):
            # The launch splits the register file evenly; the consumers need more. setmaxnreg is
            # per warpgroup (all of warpgroup 0 gives registers up, not just warp 0), and ptxas
            # honours it only when each role's code is reachable from its own setmaxnreg alone.
            if warp_idx < 4:
                cute.arch.warpgroup_reg_dealloc(split[0])
                if warp_idx == 0:
                    self._producer_a16(*producer_args)
                if warp_idx >= 1:
                    self._store_tiles(storage, cta, tidx - 32)
            else:
                cute.arch.warpgroup_reg_alloc(split[1])
                self._consumer_a16(self._tiled_mma(), *consumer_args, tidx - WARPGROUP)
        else:
            if warp_idx == 0:
                self._producer_a16(*producer_args)
            if warp_idx >= 1:
                if warp_idx < 4:
                    self._store_tiles(storage, cta, tidx - 32)
            if warp_idx >= 4:
                self._consumer_a16(self._tiled_mma(), *consumer_args, tidx - WARPGROUP)

    def _register_split(self) -> tuple[int, int] | None:
        """(producer, consumer) registers per thread after setmaxnreg (REGISTER_SPLITS), or None
        to keep the launch's even split: two consumer warpgroups need more only at tile_m 256."""
        warpgroups = self.consumer_threads // WARPGROUP
        if warpgroups == 3 or (warpgroups == 2 and self.tile_m == 256):
            if warpgroups == 3 and self.config.stream_a:
                return STREAM_A_SPLIT
            return REGISTER_SPLITS[warpgroups]
        return None

    @cute.jit
    def _stage_a(self, sizes, ptrs, num_groups, a16_base, tidx, bidx, grid) -> None:
        """Convert every group's A to fp16 at a16_base (groups back to back, rows of k), by
        every thread but warp 0's (`tidx` counts from the first staging thread). Each
        thread takes 32-K chunks (16 packed bytes, two scales) in a grid-stride loop and writes
        them in the kernel's permuted K order (fp4_bits.permuted_chunk), so a TMA tile of 64 K
        lands in shared memory exactly as the v2 kernel's own fp16 stores would place it.
        The chunks of all groups form one index space (group after group, rows in order, K
        chunks fastest), so a thread's chunks are spread over the whole call rather than
        handled group by group: STAGE_UNROLL chunks per iteration issue their loads before any
        conversion, and the phase is one memory round trip per thread for calls of up to
        STAGE_UNROLL * grid * threads chunks, whatever the number of groups.
        Up to LANE_GROUPS groups, lane g of each warp reads group g's row of the tables and a
        thread finds its chunks' groups by shuffles, so the phase waits on one table read
        instead of a chain of them; more groups walk the tables (_stage_chunks)."""
        if num_groups <= LANE_GROUPS:
            self._stage_chunks(sizes, ptrs, num_groups, a16_base, tidx, bidx, grid, True)
        else:
            self._stage_chunks(sizes, ptrs, num_groups, a16_base, tidx, bidx, grid, False)

    @cute.jit
    def _stage_chunks(self, sizes, ptrs, num_groups, a16_base, tidx, bidx, grid,
                      lanes: cutlass.Constexpr) -> None:
        """_stage_a's loop; `lanes`: the groups' table rows are held one per lane (at most
        LANE_GROUPS groups) rather than read by a cursor walking the groups."""
        stagers = self.threads - 32  # warp 0 runs _producer_prologue meanwhile
        stride = grid * stagers
        lane = tidx % 32
        total = Int32(0)
        if cutlass.const_expr(lanes):
            # Lane g holds group g (lanes past the last group read the last one, so every read
            # is valid, and count none of its chunks): its chunks [first_l, end_l), k, A and
            # scale pointers. The reads are issued together; a shuffle scan gives the ranges.
            own = cutlass.min(lane, num_groups - 1)
            k_l = sizes[own, tables.COL_K]
            a_l = ptrs[own, tables.PTR_A]
            sf_l = ptrs[own, tables.PTR_SFA]
            count_l = sizes[own, tables.COL_M] * (k_l // A_CHUNK_K)
            if lane >= num_groups:
                count_l = Int32(0)
            end_l, total = self._lane_scan(count_l, lane)
            first_l = end_l - count_l
            found = cute.make_rmem_tensor(STAGE_UNROLL, Int32)
        else:
            for g in cutlass.range(num_groups, unroll=1):
                total += sizes[g, tables.COL_M] * (sizes[g, tables.COL_K] // A_CHUNK_K)
            # Group cursor (a thread's chunk indices only grow): group `group` holds chunks
            # [first, first + count) and its fp16 A starts `offset` bytes into the staging area
            # (A_CHUNK_K fp16 = 64 bytes per chunk).
            group = Int32(-1)
            first = Int32(0)
            count = Int32(0)
            offset = Int64(0)
        c = bidx * stagers + tidx
        # Pair stores (staging.PAIR_STORES): the odd lane of a pair takes `odd` = all ones.
        odd = Uint32(0) - Uint32(tidx % 2)
        # Warp-uniform trip count (the shuffles need the whole warp); a lane past the end loads
        # a valid chunk and stores nothing, as in the last iteration.
        while c - lane < total:
            # Past the end: load the last chunk again (valid memory), store nothing.
            cus = [cutlass.min(c + u * stride, total - 1) for u in range(STAGE_UNROLL)]
            if cutlass.const_expr(lanes):
                self._lane_groups(found, end_l, num_groups, cus)  # each chunk's group
            dsts, words, scales = [], [], []
            for u in cutlass.range_constexpr(STAGE_UNROLL):
                cu = cus[u]
                if cutlass.const_expr(lanes):
                    g = found[u]
                    first_u = cute.arch.shuffle_sync(first_l, g)
                    a_u = cute.arch.shuffle_sync(a_l, g)
                    sf_u = cute.arch.shuffle_sync(sf_l, g)
                    src, sf, dst = chunk_addresses(
                        cu, first_u, cute.arch.shuffle_sync(k_l, g),
                        lambda: (a_u, sf_u, a16_base + Int64(first_u) * Int64(A_CHUNK_K * 2)),
                        Int64)
                else:
                    while cu >= first + count:  # groups of m = 0 have no chunks: skipped
                        first += count
                        offset += Int64(count) * Int64(A_CHUNK_K * 2)
                        group += 1
                        count = sizes[group, tables.COL_M] * (sizes[group, tables.COL_K]
                                                              // A_CHUNK_K)
                    src, sf, dst = chunk_addresses(
                        cu, first, sizes[group, tables.COL_K],
                        lambda: (ptrs[group, tables.PTR_A], ptrs[group, tables.PTR_SFA],
                                 a16_base + offset), Int64)
                words.append(ld_global_nc_v4(src))
                scales.append(ld_global_nc_u16(sf))
                dsts.append(dst)
            # Both lanes of a pair pass or fail the check together: total is even.
            self._store_chunks(words, scales, dsts, lambda u: c + u * stride < total, odd,
                               tidx)
            c += STAGE_UNROLL * stride
        fence_proxy_async_global()

    @cute.jit
    def _lane_scan(self, count, lane) -> tuple:
        """A warp's lanes each hold a count (lane g: group g's chunks or rows): returns this
        lane's inclusive prefix sum (where its group's range ends) and the warp's total, by a
        shuffle scan."""
        end = count
        for d in cutlass.range_constexpr(5):
            below = cute.arch.shuffle_sync_up(end, 1 << d)
            if lane >= (1 << d):
                end = end + below
        return end, cute.arch.shuffle_sync(end, 31)

    @cute.jit
    def _lane_groups(self, found, end_l, num_groups, keys) -> None:
        """found[u] = the group holding position keys[u], from each lane's range end end_l
        (_lane_scan): the number of groups that end at or before it, so groups of m = 0 are
        skipped. One shuffle per group for all keys; (end - 1 - key) >> 31 is -1 exactly when
        key >= end."""
        found.fill(0)
        for j in cutlass.range(num_groups - 1, unroll=1):
            end_j = cute.arch.shuffle_sync(end_l, j)
            for u in cutlass.range_constexpr(len(keys)):
                found[u] = found[u] - ((end_j - 1 - keys[u]) >> 31)

    @cute.jit
    def _store_chunks(self, words, scales, dsts, valid, odd, tidx) -> None:
        """Convert the loaded chunks (packed words and scale pairs, one per list entry) and write
        them to `dsts` with pair stores (staging.PAIR_STORES); `valid(u)` says whether chunk u is
        real (the same for both lanes of a pair). The whole warp takes part (shuffles)."""
        for u in cutlass.range_constexpr(len(words)):
            outs = dequant_chunk(words[u], scales[u])
            # vec["vN"]: the 16 bytes at offset 16 N of this chunk's output
            vec = {f"v{permuted_chunk(0, q)[0]}": [outs[w][q] for w in range(4)]
                   for q in range(4)}
            for r in cutlass.range_constexpr(2):
                even_sends, odd_sends = PAIR_SEND[0][r], PAIR_SEND[1][r]
                vec[f"r{r}"] = [cute.arch.shuffle_sync_bfly(
                    select_bits(vec[odd_sends][w], vec[even_sends][w], odd), 1)
                    for w in range(4)]
            if valid(u):
                for i in cutlass.range_constexpr(4):
                    even_v, odd_v = PAIR_STORES[0][i][1], PAIR_STORES[1][i][1]
                    st_global_v4(dsts[u] + Int64(pair_store_offset(i, tidx % 2)),
                                 *[select_bits(vec[odd_v][w], vec[even_v][w], odd)
                                   for w in range(4)])

    @cute.jit
    def _grid_barrier(self, barrier, grid, seen) -> None:
        """One thread per CTA: a self-resetting barrier over the whole (co-resident,
        cooperatively launched) grid, its counter at `barrier` zero on entry and on exit.
        `seen` is the generation word as this thread read it before arriving."""
        counter = barrier
        generation = barrier + BARRIER_GENERATION
        arrived = atom_add_acq_rel_gpu_u32(counter, 1)
        if arrived == Uint32(grid - 1):
            st_relaxed_gpu_u32(counter, 0)  # ready for the next launch before anyone leaves
            red_add_release_gpu_u32(generation, 1)
        else:
            now = ld_acquire_gpu_u32(generation)
            while now == seen:
                nanosleep(64)
                now = ld_acquire_gpu_u32(generation)

    @cute.jit
    def _a16_offset(self, sizes, group) -> Int64:
        """Byte offset of group `group`'s fp16 A in the staging area."""
        offset = Int64(0)
        for g in cutlass.range(group, unroll=1):
            offset += Int64(sizes[g, tables.COL_M]) * Int64(sizes[g, tables.COL_K] * 2)
        return offset

    @cute.jit
    def _first_tile_prefetch(self, sizes, prefix, total_tiles, bidx) -> tuple:
        """(group, weight stages) of this CTA's first tile that _producer_prologue loads before
        the grid barrier: the weights do not depend on phase 1. (-1, 0) without a tile."""
        group = Int32(-1)
        pre = Int32(0)
        if bidx < total_tiles:
            group, _, _, k = self._group_of(bidx, Int32(0), prefix, sizes)
            pre = cutlass.min(Int32(self.stages), k // K_TILE)
        return group, pre

    @cute.jit
    def _producer_prologue(self, tma_b, tma_a16, tma_sfb, storage, b_pipe, sizes, ptrs, prefix,
                           desc_base, a16_base, total_tiles, bidx) -> None:
        """Warp 0 during phase 1: the descriptor templates, set 0 patched for the first tile's
        group, and that tile's first weight stages in flight while the other warps stage A."""
        atoms = (tma_b, tma_a16, tma_sfb)
        ws = cute.make_ptr(Int64, desc_base, cute.AddressSpace.gmem, assumed_align=128)
        self._copy_templates(atoms, ws, bidx)
        lane0 = None
        if cutlass.const_expr(self.config.trace):
            lane0 = Int32(cute.arch.lane_idx() == 0)
            self._stamp_cta(1, lane0)
        group, pre = self._first_tile_prefetch(sizes, prefix, total_tiles, bidx)
        if pre > 0:
            _, m, n, k = self._group_of(bidx, group, prefix, sizes)
            self._patch_descriptors_a16(atoms, ws, bidx, Int32(0), ptrs, sizes, group, a16_base,
                                        m, n, k)
            if cutlass.const_expr(self.config.trace):
                self._stamp_cta(2, lane0)
            _, tile_n_idx = self._tile_coords(bidx, group, prefix, m)
            b_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                   self.stages)
            d_b = self._desc(ws, bidx, 0, OP_B)
            d_sfb = self._desc(ws, bidx, 0, OP_SFB)
            for kt in cutlass.range(0, 0 + pre, unroll=1):
                b_state = self._produce_b(b_pipe, b_state, d_b, d_sfb, storage, kt,
                                          tile_n_idx * self.tile_n)
                if cutlass.const_expr(self.config.trace):
                    self._stamp_cta(3, lane0 & Int32(kt == 0))

    @cute.jit
    def _produce_b(self, b_pipe, b_state, d_b, d_sfb, storage, kt, row_b, trace=None) -> Any:
        """One weight stage (packed rows and their scales) into the next b_pipe slot; returns
        the advanced state (the caller rebinds it: the DSL threads loop-carried state through
        plain local variables, not through attributes a helper changes)."""
        b_pipe.producer_acquire(b_state)
        if cutlass.const_expr(trace is not None):
            self._stamp_stage(trace, kt, 0)
        bar = b_pipe.producer_get_barrier(b_state)
        stage = b_state.index
        tma.tma_load(d_b, storage.packed_b.data_ptr() + stage * (self.tile_n * PACKED_ROW_BYTES),
                     bar, (kt * PACKED_ROW_BYTES, row_b))
        tma.tma_load(d_sfb, storage.scale_b.data_ptr() + stage * self.sfb_stage_bytes,
                     bar, (0, kt * SCALE_BOX[1], row_b // 128))
        b_pipe.producer_commit(b_state)
        if cutlass.const_expr(trace is not None):
            self._stamp_stage(trace, kt, 1)
        b_state.advance()
        return b_state

    @cute.jit
    def _produce_a(self, a_pipe, a_state, d_a, storage, kt, row_a, trace=None) -> Any:
        """The fp16 A tiles of one stage's K (SUB_STEPS slots of the A ring); returns the
        advanced state, as _produce_b."""
        a16 = storage.a16.data_ptr()
        for s in cutlass.range_constexpr(SUB_STEPS):
            a_pipe.producer_acquire(a_state)
            if cutlass.const_expr(trace is not None):
                self._stamp_stage(trace, kt, 2 + s)
            tma.tma_load(d_a, a16 + a_state.index * (self.tile_m * SUB_K),
                         a_pipe.producer_get_barrier(a_state), (kt * K_TILE + s * SUB_K, row_a))
            a_pipe.producer_commit(a_state)
            a_state.advance()
        return a_state

    @cute.jit
    def _producer_a16(self, tma_b, tma_a16, tma_sfb, storage, b_pipe, a_pipe, sizes, ptrs,
                      prefix, desc_base, a16_base, total_tiles, bidx, grid,
                      progress=None) -> None:
        """After the grid barrier; _producer_prologue has copied the templates and loaded the
        first tile's first `pre` weight stages with descriptor set 0. With stream_a there is no
        grid barrier: `progress` (streamed.py) lets each tile's A loads wait for their chunks."""
        atoms = (tma_b, tma_a16, tma_sfb)
        ws = cute.make_ptr(Int64, desc_base, cute.AddressSpace.gmem, assumed_align=128)
        b_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        a_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                               self.config.a_slots)
        prev_group, pre = self._first_tile_prefetch(sizes, prefix, total_tiles, bidx)
        for _ in cutlass.range(pre, unroll=1):
            b_state.advance()
        b_state, a_state = self._producer_tiles_ahead(
            atoms, ws, storage, b_pipe, a_pipe, b_state, a_state, sizes, ptrs, prefix,
            a16_base, total_tiles, bidx, grid, pre, prev_group,
            None if progress is None else (progress, sizes, grid))
        b_pipe.producer_tail(b_state)
        a_pipe.producer_tail(a_state)

    @cute.jit
    def _tile_loads(self, ws, bidx, desc_set, tile, group, prefix, m, streamed=None) -> tuple:
        """What a tile's loads need: the B, A and weight-scale descriptors of set `desc_set`,
        the tile's first A row and weight row, and with stream_a (`streamed` = (progress,
        sizes, grid)) the (progress, A row end, grid) wait for _stage_a_ready, else None."""
        tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
        d_b = self._desc(ws, bidx, desc_set, OP_B)
        d_a = self._desc(ws, bidx, desc_set, OP_A)
        d_sfb = self._desc(ws, bidx, desc_set, OP_SFB)
        row_a = tile_m_idx * self.tile_m
        row_b = tile_n_idx * self.tile_n
        wait = None
        if cutlass.const_expr(streamed is not None):
            progress, sizes, grid = streamed
            wait = (progress, self._row_end(sizes, group, row_a, m), grid)
        return d_b, d_a, d_sfb, row_a, row_b, wait

    @cute.jit
    def _producer_tiles_ahead(self, atoms, ws, storage, b_pipe, a_pipe, b_state, a_state, sizes,
                              ptrs, prefix, a16_base, total_tiles, bidx, grid, pre, prev_group,
                              streamed=None) -> tuple:
        """patch_ahead's tile loop. A tile's loads go in this order: its first A stage (and its
        second weight stage), then the look-ahead (the next tile's group, found by a table walk,
        patched into the next descriptor set), then each weight stage one stage before its A,
        with the next tile's first weight stage before this tile's last A. So a tile start
        waits neither for weights issued after the previous tile's last A slot came free nor
        for the producer's per-tile work (bench/RESULTS.md, tenth session). The first tile's
        first `pre` (>= 1) weight stages come from the prologue. Returns the pipeline states."""
        ready = Int32(0)
        desc_set = Int32(0)
        ahead_set = Int32(0)  # the newest patched set and the group it holds (the prologue's)
        ahead_group = prev_group
        group, m, k = Int32(0), Int32(0), Int32(0)
        if bidx < total_tiles:
            group, m, _, k = self._group_of(bidx, group, prefix, sizes)
        tile = bidx
        while tile < total_tiles:
            trace = None
            if cutlass.const_expr(self.config.trace):
                trace = self._trace_tile(tile, bidx, grid, cute.arch.thread_idx()[0] == 0)
            if group != prev_group:
                desc_set = ahead_set  # patched while the previous tile loaded
                prev_group = group
            stages = k // K_TILE
            d_b, d_a, d_sfb, row_a, row_b, wait = self._tile_loads(ws, bidx, desc_set, tile,
                                                                   group, prefix, m, streamed)
            # Stage 0: the second weight stage unless the prologue loaded it, then the A.
            second = cutlass.min(stages - 1, 1) - cutlass.min(cutlass.max(pre - 1, 0), 1)
            for _ in cutlass.range(second, unroll=1):
                b_state = self._produce_b(b_pipe, b_state, d_b, d_sfb, storage, 1, row_b, trace)
            ready = self._stage_a_ready(wait, ready, 0, 0, trace)
            a_state = self._produce_a(a_pipe, a_state, d_a, storage, 0, row_a, trace)
            # The look-ahead, now that the tile's first loads are out.
            next_group, nm, nk = group, m, k
            has_next = Int32(0)
            if tile + grid < total_tiles:
                has_next = Int32(1)
                next_group, nm, nn, nk = self._group_of(tile + grid, group, prefix, sizes)
                if next_group != ahead_group:
                    ahead_set = self._next_set(ahead_set)
                    self._patch_descriptors_a16(atoms, ws, bidx, ahead_set, ptrs, sizes,
                                                next_group, a16_base, nm, nn, nk)
                    for o in cutlass.range_constexpr(len(atoms)):
                        prefetch_tensormap(self._desc(ws, bidx, ahead_set, o).toint())
                    ahead_group = next_group
            _, next_tile_n = self._tile_coords(tile + grid, next_group, prefix, nm)
            # Stages 1..: A only while the next weight stage is the prologue's, then each
            # weight stage one ahead of its A, the next tile's first, and the last A.
            for kt in cutlass.range(1, pre - 1, unroll=1):
                ready = self._stage_a_ready(wait, ready, kt, 0, None)
                a_state = self._produce_a(a_pipe, a_state, d_a, storage, kt, row_a, trace)
            for kt in cutlass.range(cutlass.max(pre - 1, 1), stages - 1, unroll=1):
                b_state = self._produce_b(b_pipe, b_state, d_b, d_sfb, storage, kt + 1, row_b,
                                          trace)
                ready = self._stage_a_ready(wait, ready, kt, 0, None)
                a_state = self._produce_a(a_pipe, a_state, d_a, storage, kt, row_a, trace)
            for _ in cutlass.range(has_next, unroll=1):
                b_state = self._produce_b(b_pipe, b_state, self._desc(ws, bidx, ahead_set, OP_B),
                                          self._desc(ws, bidx, ahead_set, OP_SFB), storage, 0,
                                          next_tile_n * self.tile_n)
            for _ in cutlass.range(cutlass.min(stages - 1, 1), unroll=1):  # stages >= 2
                ready = self._stage_a_ready(wait, ready, stages - 1, 0, None)
                a_state = self._produce_a(a_pipe, a_state, d_a, storage, stages - 1, row_a,
                                          trace)
            group, m, k = next_group, nm, nk
            pre = Int32(1)  # the next tile's first weight stage is on its way
            tile += grid
        return b_state, a_state

    @cute.jit
    def _stage_a_ready(self, wait, ready, kt, kb, trace) -> Int32:
        """With stream_a (`wait` not None), wait until stage kt's A rows are staged (and in a
        trace, stamp the first tile's first such wait); returns `ready` updated."""
        if cutlass.const_expr(wait is not None):
            progress, row_end, grid = wait
            ready = self._wait_stage_a(progress, ready, row_end, kt, grid)
            if cutlass.const_expr(trace is not None):
                self._stamp_cta(4, trace[1] & Int32(trace[0] == 0) & Int32(kt == kb))
        return ready

    @cute.jit
    def _patch_descriptors_a16(self, atoms, ws, bidx, desc_set, ptrs, sizes, group, a16_base,
                               m, n, k) -> None:
        row_bytes = k // 2
        scale_k = k // 64
        a16_ptr = cute.make_ptr(Float16, a16_base + self._a16_offset(sizes, group),
                                cute.AddressSpace.gmem, assumed_align=16)
        tensors = (
            self._bytes_tensor(ptrs[group, tables.PTR_B], (n, row_bytes), (row_bytes, 1)),
            cute.make_tensor(a16_ptr, cute.make_layout((m, k), stride=(k, 1))),
            self._scale_tensor(ptrs[group, tables.PTR_SFB], n, scale_k),
        )
        self._install_descriptors(atoms, tensors, ws, bidx, desc_set)

    def _consumer_operands(self, tiled_mma, storage, ct) -> tuple:
        """A consumer thread's view of the tile: the A
        ring's wgmma fragments, two weight fragments (and their words), the accumulator, its
        coordinates, k-blocks per step, and the weight stages' shared addresses."""
        a16_layout = self._a16_layout()
        a16 = storage.a16.get_tensor(a16_layout.outer, swizzle=a16_layout.inner)
        thr_mma = tiled_mma.get_slice(ct)
        frag_a = tiled_mma.make_fragment_B(thr_mma.partition_B(a16))
        frag_w = [tiled_mma.make_fragment_A(thr_mma.partition_shape_A((self.tile_n, SUB_K)))
                  for _ in range(2)]
        words_w = [cute.recast_tensor(f, Uint32) for f in frag_w]
        acc = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((self.tile_n, self.tile_m)), Float32)
        coords = thr_mma.partition_C(cute.make_identity_tensor((self.tile_n, self.tile_m)))
        num_kblocks = cute.size(frag_w[0], mode=[2])
        packed_b = storage.packed_b.data_ptr().toint()
        scale_b = storage.scale_b.data_ptr().toint()
        return frag_a, frag_w, words_w, acc, coords, num_kblocks, packed_b, scale_b

    def _c_tile(self, storage) -> cute.Tensor:
        """async_epilogue's shared C tile: tile_m rows of tile_n fp16, each padded by C_ROW_PAD
        so that the consumers' 2-byte stores of 4 rows at once fall in different banks."""
        return storage.c_tile.get_tensor(cute.make_layout(
            (self.tile_m, self.tile_n), stride=(self.tile_n + C_ROW_PAD, 1)))

    def _c_barriers(self) -> tuple:
        """async_epilogue's two named barriers, consumers and storers together: the shared C
        tile is free to write, and it is full."""
        both = self.consumer_threads + STORERS
        return (pipeline.NamedBarrier(barrier_id=_C_FREE, num_threads=both),
                pipeline.NamedBarrier(barrier_id=_C_FULL, num_threads=both))

    @cute.jit
    def _hand_over_tile(self, acc, coords, storage, trace=None) -> tuple:
        """async_epilogue, consumers: wait until the storers have copied out the previous
        tile, write this one (times its C scale, rounded to out_dtype) into the shared C tile,
        and signal it full; the storers copy it out while the next tile's steps run. Returns
        the next tile's (k, first scale row). The storers posted both, and this tile's C scale,
        before the first barrier (_store_tiles): the consumers never load alpha themselves (a
        first-tile load of theirs cost dense_b 0.4 us, bench/RESULTS.md)."""
        c_free, c_full = self._c_barriers()
        c_tile = self._c_tile(storage)
        c_free.arrive_and_wait()
        if cutlass.const_expr(trace is not None):
            self._stamp_tile(trace[0], 2, trace[1])
        posted = self._next_tile_post(storage)
        next_k, next_row0 = posted[0], posted[1]
        scale = self._tile_scale_post(storage)[0]
        for i in cutlass.range_constexpr(cute.size(acc)):
            b_row, a_row = coords[i]
            c_tile[a_row, b_row] = self.c_dtype(acc[i] * scale)
        # A full barrier rather than an arrive: the storers are already waiting here, and
        # compute-sanitizer's racecheck orders shared memory only through full barriers.
        c_full.arrive_and_wait()
        if cutlass.const_expr(trace is not None):
            self._stamp_tile(trace[0], 3, trace[1])
        return next_k, next_row0

    def _next_tile_post(self, storage) -> cute.Tensor:
        """async_epilogue: the storers' post of the consumers' next tile, (k, first scale
        row)."""
        return storage.next_tile.get_tensor(cute.make_layout(2))

    def _tile_scale_post(self, storage) -> cute.Tensor:
        """async_epilogue: the storers' post of the C scale (_c_scale: the group's alpha) of
        the tile being handed over."""
        return storage.tile_scale.get_tensor(cute.make_layout(1))

    @cute.jit
    def _post_tile_scale(self, storage, cta, tile, group, st) -> Int32:
        """Storers: post `tile`'s C scale for its hand-over; returns `tile`'s group (tiles only
        increase, so the walk goes on from `group`)."""
        group, _, _, _ = self._group_of(tile, group, cta.prefix, cta.sizes)
        if st == 0:
            scale_post = self._tile_scale_post(storage)
            scale_post[0] = self._c_scale(cta, group)
        return group

    @cute.jit
    def _post_next_tile(self, storage, cta, tile, group, st) -> Int32:
        """Storers: post `tile`'s (k, first scale row) for the consumers (nothing past the last
        tile); returns the group walked to (tiles only increase)."""
        if tile < cta.total_tiles:
            group, k, row0 = self._consumer_tile(tile, group, cta.prefix, cta.sizes)
            if st == 0:
                posted = self._next_tile_post(storage)
                posted[0] = k
                posted[1] = row0
        return group

    @cute.jit
    def _store_tiles(self, storage, cta, st) -> None:
        """async_epilogue, warps 1..3 (`st` 0..95): for each of this CTA's tiles, wait until the
        consumers have filled the shared C tile, copy its rows inside (m, n) to C in 16-byte
        vectors, and hand the tile back (a full barrier, met by the consumers at their next
        tile's end)."""
        sizes, ptrs, prefix = cta.sizes, cta.ptrs, cta.prefix
        total_tiles, bidx, grid = cta.total_tiles, cta.bidx, cta.grid
        c_free, c_full = self._c_barriers()
        base = storage.c_tile.data_ptr().toint()
        row_bytes = (self.tile_n + C_ROW_PAD) * 2
        vecs = self.tile_n // 8  # 16-byte vectors per row; n is a multiple of 8 (N_MULTIPLE)
        # The consumers' look-ahead: the hand-over of tile t brings the (k, first scale row) of
        # their next tile, t + grid. The storers post it one hand-over earlier: t + grid before
        # the first hand-over, then t + 2 grid after each hand-over's second barrier (the
        # consumers read the post after the first), so no consumer walks the group table
        # between tiles (bench/RESULTS.md, eleventh session).
        ahead = self._post_next_tile(storage, cta, bidx + grid, Int32(0), st)
        # Each hand-over's C scale is posted before its first barrier, as its look-ahead is.
        group = Int32(0)
        if bidx < total_tiles:
            group = self._post_tile_scale(storage, cta, bidx, group, st)
            # The consumers' first hand-over: the tile starts empty. A CTA with no tile meets no
            # consumer there (the grid of a launch whose tile count the host cannot know,
            # runtime/serving.py, is every SM: such CTAs must exit, not wait).
            c_free.arrive_and_wait()
        tile = bidx
        while tile < total_tiles:
            group, m, n, k = self._group_of(tile, group, prefix, sizes)
            tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
            row0 = tile_m_idx * self.tile_m
            col0 = tile_n_idx * self.tile_n
            c_address = ptrs[group, tables.PTR_C]
            c_full.arrive_and_wait()
            ahead = self._post_next_tile(storage, cta, tile + 2 * grid, ahead, st)
            for v in cutlass.range(st, self.tile_m * vecs, STORERS, unroll=4):
                r = v // vecs
                c8 = (v - r * vecs) * 8
                if row0 + r < m and col0 + c8 < n:
                    words = ld_shared_v4(base + r * row_bytes + c8 * 2)
                    st_global_v4(c_address + (Int64(row0 + r) * Int64(n) + Int64(col0 + c8)) * 2,
                                 *words)
            tile += grid
            if tile < total_tiles:
                # After this hand-over's second barrier: the consumers have read the last post.
                group = self._post_tile_scale(storage, cta, tile, group, st)
                c_free.arrive_and_wait()  # not after the last tile: nobody comes

    @cute.jit
    def _consumer_a16(self, tiled_mma, storage, b_pipe, a_pipe, sizes, ptrs, prefix,
                      total_tiles, bidx, grid, ct) -> None:
        (frag_a, frag_w, words_w, acc, coords, num_kblocks, packed_b,
         scale_b) = self._consumer_operands(tiled_mma, storage, ct)

        b_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        a_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                               self.config.a_slots)
        prev_slot = Int32(0)
        group = Int32(0)
        tile = bidx
        # The storers write C, so a tile's k and scale row are all the consumers need: they
        # walk the group table for their first tile only, and each hand-over brings the next
        # tile's from the storers (_store_tiles).
        k = Int32(0)
        scale_row0 = Int32(0)
        if tile < total_tiles:
            group, k, scale_row0 = self._consumer_tile(tile, group, prefix, sizes)
        while tile < total_tiles:
            b_state, a_state, prev_slot, trace = self._tile_k_loop(
                tiled_mma, acc, frag_a, frag_w, words_w, num_kblocks, packed_b, scale_b,
                b_pipe, a_pipe, b_state, a_state, prev_slot, tile, k, scale_row0, bidx, grid,
                ct)
            k, scale_row0 = self._hand_over_tile(acc, coords, storage, trace)
            tile += grid

    @cute.jit
    def _tile_k_loop(self, tiled_mma, acc, frag_a, frag_w, words_w, num_kblocks, packed_b,
                     scale_b, b_pipe, a_pipe, b_state, a_state, prev_slot, tile, k, scale_row0,
                     bidx, grid, ct) -> tuple:
        """A data-parallel consumer's whole tile (_k_loop over its k), with a trace's tile
        start and K-loop end stamped; returns _k_loop's results and the tile's trace handle."""
        trace = None
        if cutlass.const_expr(self.config.trace):
            trace = self._trace_tile(tile, bidx, grid, ct == 0)
            self._stamp_tile(trace[0], 0, trace[1])
        b_state, a_state, prev_slot = self._k_loop(
            tiled_mma, acc, frag_a, frag_w, words_w, num_kblocks, packed_b, scale_b, b_pipe,
            a_pipe, b_state, a_state, prev_slot, 0, k // K_TILE, scale_row0, ct, trace)
        if cutlass.const_expr(self.config.trace):
            self._stamp_tile(trace[0], 1, trace[1])
        return b_state, a_state, prev_slot, trace

    @cute.jit
    def _consumer_tile(self, tile, group, prefix, sizes) -> tuple:
        """A consumer's view of `tile`: its group, k, and its first weight row within its
        128-row scale block (0 unless tile_n 192)."""
        group, m, _, k = self._group_of(tile, group, prefix, sizes)
        _, tile_n_idx = self._tile_coords(tile, group, prefix, m)
        return group, k, (tile_n_idx * self.tile_n) % 128

    @cute.jit
    def _k_loop(self, tiled_mma, acc, frag_a, frag_w, words_w, num_kblocks, packed_b, scale_b,
                b_pipe, a_pipe, b_state, a_state, prev_slot, kb, ke, scale_row0, ct,
                trace=None) -> tuple:
        """Weight stages kb..ke-1 of one tile into acc, zeroed first: each 64-K step
        dequantizes the
        weights into a register fragment and issues its wgmma on the A ring's slot, one step
        in flight. Returns the advanced pipeline states and the last A slot, already released
        (the caller rebinds them, as _produce_b's)."""
        acc.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        for kt in cutlass.range(kb, ke, unroll=1):
            b_pipe.consumer_wait(b_state)
            stage = b_state.index
            stage_b = packed_b + stage * (self.tile_n * PACKED_ROW_BYTES)
            stage_s = scale_b + stage * self.sfb_stage_bytes
            if cutlass.const_expr(self.config.w_prefetch):
                loaded = [self._load_b_half(ct, 0, h, stage_b, stage_s, scale_row0)
                          for h in range(2)]
            for s in cutlass.range_constexpr(SUB_STEPS):
                if cutlass.const_expr(trace is not None):
                    self._stamp_step(trace, kt, s, 0)
                if cutlass.const_expr(self.config.w_prefetch):
                    for h in cutlass.range_constexpr(2):
                        self._convert_b_half(words_w[s % 2], ct, h, loaded[h])
                    if cutlass.const_expr(s + 1 < SUB_STEPS):
                        # The next step's shared-memory words, issued before this step's
                        # waits and wgmma so their latency is off the next step's chain.
                        loaded = [self._load_b_half(ct, s + 1, h, stage_b, stage_s,
                                                    scale_row0) for h in range(2)]
                else:
                    self._dequant_b_fragment(words_w[s % 2], ct, s, stage_b, stage_s,
                                             scale_row0)
                if s == SUB_STEPS - 1:
                    b_pipe.consumer_release(b_state)  # the weights are in registers now
                a_pipe.consumer_wait(a_state)
                if cutlass.const_expr(trace is not None):
                    self._stamp_step(trace, kt, s, 1)
                slot = a_state.index
                warpgroup.fence()
                for kblk in cutlass.range_constexpr(num_kblocks):
                    cute.gemm(tiled_mma, acc, frag_w[s % 2][None, None, kblk],
                              frag_a[None, None, kblk, slot], acc)
                warpgroup.commit_group()
                if cutlass.const_expr(trace is not None):
                    self._stamp_step(trace, kt, s, 2)
                warpgroup.wait_group(1)
                if cutlass.const_expr(trace is not None):
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
