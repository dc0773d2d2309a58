"""inline_a (Config.inline_a, kernels/sm90/inline_a.py): which configs take it, and the byte
formulas its converter warps use, against phase 1's (staging.chunk_addresses) and the 128-byte
swizzle TMA writes the fp16 A ring with."""

from __future__ import annotations

import pytest
from conftest import NEEDS_DSL, compile_sm90

from kernels.sm90.config import INLINE_A_MAX_M, Config, check
from kernels.sm90.fp4_bits import position_vector
from kernels.sm90.staging import (
    A_CHUNK_K,
    chunk_addresses,
    inline_row_offsets,
    inline_smem_offset,
    inline_step_offsets,
)


def test_inline_a_takes_device_offsets_decode_tiles_only() -> None:
    assert check(Config(device_offsets=True, inline_a=True, tile_m=16, tile_n=256)) == []
    assert check(Config(device_offsets=True, inline_a=True, tile_m=32, tile_n=192)) == []
    assert check(Config(inline_a=True, tile_m=16)) == [
        "inline_a needs device_offsets: true (the list kernels stage A in phase 1; give it on an "
        "experts: set)"]
    assert check(Config(device_offsets=True, inline_a=True, tile_m=64)) == [
        f"inline_a needs tile_m at most {INLINE_A_MAX_M} (a converter lane holds its chunks of "
        f"tile_m / 16 rows in registers), but got tile_m 64"]
    assert check(Config(device_offsets=True, inline_a=1, tile_m=16)) == [
        "inline_a must be true or false, but got 1"]



def step_of_chunk(chunk: int, scale: int, chunk_parity: int) -> tuple[int, int]:
    """(packed address, scale word address) of the 64-K step holding a chunk whose packed bytes
    start at `chunk` and whose first scale is at `scale` (chunk_addresses), of index parity
    `chunk_parity`: the even chunk's two scales come first in the step's word."""
    return chunk - chunk_parity * 16, scale - chunk_parity * 2


@pytest.mark.parametrize("k", [768, 2048, 2880, 7168])
def test_row_and_step_offsets_sum_to_phase_1s_addresses(k: int) -> None:
    """The converter's (packed, scale word) source of row r, 64-K step ks is phase 1's for
    either chunk of that step (step_of_chunk): split into the per-tile row term and the
    per-step term."""
    per_row = k // A_CHUNK_K
    for row in (0, 1, 15, 31, 32, 127, 128, 129, 300, 511):
        for kc in range(per_row):
            src, sf, _ = chunk_addresses(row * per_row + kc, 0, k, lambda: (0, 0, 0))
            (a_row, sf_row), (a_ks, sf_ks) = (inline_row_offsets(row, k),
                                              inline_step_offsets(kc // 2))
            assert (a_row + a_ks, sf_row + sf_ks) == step_of_chunk(src, sf, kc % 2), (row, kc)


@pytest.mark.parametrize("tile_m", [16, 32])
def test_smem_offsets_are_tmas_swizzled_box(tile_m: int) -> None:
    """Chunk h, vector q of row r lands where a 128B-swizzled TMA box of the staged fp16 row
    puts it: the staged row's 16-byte vector 4 h + q at byte 16 (c ^ (r % 8)) of row
    r's 128 bytes; every byte of the slot is written exactly once. (Lane h of a row converts
    the words of parity h, which fill vectors 4 h..4 h + 3: fp4_bits.position_vector.)"""
    seen = set()
    for r in range(tile_m):
        for h in range(2):
            for q in range(4):
                c = position_vector(h, q)  # phase 1's vector in the staged row
                linear = r * 128 + 16 * c  # where TMA reads it from in the box
                swizzled = linear ^ (((linear >> 7) & 7) << 4)  # SWIZZLE_128B
                offset = inline_smem_offset(r, h, q)
                assert offset == swizzled
                seen.add(offset)
    assert seen == set(range(0, tile_m * 128, 16))


@NEEDS_DSL
@pytest.mark.parametrize("tile_m, tile_n", [(16, 256), (16, 192), (32, 256), (32, 192)])
def test_inline_a_register_split_is_the_configs(tile_m: int, tile_n: int) -> None:
    """The setmaxnreg split an inline_a kernel gets (fits: the module-level assert)."""
    from kernels.sm90.staged import INLINE_A_SPLITS, StagedA
    kernel = StagedA.__new__(StagedA)
    kernel.config = Config(device_offsets=True, inline_a=True, tile_m=tile_m, tile_n=tile_n)
    kernel.tile_m, kernel.consumer_threads = tile_m, tile_n * 2
    assert kernel._register_split() == INLINE_A_SPLITS[(tile_m, tile_n // 64)]


INLINE_SCRIPT = """
import re
out = {}
for tile_m, tile_n in ((16, 256), (32, 256), (32, 192)):
    k = compile_kernel(Config(tile_m=tile_m, tile_n=tile_n, out_dtype="bfloat16",
                              device_offsets=True, inline_a=True),
                       arch="sm_90a", groups=[(4096, 3072)] * 4)
    out[f"{tile_m}.{tile_n}"] = {
        "grid_barrier_atoms": len(re.findall(r"atom\\.add\\.acq_rel\\.gpu", k.ptx)),
        "fp16_a_tma": len(re.findall(r"cp\\.async\\.bulk\\.tensor\\.2d", k.ptx)),
        "st_shared_v4": len(re.findall(r"st\\.shared\\.v4\\.b32", k.ptx)),
        "fence_async_shared": len(re.findall(r"fence\\.proxy\\.async\\.shared::cta", k.ptx)),
        "wgmma_n": sorted(set(re.findall(r"m64n(\\d+)k16", k.ptx))),
        "a_bytes": k.tables["tensormap_workspace"].get("bytes_per_a_element", 0)}
print(json.dumps(out))
"""


@NEEDS_DSL
def test_inline_a_builds_past_the_guards_without_phase_1() -> None:
    """An inline_a kernel compiles past compile_kernel's guards (no stack frame, asynchronous
    wgmma) at every decode tile, has no grid barrier (no acq_rel atomic) and loads only weights
    and their scales by TMA (the 2-D weight box: the fp16 A box is never loaded); its converter
    stores to shared memory and fences them for the async proxy. Shipped on 10 sets and
    GPU-checked there (docs/lab_notebook.md, twenty-second session)."""
    out = compile_sm90(INLINE_SCRIPT)
    for key, got in out.items():
        assert got["grid_barrier_atoms"] == 0, key
        assert got["fence_async_shared"] >= 1, key
        assert got["st_shared_v4"] >= 4, key
        assert got["wgmma_n"] == [key.split(".")[0]], key
        assert got["a_bytes"] == 0, key  # no phase 1: no fp16 A area in the workspace
