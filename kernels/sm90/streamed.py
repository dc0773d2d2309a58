"""v3 with Config.stream_a: phase 1 overlapped with the tile loop (a mixin of Sm90GroupedGemm).

Without it, a grid barrier holds every tile back until the last chunk of A is staged (bench/
RESULTS.md). Here warps 1..3 of each CTA stage A in K-slab order (staging.py, "streamed
staging") while the consumers start at once; each CTA counts every streaming iteration in the
progress header (staging.py), and the producer, before loading stage kt of a tile's A rows,
waits until every CTA has counted the iterations holding them. Warps 1..3 then store C tiles.

Memory order, as the grid barrier had it: a stager warp's generic stores, fence.proxy.async, a
warp barrier, then its lane 0's release add; the producer's acquire load, then
fence.proxy.async, then the TMA loads (async proxy) of the fp16 A. Each warp counts its own
iterations: the stagers never wait for each other and use no named barrier (with one, racecheck
reported hazards on the C tile they later hand over, docs/lab_notebook.md, ninth session). They
run at the producer warpgroup's registers (staged.py, STREAM_A_SPLIT).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from kernels import tables

from .ptx import (
    fence_proxy_async_global,
    ld_acquire_gpu_u32,
    ld_global_nc_u16,
    ld_global_nc_v4,
    nanosleep,
    red_add_release_gpu_u32,
    st_relaxed_gpu_u32,
)
from .staging import (
    A_CHUNK_K,
    EPOCH_OFFSET,
    PROGRESS_BANK_BYTES,
    PROGRESS_SLOTS,
    STREAM_STAGERS,
    STREAM_UNROLL,
    STREAM_WARPS,
    chunk_addresses,
    chunks_before,
    slab_chunk,
)


class StreamedA:
    """Streamed staging: the stagers, the producer's waits and the header's upkeep."""

    @cute.jit
    def _progress_bank(self, header, epoch) -> Int64:
        """Address of the counter bank this launch uses (staging.py, the progress header)."""
        return header + Int64(epoch & Uint32(1)) * Int64(PROGRESS_BANK_BYTES)

    @cute.jit
    def _stream_iterations(self, rows, k, grid) -> tuple:
        """(chunks per iteration, iterations) of streaming `rows` rows of k: the stagers'
        loop and the producer's waits must agree on both."""
        per_iter = STREAM_UNROLL * grid * STREAM_STAGERS
        return per_iter, (rows * (k // A_CHUNK_K) + per_iter - 1) // per_iter

    @cute.jit
    def _rows_before(self, sizes, group) -> Int32:
        """A rows of the groups before `group`, which the fp16 area holds back to back."""
        rows = Int32(0)
        for g in cutlass.range(group, unroll=1):
            rows += sizes[g, tables.COL_M]
        return rows

    @cute.jit
    def _stager_tables(self, cta, lane) -> tuple:
        """What lane g of a stager warp reads of group g (staged.py's _stage_chunks, with rows
        instead of chunks): (k, A pointer, scale pointer, m). Read before the CTA's first
        barrier, so these loads' round trip overlaps the barrier and the other roles' start."""
        sizes, ptrs = cta.sizes, cta.ptrs
        own = cutlass.min(lane, cta.num_groups - 1)
        return (sizes[0, tables.COL_K],  # one k for all groups (config.check_groups)
                ptrs[own, tables.PTR_A], ptrs[own, tables.PTR_SFA], sizes[own, tables.COL_M])

    @cute.jit
    def _stage_streamed(self, cta, lane_tables, a16_base, bank, st) -> None:
        """Warps 1..3 (`st` 0..95): stage every group's A in K-slab order, STREAM_UNROLL chunks
        per thread per iteration (a grid-stride loop over the call's chunks); each warp counts
        each iteration in `bank` of the progress header once its lanes have written it.
        `lane_tables`: _stager_tables of this lane."""
        num_groups, bidx, grid = cta.num_groups, cta.bidx, cta.grid
        lane = st % 32
        # Lane g holds group g: its rows [first_l, end_l) among all groups' rows, its A and
        # scale pointers.
        k, a_l, sf_l, m_l = lane_tables
        if lane >= num_groups:
            m_l = Int32(0)
        end_l, rows = self._lane_scan(m_l, lane)
        self._stamp_stager(6, st)
        first_l = end_l - m_l
        per_row = k // A_CHUNK_K
        total = rows * per_row
        stride = grid * STREAM_STAGERS
        per_iter, iterations = self._stream_iterations(rows, k, grid)
        found = cute.make_rmem_tensor(STREAM_UNROLL, Int32)
        odd = Uint32(0) - Uint32(st % 2)  # pair stores: the odd lane of a pair
        for it in cutlass.range(iterations, unroll=1):
            c = it * per_iter + bidx * STREAM_STAGERS + st
            # Past the end: the last chunk again (valid memory), stored by nobody.
            cus = [cutlass.min(c + u * stride, total - 1) for u in range(STREAM_UNROLL)]
            places = [slab_chunk(cu, rows) for cu in cus]  # (kt, row, kc)
            self._lane_groups(found, end_l, num_groups, [p[1] for p in places])  # rows' groups
            dsts, words, scales = [], [], []
            for u in cutlass.range_constexpr(STREAM_UNROLL):
                _, row, kc = places[u]
                g = found[u]
                first_u = cute.arch.shuffle_sync(first_l, g)
                a_u = cute.arch.shuffle_sync(a_l, g)
                sf_u = cute.arch.shuffle_sync(sf_l, g)
                src, sf, dst = chunk_addresses(
                    (row - first_u) * per_row + kc, 0, k,
                    lambda: (a_u, sf_u, a16_base + Int64(first_u) * Int64(k * 2)), Int64)
                words.append(ld_global_nc_v4(src))
                scales.append(ld_global_nc_u16(sf))
                dsts.append(dst)
            # Both lanes of a pair pass or fail the check together: total is even.
            self._store_chunks(words, scales, dsts, lambda u: c + u * stride < total, odd, st)
            self._stamp_stager(7, st, it)
            self._publish_staged()
            cute.arch.sync_warp()
            self._stamp_stager(8, st, it)
            if cute.arch.lane_idx() == 0:
                red_add_release_gpu_u32(
                    bank + Int64(cutlass.min(it, PROGRESS_SLOTS - 1) * 4), Uint32(1))
                self._stamp_stager(5, st, it)

    @cute.jit
    def _await_staged(self, bank, need, iterations, grid) -> Int32:
        """Producer: wait until streaming iteration `need` is counted by every CTA; returns how
        many iterations are then known staged (staging.progress_target). The last slot is read
        in the same round trip: once it is complete, so is every iteration (each CTA counts
        its iterations in order), and the producer waits no more."""
        last = cutlass.min(iterations - 1, PROGRESS_SLOTS - 1)
        seen = ld_acquire_gpu_u32(bank + Int64(cutlass.min(need, last) * 4))
        seen_last = ld_acquire_gpu_u32(bank + Int64(last * 4))
        while seen < self._slot_target(need, iterations, grid):
            nanosleep(64)
            seen = ld_acquire_gpu_u32(bank + Int64(cutlass.min(need, last) * 4))
        done = self._slot_done(need, iterations)
        if seen_last >= self._slot_target(last, iterations, grid):
            done = iterations
        # The fp16 A was written by generic stores; the TMA loads that follow read it.
        fence_proxy_async_global()
        return done

    @cute.jit
    def _slot_target(self, it, iterations, grid) -> Uint32:
        """staging.progress_target's count for iteration `it`: every stager warp of the grid
        (slots past the last are shared)."""
        target = Uint32(grid * STREAM_WARPS)
        if it >= PROGRESS_SLOTS - 1:
            target = Uint32(grid * STREAM_WARPS * (iterations - (PROGRESS_SLOTS - 1)))
        return target

    @cute.jit
    def _slot_done(self, it, iterations) -> Int32:
        """staging.progress_target's iterations known staged once `it`'s slot is complete."""
        done = it + 1
        if it >= PROGRESS_SLOTS - 1:
            done = iterations
        return done

    @cute.jit
    def _row_end(self, sizes, group, row_a, m) -> Int32:
        """One past the last A row (among all groups' rows) of the tile at row_a of `group`."""
        return self._rows_before(sizes, group) + cutlass.min(row_a + self.tile_m, m)

    @cute.jit
    def _wait_stage_a(self, progress, ready, row_end, kt, grid) -> Int32:
        """Producer, before loading stage kt of a tile's A rows (up to row_end): wait for their
        chunks unless an earlier wait already covered them. `ready`: iterations known staged;
        returns it updated (the caller rebinds it)."""
        bank, rows, per_iter, iterations = progress
        need = (chunks_before(kt, row_end, rows) - 1) // per_iter
        if need >= ready:
            ready = self._await_staged(bank, need, iterations, grid)
        return ready

    @cute.jit
    def _finish_progress(self, progress, epoch, header, grid, lane) -> None:
        """CTA 0's producer warp, after its last load: once every iteration is counted (so every
        CTA has read the epoch), zero the other bank for the next launch and advance the
        epoch."""
        bank, _, _, iterations = progress
        if iterations > 0:
            self._await_staged(bank, iterations - 1, iterations, grid)
        other = self._progress_bank(header, epoch + Uint32(1))
        st_relaxed_gpu_u32(other + Int64(lane * 4), Uint32(0))  # PROGRESS_SLOTS == 32 lanes
        if lane == 0:
            st_relaxed_gpu_u32(header + EPOCH_OFFSET, epoch + Uint32(1))

    @cute.jit
    def _producer_streamed(self, mainloop, cta, header, epoch, lane) -> None:
        """Warp 0 with stream_a: the prologue (descriptor templates, first weight stages), the
        tile loop with waits for staged A, and CTA 0's upkeep of the header."""
        self._producer_prologue(mainloop, cta)
        rows = self._rows_before(cta.sizes, cta.num_groups)
        per_iter, iterations = self._stream_iterations(rows, cta.sizes[0, tables.COL_K], cta.grid)
        progress = (self._progress_bank(header, epoch), rows, per_iter, iterations)
        self._producer_a16(mainloop, cta, progress)
        if cta.bidx == 0:
            self._finish_progress(progress, epoch, header, cta.grid, lane)


assert PROGRESS_SLOTS == 32, "_finish_progress zeroes one slot per lane"
