"""Config.first_a_local: the consumers convert their first tile's first weight stage of A
themselves (a mixin of Sm90GroupedGemm).

With stream_a, a tile's A comes from the fp16 staging area, which the stagers of every CTA fill
while the tiles run: a CTA's first A load waits until the grid's first streaming iteration is
counted by every CTA, then for the TMA load. The trace of the tenth and eleventh sessions put
that chain at 10-13K cycles from the CTA's start, 2-4K after its first weights had arrived
(bench/RESULTS.md). The consumers have nothing to do until then, so here they read their first
tile's packed A rows of the first K_TILE columns, convert them with the staging recipe (the same
fp16 values, so results stay bit-identical) and store them where the TMA would have put them:
the first SUB_STEPS slots of the A ring, 128-byte rows, 128B swizzle (16-byte unit u of row r
at u ^ (r % 8)). Rows past the group's m are zeros, as the TMA's out-of-bounds fill. One
consumer thread per slot then arrives on the slot's full barrier (its one expected arrival,
with no bytes), so the pipeline's phases stay as if the producer had loaded it; the producer
skips those loads (staged.py, `_skip_first_a`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, Int64, Uint32

from kernels import tables

from .config import SUB_K
from .dequant import dequant_chunk
from .fp4_bits import permuted_chunk
from .ptx import ld_global_nc_u16, ld_global_nc_v4, st_shared_v4
from .staging import A_CHUNK_K, SLAB_CHUNKS, chunk_addresses
from .structure import SUB_STEPS

# Named barrier of the consumer warps (0 is the CTA's, 1 v2's, 2 stream-K's, 3 and 4 the C
# tile's hand-over).
_FIRST_A_BARRIER = 5
ROW_BYTES = SUB_K * 2  # one fp16 row of an A ring slot


class FirstALocal:
    """The consumers' conversion of their first tile's first A stage into the A ring."""

    @cute.jit
    def _first_a_local(self, storage, a_pipe, sizes, ptrs, prefix, total_tiles, bidx,
                       ct) -> None:
        """Consumers (`ct` 0..consumer_threads-1), before their first tile: fill A ring slots
        0..SUB_STEPS-1 with the tile's A columns 0..K_TILE-1 and mark them full."""
        if bidx < total_tiles:
            group, m, _, k = self._group_of(bidx, Int32(0), prefix, sizes)
            tile_m_idx, _ = self._tile_coords(bidx, group, prefix, m)
            row_a = tile_m_idx * self.tile_m
            a_base = ptrs[group, tables.PTR_A]
            sf_base = ptrs[group, tables.PTR_SFA]
            ring = storage.a16.data_ptr().toint()
            chunks = self.tile_m * SLAB_CHUNKS  # 32-K chunks of the stage's rows
            rounds = -(-chunks // self.consumer_threads)
            for i in cutlass.range_constexpr(rounds):
                c = ct + i * self.consumer_threads
                r = c // SLAB_CHUNKS  # eight threads read one row's 128 packed bytes
                kc = c - r * SLAB_CHUNKS
                # A row past m (or past the tile) reads the group's last row, valid memory,
                # and is stored as zeros.
                valid = Int32(c < chunks) & Int32(row_a + r < m)
                row = cutlass.min(row_a + r, m - 1)
                src, sf, _ = chunk_addresses(row * (k // A_CHUNK_K) + kc, 0, k,
                                             lambda: (a_base, sf_base, Int64(0)), Int64)
                keep = Uint32(0) - Uint32(valid)  # all ones for a real row, else zero
                words = [w & keep for w in ld_global_nc_v4(src)]
                outs = dequant_chunk(words, ld_global_nc_u16(sf))  # zeros stay +0
                slot = ring + (kc // 2) * (self.tile_m * ROW_BYTES) + r * ROW_BYTES
                for q in cutlass.range_constexpr(4):
                    # the staging area's order: 16-byte vector q of chunk kc at unit
                    # 4 (kc % 2) + q of the row (fp4_bits.permuted_chunk)
                    unit = permuted_chunk(0, q)[0] + (kc % 2) * 4
                    if c < chunks:
                        st_shared_v4(slot + ((unit ^ (r % 8)) * 16), outs[0][q], outs[1][q],
                                     outs[2][q], outs[3][q])
            # The stores (generic proxy) are read by wgmma (async proxy), and every consumer's
            # rows must be in before any slot is marked full.
            cute.arch.fence_proxy("async.shared", space="cta")
            pipeline.NamedBarrier(barrier_id=_FIRST_A_BARRIER,
                                  num_threads=self.consumer_threads).arrive_and_wait()
            if ct < SUB_STEPS:
                a_pipe.sync_object_full.arrive_mbarrier(ct)
