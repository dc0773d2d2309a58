"""v3's setup, role dispatch and phase 1 (a mixin of Sm90GroupedGemm; grouped_gemm.py's module
docstring has the whole data path): every CTA converts A to fp16 once per call, a grid barrier
follows, then the tile loop's roles (producer.py, consumer.py, epilogue.py) run."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from kernels import tables
from kernels.device_offsets import lane_scan, row_ends, staged_start
from runtime.formats import offsets_tables_bytes

from . import tma
from .config import INLINE_A_ARRIVALS, LANE_GROUPS, SUB_K, register_split_fits
from .context import Mainloop
from .dequant import exchange_half_step, half_step_vectors
from .ptx import (
    atom_add_acq_rel_gpu_u32,
    fence_proxy_async_global,
    ld_acquire_gpu_u32,
    ld_global_nc_u16,
    ld_global_nc_v4,
    ld_relaxed_gpu_u32,
    nanosleep,
    red_add_release_gpu_u32,
    select_bits,
    st_global_v4,
    st_relaxed_gpu_u32,
)
from .staging import (
    A_CHUNK_K,
    EPOCH_OFFSET,
    PAIR_SEND,
    PAIR_STORES,
    chunk_addresses,
    pair_store_offset,
)
from .structure import PACKED_ROW_BYTES, WARPGROUP

# Consumer warpgroups -> (producer, consumer) registers per thread after setmaxnreg, where the
# consumers need more than the launch's even split: 3: 128 * 56 + 384 * 152 = 65536; 2 (tile_m
# 256's 128-register accumulator): 128 * 56 + 256 * 224 = 64512; 4: 128 * 56 + 512 * 104.
REGISTER_SPLITS = {4: (56, 104), 3: (56, 152), 2: (56, 224)}
# With stream_a the producer warpgroup's warps 1..3 also stage A, and 56 registers are too few
# for them (ptxas spills); three consumer warpgroups still fit at 144: 128 * 64 + 384 * 144.
STREAM_A_SPLIT = (64, 144)
# inline_a's converter warps hold a stage's loads (20 words per 16 rows) at the producer's
# registers: 64, and 80 where three consumer warpgroups leave room (tile_m 32). At tile_m 32
# with four consumer warpgroups both roles fit the launch's even 96 (no setmaxnreg): since the
# consumers load 8-byte halves of their steps (thirty-fourth session) the converter's 64 left
# it two registers short, and the consumers need no more than 96.
INLINE_A_SPLITS = {(16, 4): (64, 104), (16, 3): (64, 144), (32, 4): (96, 96),
                   (32, 3): (80, 144)}
for _wgs, (_producer, _consumer) in (*REGISTER_SPLITS.items(), (3, STREAM_A_SPLIT),
                                     *((w, s) for (_, w), s in INLINE_A_SPLITS.items())):
    assert register_split_fits(_wgs, _producer, _consumer), (_wgs, _producer, _consumer)
# The grid barrier: an arrival counter, then the generation word on its own 64-byte line, at
# the kernel's grid_barrier parameter. The runtime zeroes it once and every launch leaves the
# counter at zero. The workspace keeps HEADER_BYTES unused at its start: they are the eager
# launches' barrier (runtime/device.py).
HEADER_BYTES = 128
BARRIER_GENERATION = 64
STAGE_UNROLL = 4  # staging chunks whose loads one thread has in flight at once

class StagedA:
    """v3: A staged to fp16 once per call, then the tile loop."""

    @cute.jit
    def _kernel_a16(self, atoms, storage, tables_, workspace, grid_barrier, tidx,
                    warp_idx) -> None:
        """Phase 1: every thread of every CTA converts a share of all groups' A to fp16 in the
        workspace; grid barrier. Phase 2: the persistent tile loop, with TMA loading fp16 A
        tiles into a ring the wgmma reads directly, and only the weights converted per tile.
        With stream_a the two overlap (_roles_streamed, streamed.py). `atoms`: the B, fp16 A
        and weight-scale TMA templates; `tables_`: _context's arguments."""
        b_pipe = self._tma_pipeline(storage.mbar, self.stages,
                                    self.tile_n * PACKED_ROW_BYTES + self.sfb_stage_bytes)
        a_pipe = self._tma_pipeline(storage.mbar_a, self.config.a_slots,
                                    self._a16_load_rows() * SUB_K * 2,
                                    INLINE_A_ARRIVALS if self.config.inline_a else 1)
        cta = self._context(*tables_)
        ws_base = workspace.toint()
        a16_base = self._past_descriptors(ws_base, cta.grid, cta.num_groups)
        a16_base = self._trace_start(workspace, a16_base, tidx, cta.bidx, cta.grid,
                                     cta.num_groups)
        mainloop = Mainloop(atoms=atoms, storage=storage, b_pipe=b_pipe, a_pipe=a_pipe,
                         desc_base=ws_base + self.header_bytes, a16_base=a16_base)
        if cutlass.const_expr(self.config.inline_a):
            self._roles_inline(mainloop, cta, tidx, warp_idx)
        elif cutlass.const_expr(self.config.stream_a):
            self._roles_streamed(mainloop, cta, grid_barrier.toint(), tidx, warp_idx)
        else:
            self._roles_barrier(mainloop, cta, grid_barrier, tidx, warp_idx)

    def _descriptors_end(self, ws_base, grid) -> Int64:
        """Workspace address past the zeroed header and every CTA's descriptor sets."""
        return ws_base + self.header_bytes + grid * (self.desc_sets * tma.MAPS_PER_SET
                                                     * tma.TENSORMAP_BYTES)

    def _past_descriptors(self, ws_base, grid, num_groups=None) -> Int64:
        """Workspace address past the zeroed header and every CTA's descriptor sets (and, in
        a device-offsets kernel, every CTA's derived tables: offsets.py), where any diagnostic
        records (hooks.py, _trace_start) and then the fp16 A begin (runtime/plan.py)."""
        past = self._descriptors_end(ws_base, grid)
        if cutlass.const_expr(self.config.device_offsets):
            past = past + Int64(grid) * Int64(offsets_tables_bytes(num_groups))
        return past

    @cute.jit
    def _roles_streamed(self, mainloop, cta, header, tidx, warp_idx) -> None:
        """stream_a (streamed.py): no phase of its own. Warp 0 produces, warps 1..3 stage A and
        then store C tiles, the consumers start at once. `header`: the progress counters'
        address (the grid_barrier parameter)."""
        # The launch's epoch (streamed.py), read before the CTA barrier so every read of it here
        # precedes the stagers' first count: CTA 0 advances it only after every count, so no CTA
        # sees the next launch's. The barrier and the counts' release order it, so the read is
        # relaxed (an acquire made every thread wait for it, CCTL.IVALL, before the barrier).
        epoch = ld_relaxed_gpu_u32(header + EPOCH_OFFSET)
        lane_tables = self._stager_tables(cta, tidx % 32)
        cute.arch.barrier()  # and the pipelines' mbarriers are initialized before any role waits
        split = self._register_split()
        if warp_idx < 4:
            if cutlass.const_expr(split is not None):
                cute.arch.warpgroup_reg_dealloc(split[0])
            if warp_idx == 0:
                self._producer_streamed(mainloop, cta, header, epoch, tidx)
            else:
                self._stage_streamed(cta, lane_tables, mainloop.a16_base,
                                     self._progress_bank(header, epoch), tidx - 32)
                self._store_tiles(mainloop.storage, cta, tidx - 32)
        else:
            if cutlass.const_expr(split is not None):
                cute.arch.warpgroup_reg_alloc(split[1])
            self._consumer_a16(mainloop, cta, tidx - WARPGROUP)

    @cute.jit
    def _roles_barrier(self, mainloop, cta, grid_barrier, tidx, warp_idx) -> None:
        """Phase 1 (all warps but warp 0 stage A), the grid barrier, then the roles."""
        # The grid barrier's generation before this CTA arrives, read now so that its round
        # trip overlaps the staging: it cannot move before every CTA, this one included, has
        # arrived.
        seen = Uint32(0)
        if tidx == 32:
            seen = ld_acquire_gpu_u32(grid_barrier.toint() + BARRIER_GENERATION)
        first_group, pre = Int32(-1), Int32(0)
        if warp_idx == 0:
            first_group, pre = self._producer_prologue(mainloop, cta)
        else:
            self._stage_a(cta, mainloop.a16_base, tidx - 32)
        # A device-offsets producer keeps its first tile's lookup across the barrier.
        first = (first_group, pre) if cutlass.const_expr(self.config.device_offsets) else None
        cute.arch.barrier()
        self._stamp_stager(9, tidx - 32)
        if tidx == 32:
            self._grid_barrier(grid_barrier.toint(), cta.grid, seen)
        cute.arch.barrier()
        self._stamp_stager(10, tidx - 32)
        # The fp16 A just written (generic proxy, other CTAs) is read by TMA (async proxy).
        fence_proxy_async_global()

        self._split_roles(mainloop, cta, tidx, warp_idx,
                          lambda: self._producer_a16(mainloop, cta, first=first),
                          lambda: self._store_tiles(mainloop.storage, cta, tidx - 32))

    @cute.jit
    def _split_roles(self, mainloop, cta, tidx, warp_idx, producer, helpers) -> None:
        """The tile loop's roles: `producer()` on warp 0, `helpers()` on warps 1..3 and the
        consumers on the other warpgroups, with setmaxnreg moving registers to the consumers
        where they need more than the launch's even split (_register_split)."""
        split = self._register_split()
        if cutlass.const_expr(split is not None):
            # setmaxnreg is per warpgroup (all of warpgroup 0 gives registers up, not just warp
            # 0), and ptxas honours it only when each role's code is reachable from its own
            # setmaxnreg alone.
            if warp_idx < 4:
                cute.arch.warpgroup_reg_dealloc(split[0])
                if warp_idx == 0:
                    producer()
                if warp_idx >= 1:
                    helpers()
            else:
                cute.arch.warpgroup_reg_alloc(split[1])
                self._consumer_a16(mainloop, cta, tidx - WARPGROUP)
        else:
            if warp_idx == 0:
                producer()
            if warp_idx >= 1:
                if warp_idx < 4:
                    helpers()
            if warp_idx >= 4:
                self._consumer_a16(mainloop, cta, tidx - WARPGROUP)

    def _register_split(self) -> tuple[int, int] | None:
        """(producer, consumer) registers per thread after setmaxnreg (REGISTER_SPLITS), or None
        to keep the launch's even split: two consumer warpgroups need more only at tile_m 256."""
        warpgroups = self.consumer_threads // WARPGROUP
        if warpgroups >= 3 or (warpgroups == 2 and self.tile_m == 256):
            if warpgroups == 3 and self.config.stream_a:
                return STREAM_A_SPLIT
            if self.config.inline_a and (self.tile_m, warpgroups) in INLINE_A_SPLITS:
                return INLINE_A_SPLITS[(self.tile_m, warpgroups)]
            return REGISTER_SPLITS[warpgroups]
        return None

    @cute.jit
    def _stage_a(self, cta, a16_base, tidx) -> None:
        """Convert every group's A to fp16 at a16_base (groups back to back, rows of k), by
        every thread but warp 0's (`tidx` from the first staging thread), in 32-K chunks: the
        two lanes of a pair load the two chunks of a 64-K step, swap half their words and each
        converts the words of its parity (dequant.exchange_half_step), so the fp16 step lands
        in the K order of the weights' register fragments (fp4_bits).
        All groups' chunks form one index space (group after group, rows in order, K chunks
        fastest) walked by a grid-stride loop whose STAGE_UNROLL chunks per iteration issue
        their loads before any conversion: one memory round trip per thread for up to
        STAGE_UNROLL * grid * threads chunks, whatever the number of groups. Up to LANE_GROUPS
        groups, lane g of each warp holds group g's table row and a thread finds its chunks'
        groups by shuffles (one table read, not a chain); more groups search or walk."""
        if cta.num_groups <= LANE_GROUPS:
            self._stage_chunks(cta, a16_base, tidx, "lanes")
        else:
            # A device-offsets kernel has the ROW_ENDS table: a binary search per chunk; walking
            # costs E dependent loads per thread (docs/lab_notebook.md, seventeenth session).
            if cutlass.const_expr(self.config.device_offsets):
                self._stage_chunks(cta, a16_base, tidx, "search")
            else:
                self._stage_chunks(cta, a16_base, tidx, "walk")

    @cute.jit
    def _stage_chunks(self, cta, a16_base, tidx, mode: cutlass.Constexpr) -> None:
        """_stage_a's loop. `mode`: how a chunk's group is found: "lanes", the groups' table
        rows held one per lane (at most LANE_GROUPS groups); "search", a binary search of the
        ROW_ENDS table (device-offsets kernels); "walk", a cursor walking the tables."""
        sizes, ptrs, num_groups = cta.sizes, cta.ptrs, cta.num_groups
        bidx, grid = cta.bidx, cta.grid
        stagers = self.threads - 32  # warp 0 runs _producer_prologue meanwhile
        stride = grid * stagers
        lane = tidx % 32
        total = Int32(0)
        lanes = mode == "lanes"
        if cutlass.const_expr(mode == "search"):
            # One k for all experts; the chunks of the staged rows in order.
            ends = row_ends(cta.prefix, num_groups)
            k_all = sizes[0, tables.COL_K]
            per_row = k_all // A_CHUNK_K
            total = ends[num_groups - 1] * per_row
            found = cute.make_rmem_tensor(STAGE_UNROLL, Int32)
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
        if cutlass.const_expr(mode == "walk"):
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
        if cutlass.const_expr(self.config.device_offsets):
            # Warp-sized blocks of chunks dealt round the CTAs first: a call of few rows then
            # spreads its chunks over many SMs instead of filling the first CTAs' threads,
            # whose memory queues made the last CTA stage 3x slower than the median
            # (docs/lab_notebook.md, twentieth session, run 7). c - lane stays warp-uniform.
            c = ((tidx // 32) * grid + bidx) * 32 + lane
        # Pair stores (staging.PAIR_STORES): the odd lane of a pair takes `odd` = all ones.
        odd = Uint32(0) - Uint32(tidx % 2)
        # Warp-uniform trip count (the shuffles need the whole warp); a lane past the end loads
        # a valid chunk and stores nothing, as in the last iteration.
        while c - lane < total:
            # Past the end: load the last chunk again (valid memory), store nothing.
            cus = [cutlass.min(c + u * stride, total - 1) for u in range(STAGE_UNROLL)]
            if cutlass.const_expr(lanes):
                self._lane_groups(found, end_l, num_groups, cus)  # each chunk's group
            if cutlass.const_expr(mode == "search"):
                self._search_groups(found, ends, num_groups, [cu // per_row for cu in cus])
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
                elif cutlass.const_expr(mode == "search"):
                    g = found[u]
                    first_u = staged_start(ends, g) * per_row
                    src, sf, dst = chunk_addresses(
                        cu, first_u, k_all,
                        lambda: (ptrs[g, tables.PTR_A], ptrs[g, tables.PTR_SFA],
                                 a16_base + Int64(first_u) * Int64(A_CHUNK_K * 2)), Int64)
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
        self._publish_staged()

    def _publish_staged(self) -> None:
        """After a thread's staging stores (generic proxy): the TMA loads of the fp16 A (async
        proxy) may follow, once a barrier or a release orders them."""
        fence_proxy_async_global()

    @cute.jit
    def _lane_scan(self, count, lane) -> tuple:
        """A warp's lanes each hold a count (lane g: group g's chunks or rows): returns this
        lane's inclusive prefix sum (where its group's range ends) and the warp's total, by a
        shuffle scan."""
        return lane_scan(count, lane)

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
    def _search_groups(self, found, ends, num_groups, keys) -> None:
        """found[u] = the expert whose staged rows hold row keys[u]: the first g with
        ends[g] > keys[u] (experts of m = 0 end where their predecessor does, so they are never
        found), by a branch-free binary search over the ROW_ENDS table, the keys' loads issued
        together at each of the log2(E) steps (the width halves alike for every key)."""
        found.fill(0)
        width = num_groups
        while width > 1:
            half = width // 2
            for u in cutlass.range_constexpr(len(keys)):
                # (key - end) >> 31 is -1 when the key lies before the probe's end, else 0.
                before = (keys[u] - ends[found[u] + half - 1]) >> 31
                found[u] = found[u] + half + half * before
            width -= half

    @cute.jit
    def _store_chunks(self, words, scales, dsts, valid, odd, tidx) -> None:
        """Convert the loaded chunks (packed words and scale pairs, one per list entry) and write
        them to `dsts` with pair stores (staging.PAIR_STORES); `valid(u)` says whether chunk u is
        real (the same for both lanes of a pair). The whole warp takes part (shuffles)."""
        for u in cutlass.range_constexpr(len(words)):
            vector = half_step_vectors(*exchange_half_step(words[u], scales[u], tidx % 2))
            # vec["vN"]: the 16 bytes at offset 16 N of this chunk's output: the lane's half of
            # the step is vectors 4p..4p+3 of it (fp4_bits.position_vector), pair N of its words.
            vec = {f"v{q}": vector(q) for q in range(4)}
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
