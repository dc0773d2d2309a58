"""Diagnostic builds of the sm_90a v3 kernel: each removes one part of the tile loop, so a
bench run shows what that part costs. Their results are WRONG by design; never serve them.

    python bench/diag_build.py VARIANT --spec SPEC.yaml --out DIR [-j N]
    # then on the GPU: python bench/bench_grouped.py --artifacts DIR --no-baselines

The repository's tracked files are copied to a scratch directory, the variant's edits are
applied to the kernel's files under kernels/sm90 there (each edit must match exactly once, so a
kernel change that moves the code makes this fail loudly instead of building something else), and
build_kernels.py runs in that copy. Variants (bench/RESULTS.md, 2026-11-30, has runs of the
first three):
  noconv        weight words go to the wgmma fragments unconverted (loads kept)
  nomma         no wgmma; the converted fragments are folded into one live register
  half_a        the fp16 A TMA box has tile_m / 2 rows: the L2 traffic of a 2-CTA multicast
  compute_only  no TMA and no pipeline waits or releases: conversion and MMA on stale data
  sync_only     waits and releases only: no conversion, no MMA
  phase1_only   no tiles: A staging, the grid barrier and the launch alone
  stage_only    no tiles, no grid barrier: A staging and the launch
  empty         no tiles, no barrier, no staging: the launch, setup and teardown
  bare          the kernel returns after its smem check: the launch alone (empty minus bare
                is the setup and teardown: barriers, descriptor templates, first weight loads)
  stage_nofence stage_only without the staging's closing proxy fence
  stage_nostore stage_only without the staging's stores (loads and conversion kept)
  nostore       the whole loop without the epilogue's C stores
  mma2x         every step's wgmmas issued twice (the MMA work doubled, the conversion not)
  wait0         each warpgroup waits for its own step's wgmma before converting the next step
                (no overlap of a warpgroup's conversion with its own MMA; other warpgroups'
                still can)
  nohmul        the conversion's scale multiplies (HMUL2, the fp16 FMA pipe) become XORs (the
                integer pipe): the same instruction count, no fp16 math next to the wgmma
  nolds         the conversion reads no shared memory: its weight and scale words are made
                from their addresses (the wgmmas still read A from shared memory)
  sa_nowait     (stream_a builds) the producer never waits for staged A
  sa_nostore    sa_nowait, and the stagers store nothing (loads and conversion kept)
  sa_nofence    the stagers' proxy fence after each iteration dropped (the producer's kept)
  sa_nostage    no staging at all: the tile loop alone, as if A were staged for free
  sa_storers_first  the consumers start after the stagers (a racecheck probe, correct results)

mma2x and wait0 tell apart why conversion and MMA add up on dense_a (RESULTS.md, eighth
session): if a warpgroup's conversion already waits for its own wgmma, wait0 costs nothing;
if the MMA runs under the conversion, mma2x costs little; if they contend for a shared
resource (the register file the register-sourced wgmma reads and its accumulator lives in),
mma2x costs about the MMA's own time again and wait0 costs little; if nohmul is much faster
than the default, the fp16 multiplies are what competes with the tensor core. mma2x also
doubles the wgmmas' shared-memory reads; nolds removes the conversion's, so it tells shared
memory apart from the register file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SM90 = Path("kernels/sm90")
MAIN, STAGED, WEIGHTS, DEQUANT = "grouped_gemm.py", "staged.py", "weights.py", "dequant.py"
STREAMED = "streamed.py"

# Edits are (file under kernels/sm90, old text, new text). The build guard must not reject a
# diagnostic build: nomma and sync_only leave only empty wgmma commit groups, which look
# serialized.
_NO_GUARD = (MAIN, ('    require_async_wgmma(cubin, symbols[0], "fewer accumulators or fragments '
                    'per thread")\n'), "")
_NOMMA = [
    (STAGED, '''                warpgroup.fence()
                for kblk in cutlass.range_constexpr(num_kblocks):
                    cute.gemm(tiled_mma, acc, frag_w[s % 2][None, None, kblk],
                              frag_a[None, None, kblk, slot], acc)''',
     '''                warpgroup.fence()
                for i in cutlass.range_constexpr(cute.size(words_w[s % 2])):
                    sink = sink ^ words_w[s % 2][i]'''),
    (STAGED, '''        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        for kt in cutlass.range(kb, ke, unroll=1):''',
     '''        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        sink = Uint32(0)
        for kt in cutlass.range(kb, ke, unroll=1):'''),
    (STAGED, '''        a_pipe.consumer_release(_Slot(prev_slot))
        return b_state, a_state, prev_slot''',
     '''        a_pipe.consumer_release(_Slot(prev_slot))
        acc[0] = acc[0] + Float32(sink & Uint32(1))
        return b_state, a_state, prev_slot'''),
]
# stream_a builds (the spec must set it): the producer never waits for staged A.
_SA_NOWAIT = (STREAMED, """        if need >= ready:
            ready = self._await_staged(bank, need, iterations, grid)
