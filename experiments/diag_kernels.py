"""The diagnostic variants of the sm_90a v3 kernel (experiments/diag_build.py builds them): each
is a subclass of the shipped Sm90GroupedGemm that overrides one role method or two, so a bench run
shows what the part it removes costs. Their results are WRONG by design (sa_storers_first
aside); never serve them. Imports cutlass: load it only where the DSL is installed.

An override names a method of the shipped kernel; `overrides()` lists them and the CPU test
checks each still exists there, so a kernel change that renames a role fails loudly instead of
building the shipped kernel under a variant's name. Copied method bodies (a role with one line
changed) say which shipped method they follow: keep them in step when it changes. `super`
takes its class explicitly: cute.jit re-executes a method's rewritten source, which has no
`__class__` cell for the zero-argument form.
"""

from __future__ import annotations

import os

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float16, Float32, Int32, Int64, Uint32
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum

from kernels import tables
from kernels.sm90 import compile as sm90_compile
from kernels.sm90.config import C_ROW_PAD, SUB_K
from kernels.sm90.dequant import exchange_half_step, half_step_vectors
from kernels.sm90.epilogue import STORERS
from kernels.sm90.fp4_bits import W_MAG_BITS, W_PAIRS, W_SIGNS, fragment_word
from kernels.sm90.grouped_gemm import Sm90GroupedGemm
from kernels.sm90.offsets import Sm90OffsetsGemm
from kernels.sm90.ptx import ld_shared_v4, prmt, select_bits, shl, st_global_v4
from kernels.sm90.staging import PAIR_SEND, PAIR_STORES, pair_store_offset
from kernels.sm90.structure import PACKED_ROW_BYTES, SUB_STEPS

# The variant a build worker compiles (set by diag_build.py, inherited by the workers).
ENV_VARIANT = "NVFP4_DIAG_VARIANT"


# ---------------------------------------------------------------- the weights' conversion
class _NoConv:
    """Weight words go to the wgmma fragments unconverted (loads kept): follows
    WeightFragments._convert_b_step."""

    @cute.jit
    def _convert_b_step(self, words, loaded) -> None:
        both = self._row_scales(loaded)
        for half in cutlass.range_constexpr(2):
            lo, hi, _ = loaded[half]
            d_lo = [lo ^ both, lo, lo, lo]
            d_hi = [hi ^ both, hi, hi, hi]
            for q in cutlass.range_constexpr(4):
                words[fragment_word(q, half, 0)] = d_lo[q]
                words[fragment_word(q, half, 1)] = d_hi[q]


def _dequant_word_xor(w, scales) -> list:
    """dequant.dequant_word_w with its scale multiplies (HMUL2) made XORs (the integer pipe)."""
    w = Uint32(w)
    signs = w & Uint32(W_SIGNS)
    even = select_bits(w << Uint32(1), shl(signs, 4), Uint32(W_MAG_BITS))
    odd = select_bits(w >> Uint32(3), signs, Uint32(W_MAG_BITS))
    sources = (even, odd)
    return [prmt(sources[src], Uint32(0), Uint32(sel)) ^ Uint32(scales) for src, sel in W_PAIRS]


class _NoHmul:
    """The conversion's scale multiplies become XORs: the same instruction count, no fp16
    math next to the wgmma. Follows WeightFragments._convert_b_step."""

    @cute.jit
    def _convert_b_step(self, words, loaded) -> None:
        both = self._row_scales(loaded)
        for half in cutlass.range_constexpr(2):
            lo, hi, _ = loaded[half]
            d_lo = _dequant_word_xor(lo, both)
            d_hi = _dequant_word_xor(hi, both)
            for q in cutlass.range_constexpr(4):
                words[fragment_word(q, half, 0)] = d_lo[q]
                words[fragment_word(q, half, 1)] = d_hi[q]


