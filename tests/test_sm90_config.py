"""The sm_90a kernel's build options: exact reasons for every rejected config, and the shared
memory each variant allocates (the kernel asserts the same number at trace time)."""

from __future__ import annotations

import pytest

from kernels.sm90.config import SMEM_LIMIT, Config, check, smem_bytes


def test_default_is_v3_and_fits() -> None:
    c = Config()
    assert (c.a_fp16, c.w_regs, c.tile_m, c.stages, c.a_slots) == (True, True, 128, 3, 8)
    assert check(c) == []
    # barriers 1 KiB + 3 x (16 KiB packed B + 2 KiB scales) + 8 x (128 rows x 64 K fp16)
    assert smem_bytes(c) == 1024 + 3 * 18432 + 8 * 16384 == 187392


def test_v2_smem_is_unchanged() -> None:
    assert smem_bytes(Config(a_fp16=False)) == 161792


@pytest.mark.parametrize("kwargs, reason", [
    ({"a_fp16": True, "w_regs": False},
     "a_fp16 needs w_regs: true (weights in registers, A from shared memory)"),
    ({"a_slots": 1}, "a_slots must be in 2..32, but got 1"),
    ({"a_fp16": 1}, "a_fp16 must be true or false, but got 1"),
    ({"a_slots": 12},
     f"stages 3 with tile_m 128 and a_slots 12 needs 252928 bytes of shared memory, more than "
     f"the {SMEM_LIMIT} a Hopper CTA can use; lower stages or a_slots"),
    ({"a_fp16": False, "stages": 5},
     f"stages 5 with tile_m 128 needs 235520 bytes of shared memory, more than the "
     f"{SMEM_LIMIT} a Hopper CTA can use; lower stages"),
])
def test_rejected_configs_say_why(kwargs, reason) -> None:
    assert check(Config(**kwargs)) == [reason]
