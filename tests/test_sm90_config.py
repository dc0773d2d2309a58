"""The sm_90a kernel's build options: exact reasons for every rejected config, and the shared
memory each variant allocates (the kernel asserts the same number at trace time)."""

from __future__ import annotations

import pytest

from kernels.sm90.config import SMEM_LIMIT, Config, check, scale_blocks, smem_bytes


def test_default_is_v3_and_fits() -> None:
    c = Config()
    assert (c.a_fp16, c.w_regs, c.tile_m, c.stages, c.a_slots, c.w_prefetch) == (
        True, True, 128, 3, 8, False)
    assert check(c) == []
    # barriers 1 KiB + 3 x (16 KiB packed B + 2 KiB scales) + 8 x (128 rows x 64 K fp16)
    assert smem_bytes(c) == 1024 + 3 * 18432 + 8 * 16384 == 187392


def test_v2_smem_is_unchanged() -> None:
    assert smem_bytes(Config(a_fp16=False)) == 161792


def test_tile_n_192_fits_with_two_scale_blocks_per_stage() -> None:
    c = Config(tile_n=192)
    assert check(c) == []
    # barriers + 3 x (192 rows x 128 B packed + 2 x 2 KiB scales: a 192-row tile starts at row 0
    # or 64 of a 128-row scale block) + 8 x 16 KiB fp16 A
    assert smem_bytes(c) == 1024 + 3 * (24576 + 4096) + 8 * 16384 == 218112
    assert (scale_blocks(128), scale_blocks(192)) == (1, 2)


@pytest.mark.parametrize("kwargs, reason", [
    ({"a_fp16": True, "w_regs": False},
     "a_fp16 needs w_regs: true (weights in registers, A from shared memory)"),
    ({"a_slots": 1}, "a_slots must be in 2..32, but got 1"),
    ({"a_fp16": 1}, "a_fp16 must be true or false, but got 1"),
    ({"w_prefetch": "yes"}, "w_prefetch must be true or false, but got 'yes'"),
    ({"w_prefetch": True, "a_fp16": False},
     "w_prefetch needs a_fp16: true (only the staged-A kernel has it)"),
    ({"a_slots": 12},
     f"stages 3 with tile_m 128 and a_slots 12 needs 252928 bytes of shared memory, more than "
     f"the {SMEM_LIMIT} a Hopper CTA can use; lower stages or a_slots"),
    ({"tile_n": 192, "a_fp16": False},
     "tile_n 192 needs a_fp16: true (only the staged-A kernel has more than two consumer "
     "warpgroups)"),
    ({"tile_n": 256}, "tile_n must be one of [128, 192], but got 256"),
    ({"tile_n": 192, "a_slots": 9},
     f"stages 3 with tile_m 128, tile_n 192 and a_slots 9 needs 234496 bytes of shared memory, "
     f"more than the {SMEM_LIMIT} a Hopper CTA can use; lower stages or a_slots or tile_n"),
    ({"a_fp16": False, "stages": 5},
     f"stages 5 with tile_m 128 needs 235520 bytes of shared memory, more than the "
     f"{SMEM_LIMIT} a Hopper CTA can use; lower stages"),
])
def test_rejected_configs_say_why(kwargs, reason) -> None:
    assert check(Config(**kwargs)) == [reason]