class _NoLds:
    """The conversion reads no shared memory: its words are made from their addresses (the
    wgmmas still read A from shared memory). Follows WeightFragments._load_b_step."""

    @cute.jit
    def _load_b_step(self, ct, s: cutlass.Constexpr, packed, scales, scale_row0) -> tuple:
        t = ct % 128
        c = t % 4
        row0 = (ct // 128) * 64 + (t // 32) * 16 + (t % 32) // 4
        loaded = []
        for half in cutlass.range_constexpr(2):
            base = packed + (row0 + 8 * half) * PACKED_ROW_BYTES
            lo = Uint32(base + 8 * c) ^ Uint32(0x12345678 + s)
            hi = Uint32(base + 8 * c) ^ Uint32(0x2468ACE1 + s)
            loaded.append((lo, hi, Uint32(scales) ^ Uint32(0x38 + half)))
        return tuple(loaded)


# ---------------------------------------------------------------- the MMA
class _NoGuard:
    """No wgmma left (or only empty commit groups): compile_kernel's async-wgmma check would
    reject the build."""

    REQUIRE_ASYNC_WGMMA = False


class _NoMma(_NoGuard):
    """No wgmma: each step's converted fragment is folded into one accumulator element, so
    the conversion stays live."""

    @cute.jit
    def _step_mma(self, mma, s: cutlass.Constexpr, slot) -> None:
        sink = Uint32(0)
        for i in cutlass.range_constexpr(cute.size(mma.words_w[s % 2])):
            sink = sink ^ mma.words_w[s % 2][i]
        mma.acc[0] = mma.acc[0] + Float32(sink & Uint32(1))


class _Mma2x:
    """Every step's wgmmas issued twice: the MMA work doubled, the conversion not."""

    @cute.jit
    def _step_mma(self, mma, s: cutlass.Constexpr, slot) -> None:
        super(_Mma2x, self)._step_mma(mma, s, slot)  # noqa: UP008
        super(_Mma2x, self)._step_mma(mma, s, slot)  # noqa: UP008


class _Wait0:
    """Each warpgroup waits for its own step's wgmma before converting the next step: the
    step's group is committed and retired here, the loop's own commit then adds an empty one."""

    @cute.jit
    def _step_mma(self, mma, s: cutlass.Constexpr, slot) -> None:
        super(_Wait0, self)._step_mma(mma, s, slot)  # noqa: UP008
        warpgroup.commit_group()
        warpgroup.wait_group(0)


class _SyncOnly(_NoGuard):
    """Waits and releases only: no conversion, no MMA."""

    @cute.jit
    def _step_mma(self, mma, s: cutlass.Constexpr, slot) -> None:
        pass

    @cute.jit
    def _dequant_b_fragment(self, words, ct, s: cutlass.Constexpr, packed, scales,
                            scale_row0=0) -> None:
        pass


# ---------------------------------------------------------------- the pipelines
class _HalfA:
    """The fp16 A TMA box has tile_m / 2 rows: the L2 traffic of a 2-CTA multicast."""

    def _a16_load_rows(self) -> int:
        return self.tile_m // 2

    def _a16_slot_layout(self):
        return cute.slice_(sm90_utils.make_smem_layout_b(
            LayoutEnum.ROW_MAJOR, (self.tile_n, self.tile_m // 2, SUB_K), Float16, 1),
            (None, None, 0))


class _NoProducerTiles:
    """The producer takes no tile and loads no weights ahead (its tail then waits on
    nothing)."""

    @cute.jit
    def _first_tile_prefetch(self, cta, start) -> tuple:
        return Int32(-1), Int32(0)

    @cute.jit
    def _producer_tiles_ahead(self, mainloop, ws, cta, b_state, a_state, pre, prev_group,
                              progress=None) -> tuple:
        return b_state, a_state


class _ConsumerNoSync:
    """The consumers neither wait nor release: conversion and MMA on stale data. Follows
    StagedA._k_loop (without the trace stamps)."""

    @cute.jit
    def _k_loop(self, mma, b_state, a_state, prev_slot, kb, ke, scale_row0, ct,
                trace=None) -> tuple:
        mma.acc.fill(0.0)
        mma.tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        for kt in cutlass.range(kb, ke, unroll=1):  # noqa: B007 - the DSL loop counts K tiles; the body uses its state
            stage = b_state.index
            stage_b = mma.packed_b + stage * (self.tile_n * PACKED_ROW_BYTES)
            stage_s = mma.scale_b + stage * self.sfb_stage_bytes
            for s in cutlass.range_constexpr(SUB_STEPS):
                self._dequant_b_fragment(mma.words_w[s % 2], ct, s, stage_b, stage_s,
                                         scale_row0)
                slot = a_state.index
                warpgroup.fence()
                self._step_mma(mma, s, slot)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
                prev_slot = slot
                a_state.advance()
            b_state.advance()
        warpgroup.wait_group(0)
        return b_state, a_state, prev_slot


class _NoConsumerTiles:
    """Neither the consumers nor the storers take a tile (nor meet at a hand-over)."""

    @cute.jit
    def _consumer_a16(self, mainloop, cta, ct) -> None:
        pass

    @cute.jit
    def _store_tiles(self, storage, cta, st) -> None:
        pass


class _NoGridBarrier:
    @cute.jit
    def _grid_barrier(self, barrier, grid, seen) -> None:
        pass


class _NoStaging:
    @cute.jit
    def _stage_a(self, cta, a16_base, tidx) -> None:
        pass


class _NoStagingFence:
    """The staging's closing proxy fence dropped (stream_a: after each iteration)."""

    def _publish_staged(self) -> None:
        pass


class _StageNoStore:
    """Staging without its stores (loads and conversion kept: the check on a converted word
    is false at run time, so the compiler keeps the conversion). Follows
    StagedA._store_chunks."""

    @cute.jit
    def _store_chunks(self, words, scales, dsts, valid, odd, tidx) -> None:
        for u in cutlass.range_constexpr(len(words)):
            vector = half_step_vectors(*exchange_half_step(words[u], scales[u], tidx % 2))
            vec = {f"v{q}": vector(q) for q in range(4)}
            for r in cutlass.range_constexpr(2):
                even_sends, odd_sends = PAIR_SEND[0][r], PAIR_SEND[1][r]
                vec[f"r{r}"] = [cute.arch.shuffle_sync_bfly(
                    select_bits(vec[odd_sends][w], vec[even_sends][w], odd), 1)
                    for w in range(4)]
            if valid(u) and vec["v0"][0] == Uint32(0x12345678):
                for i in cutlass.range_constexpr(4):
                    even_v, odd_v = PAIR_STORES[0][i][1], PAIR_STORES[1][i][1]
                    st_global_v4(dsts[u] + Int64(pair_store_offset(i, tidx % 2)),
                                 *[select_bits(vec[odd_v][w], vec[even_v][w], odd)
                                   for w in range(4)])


class _NoCStore:
    """The whole loop without the epilogue's C stores: the consumers still hand each tile
    over, the storers skip the global stores. Follows StagedA._store_tiles."""

    @cute.jit
    def _store_tiles(self, storage, cta, st) -> None:
        sizes, ptrs, prefix = cta.sizes, cta.ptrs, cta.prefix
        total_tiles, bidx, grid = cta.total_tiles, cta.bidx, cta.grid
        c_free, c_full = self._c_barriers()
        base = storage.c_tile.data_ptr().toint()
        row_bytes = (self.tile_n + C_ROW_PAD) * 2
        vecs = self.tile_n // 8
        ahead = self._post_next_tile(storage, cta, bidx + grid, Int32(0), st)
        group = Int32(0)
        if bidx < total_tiles:
            group = self._post_tile_scale(storage, cta, bidx, group, st)
            c_free.arrive_and_wait()
        tile = bidx
        while tile < total_tiles:
            group, m, n, _ = self._group_of(tile, group, prefix, sizes)
            tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
            row0 = tile_m_idx * self.tile_m
            col0 = tile_n_idx * self.tile_n
            c_address = ptrs[group, tables.PTR_C]
            c_full.arrive_and_wait()
            ahead = self._post_next_tile(storage, cta, tile + 2 * grid, ahead, st)
            for v in cutlass.range(st, self.tile_m * vecs, STORERS, unroll=4):
                r = v // vecs
                c8 = (v - r * vecs) * 8
                if row0 + r < 0:
                    words = ld_shared_v4(base + r * row_bytes + c8 * 2)
                    st_global_v4(c_address + (Int64(row0 + r) * Int64(n) + Int64(col0 + c8)) * 2,
                                 *words)
            tile += grid
            if tile < total_tiles:
                group = self._post_tile_scale(storage, cta, tile, group, st)
                c_free.arrive_and_wait()


class _Bare(_NoGuard):
    """The kernel returns after its smem check: the launch alone."""

    @cute.jit
    def _kernel_a16(self, atoms, storage, tables_, workspace, grid_barrier, tidx,
                    warp_idx) -> None:
        pass


# ---------------------------------------------------------------- stream_a builds
class _SaNoWait:
    """The producer never waits for staged A."""

    @cute.jit
    def _wait_stage_a(self, progress, ready, row_end, kt, grid) -> Int32:
        return ready


class _SaNoStage:
    """No staging at all: the tile loop alone, as if A were staged for free (nobody waits for
    counts that never come)."""

    @cute.jit
    def _stage_streamed(self, cta, lane_tables, a16_base, bank, st) -> None:
        pass

    @cute.jit
    def _await_staged(self, bank, need, iterations, grid) -> Int32:
        return iterations


class _SaStorersFirst:
    """The consumers start only when the stagers are done (named barrier 7), so the storers
    reach the C tile's first hand-over before the consumers: a racecheck probe of the
    hand-over with correct results, not a speed variant."""

    @cute.jit
    def _stage_streamed(self, cta, lane_tables, a16_base, bank, st) -> None:
        shipped = super(_SaStorersFirst, self)  # noqa: UP008
        shipped._stage_streamed(cta, lane_tables, a16_base, bank, st)
        cute.arch.barrier(barrier_id=7, number_of_threads=STORERS + self.consumer_threads)

    @cute.jit
    def _consumer_a16(self, mainloop, cta, ct) -> None:
        cute.arch.barrier(barrier_id=7, number_of_threads=STORERS + self.consumer_threads)
        super(_SaStorersFirst, self)._consumer_a16(mainloop, cta, ct)  # noqa: UP008


_NO_TILES = (_NoProducerTiles, _NoConsumerTiles)
_STAGE_ONLY = (*_NO_TILES, _NoGridBarrier)
# Variant name -> the parts it overrides (diag_build.VARIANTS describes each).
PARTS: dict[str, tuple[type, ...]] = {
    "noconv": (_NoConv,),
    "nomma": (_NoMma,),
    "half_a": (_HalfA,),
    "compute_only": (_NoProducerTiles, _ConsumerNoSync),
    "sync_only": (_SyncOnly,),
    "phase1_only": _NO_TILES,
    "stage_only": _STAGE_ONLY,
    "empty": (*_STAGE_ONLY, _NoStaging),
    "bare": (_Bare,),
    "stage_nofence": (*_STAGE_ONLY, _NoStagingFence),
    "stage_nostore": (*_STAGE_ONLY, _StageNoStore),
    "nostore": (_NoCStore,),
    "mma2x": (_Mma2x,),
    "wait0": (_Wait0,),
    "nohmul": (_NoHmul,),
    "nolds": (_NoLds,),
    "sa_nowait": (_SaNoWait,),
    "sa_nostore": (_SaNoWait, _StageNoStore),
    "sa_nofence": (_NoStagingFence,),
    "sa_nostage": (_SaNoWait, _SaNoStage),
    "sa_storers_first": (_SaStorersFirst,),
}


def variant_class(name: str, base: type[Sm90GroupedGemm] = Sm90GroupedGemm
                  ) -> type[Sm90GroupedGemm]:
    """The shipped kernel `base` (the list kernel, or Sm90OffsetsGemm for a serving set) with
    variant `name`'s parts overriding its roles."""
    if name not in PARTS:
        raise ValueError(f"variant must be one of {sorted(PARTS)}, but got {name!r}")
    return type(f"Sm90Diag_{name}", (*PARTS[name], base), {})


def overrides(name: str) -> list[str]:
    """The shipped methods (and class attributes) variant `name` replaces."""
    return sorted({attr for part in PARTS[name] for klass in part.__mro__[:-1]
                   for attr in vars(klass) if not attr.startswith("__")})


def compile_kernel(config, *, arch: str, groups):
    """The build worker's entry (diag_families.py): the variant named by NVFP4_DIAG_VARIANT."""
    base = Sm90OffsetsGemm if config.device_offsets else Sm90GroupedGemm
    return sm90_compile.compile_kernel(config, arch=arch, groups=groups,
                                       kernel_class=variant_class(os.environ[ENV_VARIANT], base))