""", "")
_CONSUMER_SYNC = [
    (STAGED, "            b_pipe.consumer_wait(b_state)\n", ""),
    (STAGED, ("                    b_pipe.consumer_release(b_state)  # the weights are in "
              "registers now\n"), "                    pass\n"),
    (STAGED, "                a_pipe.consumer_wait(a_state)\n", ""),
    (STAGED, ("                if cutlass.const_expr(s > 0):\n"
              "                    a_pipe.consumer_release(_Slot(prev_slot))\n"
              "                else:\n"
              "                    if kt > kb:\n"
              "                        a_pipe.consumer_release(_Slot(prev_slot))\n"), ""),
    (STAGED, ("        warpgroup.wait_group(0)\n"
              "        a_pipe.consumer_release(_Slot(prev_slot))\n"),
     "        warpgroup.wait_group(0)\n"),
]
# The head of each role's tile loop in staged.py.
_PRODUCER_TILES = '''            group, m, _, k = self._group_of(bidx, group, prefix, sizes)
        tile = bidx
        while tile < total_tiles:'''
_CONSUMER_TILES = '''        prev_slot = Int32(0)
        group = Int32(0)
        tile = bidx
        # The storers write C'''
# The storer warps walk the tiles too; without tiles they must not wait for one,
# nor meet the consumers at the first hand-over (no consumer comes).
_STORER_TILES = '''            c_free.arrive_and_wait()
        tile = bidx
'''
_STAGING = "            self._stage_a(sizes, ptrs, num_groups, a16_base, tidx - 32, bidx, grid)\n"
# The producer's weight loads before the grid barrier (first tile): off whenever it takes no tile.
_PREFETCH = "        if bidx < total_tiles:\n            group, _, _, k = self._group_of("
_NO_PREFETCH = (STAGED, _PREFETCH, _PREFETCH.replace("bidx < total_tiles", "bidx < 0"))
_GRID_BARRIER = '''        if tidx == 32:
            self._grid_barrier(grid_barrier.toint(), grid, seen)
'''
_STAGING_END = '''            c += STAGE_UNROLL * stride
        fence_proxy_async_global()
'''
# Neither role takes a tile (and the producer loads no weights ahead), or no grid barrier.
_NO_PRODUCER_TILES = (STAGED, _PRODUCER_TILES,
                      _PRODUCER_TILES.replace("tile = bidx", "tile = total_tiles"))
_NO_TILES = [_NO_PRODUCER_TILES, _NO_PREFETCH,
             (STAGED, _CONSUMER_TILES, _CONSUMER_TILES.replace("tile = bidx", "tile = total_tiles")),
             (STAGED, _STORER_TILES, _STORER_TILES.replace("tile = bidx", "tile = total_tiles")
              .replace("            c_free.arrive_and_wait()\n", "            pass\n"))]
_NO_BARRIER = (STAGED, _GRID_BARRIER, "")
_STEP_MMA = '''                for kblk in cutlass.range_constexpr(num_kblocks):
                    cute.gemm(tiled_mma, acc, frag_w[s % 2][None, None, kblk],
                              frag_a[None, None, kblk, slot], acc)
'''
# dequant_word_w's last step: each pair times its scale (HMUL2), or XORed with it instead.
_SCALE_MUL = ("    return [mul_f16x2_by_half(prmt(sources[src], Uint32(0), Uint32(sel)), "
              "scales, half)\n")
_SCALE_XOR = "    return [prmt(sources[src], Uint32(0), Uint32(sel)) ^ Uint32(scales)\n"
VARIANTS: dict[str, list[tuple[str, str, str]]] = {
    "noconv": [
        (WEIGHTS, '''        d_lo = dequant_word_w(lo, both, 0)
        d_hi = dequant_word_w(hi, both, 1)''',
         '''        d_lo = [lo ^ both, lo, lo, lo]
        d_hi = [hi ^ both, hi, hi, hi]'''),
    ],
    "nomma": [*_NOMMA, _NO_GUARD],
    "half_a": [
        (MAIN, '''            atom_a, _ = cpasync.make_tiled_tma_atom(op, a16_ph, a16_smem, (tile_m, SUB_K))''',
         '''            a16_smem = cute.slice_(sm90_utils.make_smem_layout_b(
                LayoutEnum.ROW_MAJOR, (tile_n, tile_m // 2, SUB_K), Float16, 1), (None, None, 0))
            atom_a, _ = cpasync.make_tiled_tma_atom(op, a16_ph, a16_smem,
                                                    (tile_m // 2, SUB_K))'''),
        (STAGED, '''        a_pipe = self._tma_pipeline(storage.mbar_a, self.config.a_slots,
                                    self.tile_m * SUB_K * 2)''',
         '''        a_pipe = self._tma_pipeline(storage.mbar_a, self.config.a_slots,
                                    self.tile_m // 2 * SUB_K * 2)'''),
    ],
    # The producer takes no tile (its tail then waits on nothing) and the consumers neither
    # wait nor release, so no mbarrier phase can fall out of step.
    "compute_only": [_NO_PRODUCER_TILES, _NO_PREFETCH, *_CONSUMER_SYNC],
    # Staging, grid barrier and launch alone: neither role takes a tile.
    "phase1_only": _NO_TILES,
    # phase1_only without the grid barrier (the barrier's cost), and without staging too
    # (launch, setup and teardown alone).
    "stage_only": [*_NO_TILES, _NO_BARRIER],
    "empty": [*_NO_TILES, _NO_BARRIER, (STAGED, _STAGING, "            pass\n")],
    "bare": [
        (MAIN, """        if cutlass.const_expr(self.a_fp16):
            self._kernel_a16(""", """        if cutlass.const_expr(False):
            pass
        elif cutlass.const_expr(False):
            self._kernel_a16("""),
        (MAIN, """        else:
            self._kernel_v2(""", """        elif cutlass.const_expr(False):
            self._kernel_v2("""),
        _NO_GUARD,
    ],
    # stage_only's staging without its closing proxy fence, or without its stores.
    "stage_nofence": [*_NO_TILES, _NO_BARRIER,
                      (STAGED, _STAGING_END,
                       _STAGING_END.replace("        fence_proxy_async_global()\n", ""))],
    "stage_nostore": [*_NO_TILES, _NO_BARRIER,
                      (STAGED, "            if valid(u):\n",
                       "            if valid(u) and outs[0][0] == Uint32(0x12345678):\n")],
    # The whole loop, no C stores (the epilogue's cost): the consumers still hand each tile
    # over (the storers would wait forever otherwise) and the storers skip the global stores.
    "nostore": [
        (STAGED, "                if row0 + r < m and col0 + c8 < n:\n",
         "                if row0 + r < 0:\n"),
    ],
    "sa_nowait": [_SA_NOWAIT],
    "sa_nostore": [
        _SA_NOWAIT,
        (STREAMED, "self._store_chunks(words, scales, dsts, lambda u: c + u * stride < total,",
         "self._store_chunks(words, scales, dsts, lambda u: c + u * stride < 0,"),
    ],
    "sa_nofence": [(STREAMED,
                    "            fence_proxy_async_global()\n            cute.arch.sync_warp()",
                    "            cute.arch.sync_warp()")],
    # stream_a, the consumers start only when the stagers are done (named barrier 7), so the
    # storers reach the C tile's first hand-over before the consumers, as without stream_a: a
    # racecheck probe of the hand-over, not a speed variant.
    "sa_storers_first": [
        (STAGED, """                self._stage_streamed(lane_tables, num_groups, a16_base,
                                     self._progress_bank(header, epoch), tidx - 32, bidx, grid)
""", """                self._stage_streamed(lane_tables, num_groups, a16_base,
                                     self._progress_bank(header, epoch), tidx - 32, bidx, grid)
                cute.arch.barrier(barrier_id=7, number_of_threads=STORERS + self.consumer_threads)
"""),
        (STAGED, """                cute.arch.warpgroup_reg_alloc(split[1])
            self._consumer_a16(self._tiled_mma(), storage, b_pipe, a_pipe, sizes, ptrs, prefix,""",
         """                cute.arch.warpgroup_reg_alloc(split[1])
            cute.arch.barrier(barrier_id=7, number_of_threads=STORERS + self.consumer_threads)
            self._consumer_a16(self._tiled_mma(), storage, b_pipe, a_pipe, sizes, ptrs, prefix,"""),
    ],
    "sa_nostage": [
        _SA_NOWAIT,
        (STREAMED, "        for it in cutlass.range(iterations, unroll=1):",
         "        for it in cutlass.range(iterations * 0, unroll=1):"),
        (STREAMED, "        if iterations > 0:\n            self._await_staged",
         "        if iterations < 0:\n            self._await_staged"),
    ],
    "mma2x": [(STAGED, _STEP_MMA, _STEP_MMA + _STEP_MMA)],
    "nohmul": [(DEQUANT, _SCALE_MUL, _SCALE_XOR)],
    "nolds": [(WEIGHTS, """        lo = ld_shared_u32(base + (((2 * s) ^ (row % 8)) * 16) + 4 * c)
        hi = ld_shared_u32(base + (((2 * s + 1) ^ (row % 8)) * 16) + 4 * c)
        four = ld_shared_u32(scale_word_offset(row, s, self.scale_blocks, scale_row0,
                                               base=scales))
""", """        lo = Uint32(base + 4 * c) ^ Uint32(0x12345678 + s)
        hi = Uint32(base + 4 * c) ^ Uint32(0x2468ACE1 + s)
        four = Uint32(scales) ^ Uint32(0x38383838)
""")],
    "wait0": [(STAGED, "                warpgroup.wait_group(1)\n",
               "                warpgroup.wait_group(0)\n")],
    "sync_only": [
        (STAGED, '''                    self._dequant_b_fragment(words_w[s % 2], ct, s, stage_b, stage_s,
                                             scale_row0)
''', "                    pass\n"),
        (STAGED, '''                for kblk in cutlass.range_constexpr(num_kblocks):
                    cute.gemm(tiled_mma, acc, frag_w[s % 2][None, None, kblk],
                              frag_a[None, None, kblk, slot], acc)
''', ""),
        _NO_GUARD,
    ],
}


def patched(sources: dict[str, str], variant: str) -> dict[str, str]:
    """`sources` (file name under kernels/sm90 -> text) with the variant's edits; ValueError
    when one does not match exactly once."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, but got {variant!r}")
    out = dict(sources)
    for i, (name, old, new) in enumerate(VARIANTS[variant]):
        count = out[name].count(old)
        if count != 1:
            raise ValueError(f"{variant} edit {i} matches {count} places in {SM90 / name}, "
                             f"expected 1 (the kernel changed: update bench/diag_build.py): "
                             f"{old[:70]!r}")
        out[name] = out[name].replace(old, new)
    return out


def kernel_sources(root: Path) -> dict[str, str]:
    """The files the variants edit, by name."""
    return {name: (root / SM90 / name).read_text()
            for name in (MAIN, STAGED, WEIGHTS, DEQUANT, STREAMED)}


def copy_tree(dest: Path) -> None:
    """The repository's files as they are in the working tree: tracked ones, and untracked ones
    git does not ignore (a new kernel file must come along before it is committed)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(src.read_bytes())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant", choices=sorted(VARIANTS))
    ap.add_argument("--spec", required=True, type=Path, help="shapes.yaml-style spec (sm_90a)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix=f"nvfp4_diag_{args.variant}_") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        for name, text in patched(kernel_sources(tree), args.variant).items():
            (tree / SM90 / name).write_text(text)
        return subprocess.run([sys.executable, "build_kernels.py", "build", "--spec",
                               str(args.spec.resolve()), "--out", str(args.out.resolve()),
                               "-j", str(args.jobs)], cwd=tree, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
