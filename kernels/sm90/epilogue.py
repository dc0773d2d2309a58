"""v3's async epilogue (a mixin of Sm90GroupedGemm): the consumers hand each finished tile to
warps 1..3 through a padded shared C tile and go on; the storers copy it to C in 16-byte
vectors and post the consumers' next tile (k, first scale row) and C scale."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, Int64

from kernels import tables

from .config import C_ROW_PAD
from .ptx import ld_shared_v4, st_global_v4

# async_epilogue: warps 1..3 store the tiles the consumers leave in shared memory (those of them
# that do not convert A, with inline_a). Named barriers between the two sides (0 is the CTA's; 1
# was v2's step barrier, 2 stream-K's): the C tile is free to write, and it is full.
STORERS = 3 * 32
_C_FREE, _C_FULL = 3, 4


class AsyncEpilogue:
    """v3's hand-over of finished tiles and the storer warps."""

    def _c_tile(self, storage) -> cute.Tensor:
        """async_epilogue's shared C tile: tile_m rows of tile_n fp16, each padded by C_ROW_PAD
        so that the consumers' 2-byte stores of 4 rows at once fall in different banks."""
        return storage.c_tile.get_tensor(cute.make_layout(
            (self.tile_m, self.tile_n), stride=(self.tile_n + C_ROW_PAD, 1)))

    def _c_barriers(self) -> tuple:
        """async_epilogue's two named barriers, consumers and storers together: the shared C
        tile is free to write, and it is full."""
        both = self.consumer_threads + self._storers()
        return (pipeline.NamedBarrier(barrier_id=_C_FREE, num_threads=both),
                pipeline.NamedBarrier(barrier_id=_C_FULL, num_threads=both))

    def _storers(self) -> int:
        """Threads that store C tiles: warps 1..3 but inline_a's converter warps."""
        return STORERS - 32 * self._converter_warps()

    @cute.jit
    def _hand_over_tile(self, acc, coords, storage, trace=None) -> tuple:
        """async_epilogue, consumers: wait until the storers have copied out the previous
        tile, write this one (times its C scale, rounded to out_dtype) into the shared C tile,
        and signal it full; the storers copy it out while the next tile's steps run. Returns
        the next tile's (k, first scale row). The storers posted both, and this tile's C scale,
        before the first barrier (_store_tiles): the consumers never load alpha themselves (a
        first-tile load of theirs was slower, bench/RESULTS.md)."""
        c_free, c_full = self._c_barriers()
        c_tile = self._c_tile(storage)
        c_free.arrive_and_wait()
        self._stamp_tile(trace, 2)
        posted = self._next_tile_post(storage)
        next_k, next_row0 = posted[0], posted[1]
        scale = self._tile_scale_post(storage)[0]
        for i in cutlass.range_constexpr(cute.size(acc)):
            b_row, a_row = coords[i]
            c_tile[a_row, b_row] = self.c_dtype(acc[i] * scale)
        # A full barrier rather than an arrive: the storers are already waiting here, and
        # compute-sanitizer's racecheck orders shared memory only through full barriers.
        c_full.arrive_and_wait()
        self._stamp_tile(trace, 3)
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
        if tile < cta.tile_end:
            group, k, row0 = self._consumer_tile(tile, group, cta.prefix, cta.sizes)
            if st == 0:
                posted = self._next_tile_post(storage)
                posted[0] = k
                posted[1] = row0
        return group

    @cute.jit
    def _store_tiles(self, storage, cta, st) -> None:
        """async_epilogue, warps 1..3 (`st` 0.. over _storers()): for each of this CTA's
        tiles, wait until the consumers have filled the shared C tile, copy its rows inside
        (m, n) to C in 16-byte vectors, and hand the tile back (a full barrier, met by the
        consumers at their next tile's end)."""
        sizes, ptrs, prefix = cta.sizes, cta.ptrs, cta.prefix
        first, step, end = cta.first_tile, cta.tile_step, cta.tile_end
        c_free, c_full = self._c_barriers()
        base = storage.c_tile.data_ptr().toint()
        row_bytes = (self.tile_n + C_ROW_PAD) * 2
        vecs = self.tile_n // 8  # 16-byte vectors per row; n is a multiple of 8 (N_MULTIPLE)
        # The consumers' look-ahead: the hand-over of tile t brings the (k, first scale row) of
        # their next tile, t + step. The storers post it one hand-over earlier: t + step before
        # the first hand-over, then t + 2 step after each hand-over's second barrier (the
        # consumers read the post after the first), so no consumer walks the group table
        # between tiles (docs/lab_notebook.md, eleventh session).
        group = Int32(0)
        if first < end:
            group = self._first_group(storage, cta)
        ahead = self._post_next_tile(storage, cta, first + step, group, st)
        # Each hand-over's C scale is posted before its first barrier, as its look-ahead is.
        if first < end:
            group = self._post_tile_scale(storage, cta, first, group, st)
            # The consumers' first hand-over: the tile starts empty. A CTA with no tile meets no
            # consumer there (the grid of a launch whose tile count the host cannot know,
            # runtime/serving.py, is every SM: such CTAs must exit, not wait).
            c_free.arrive_and_wait()
        tile = first
        while tile < end:
            group, m, n, k = self._group_of(tile, group, prefix, sizes)
            tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
            row0 = tile_m_idx * self.tile_m
            col0 = tile_n_idx * self.tile_n
            c_address = ptrs[group, tables.PTR_C]
            c_full.arrive_and_wait()
            ahead = self._post_next_tile(storage, cta, tile + 2 * step, ahead, st)
            for v in cutlass.range(st, self.tile_m * vecs, self._storers(), unroll=4):
                r = v // vecs
                c8 = (v - r * vecs) * 8
                if row0 + r < m and col0 + c8 < n:
                    words = ld_shared_v4(base + r * row_bytes + c8 * 2)
                    st_global_v4(c_address + (Int64(row0 + r) * Int64(n) + Int64(col0 + c8)) * 2,
                                 *words)
            tile += step
            if tile < end:
                # After this hand-over's second barrier: the consumers have read the last post.
                group = self._post_tile_scale(storage, cta, tile, group, st)
                c_free.arrive_and_wait()  # not after the last tile: nobody comes
