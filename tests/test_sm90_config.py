"""The sm_90a kernel's build options: exact reasons for every rejected config, and the shared
memory each variant allocates (the kernel asserts the same number at trace time)."""

from __future__ import annotations

import pytest
from conftest import NEEDS_DSL

from kernels.sm90.config import (
    C_ROW_PAD,
    LANE_GROUPS,
    SMEM_LIMIT,
    Config,
    c_tile_bytes,
    can_implement,
    check,
    check_groups,
    launch_registers,
    register_split_fits,
    scale_blocks,
    smem_bytes,
)


def test_default_is_the_shipped_v3_and_fits() -> None:
    """Config()'s defaults are the kernel shapes.yaml ships for sm_90a (its defaults.options)."""
    c = Config()
    assert (c.tile_m, c.tile_n, c.stages, c.a_slots, c.w_prefetch, c.stream_a) == (
        128, 128, 3, 8, False, False)
    assert (c.async_epilogue, c.patch_ahead) == (True, True)
    assert check(c) == []
    # barriers 1 KiB + 3 x (16 KiB packed B + 2 KiB scales) + 8 x (128 rows x 64 K fp16)
    # + the C tile (128 rows of 128 + 8 fp16)
    assert smem_bytes(c) == 1024 + 3 * 18432 + 8 * 16384 + 34816 == 222208


def test_tile_n_192_fits_with_two_scale_blocks_per_stage() -> None:
    c = Config(tile_n=192, a_slots=5)
    assert check(c) == []
    # barriers + 3 x (192 rows x 128 B packed + 2 x 2 KiB scales: a 192-row tile starts at row 0
    # or 64 of a 128-row scale block) + 5 x 16 KiB fp16 A + the 128 x (192 + 8) fp16 C tile
    assert smem_bytes(c) == 1024 + 3 * (24576 + 4096) + 5 * 16384 + 51200 == 220160
    assert (scale_blocks(128), scale_blocks(192)) == (1, 2)


def test_async_epilogue_adds_a_padded_c_tile() -> None:
    """tile_m rows of tile_n + C_ROW_PAD fp16, 1024-aligned after the A ring: 128 x 192 fits
    only with a_slots 5 (shapes.yaml's MoE sets)."""
    c = Config()
    assert c_tile_bytes(c) == 128 * (128 + C_ROW_PAD) * 2 == 34816
    assert smem_bytes(c) == 187392 + 34816 and check(c) == []
    moe = Config(tile_n=192, a_slots=5)
    assert smem_bytes(moe) == 1024 + 3 * (24576 + 4096) + 5 * 16384 + 51200 == 220160
    assert check(moe) == []
    assert check(Config(tile_n=192)) == [
        f"stages 3 with tile_m 128, tile_n 192 and a_slots 8 needs 269312 bytes of shared "
        f"memory, more than the {SMEM_LIMIT} a Hopper CTA can use; lower stages or a_slots or "
        f"tile_n (its C tile takes 51200 bytes)"]
    dense = Config(tile_m=64, tile_n=192)  # 64 x 200 fp16: 25 KiB exactly
    assert smem_bytes(dense) == 1024 + 3 * (24576 + 4096) + 8 * 8192 + 25600


@NEEDS_DSL
def test_patch_ahead_adds_one_descriptor_set() -> None:
    """Patching one tile ahead keeps one more set in the rotation than the rings need: the
    workspace per CTA (recorded in the manifest) holds one more set of 4 maps."""
    from kernels.sm90.grouped_gemm import Sm90GroupedGemm
    from kernels.sm90.tma import sets_needed

    ring = 3  # stages 3; a_slots 8 are 2 stages of A
    assert Sm90GroupedGemm(Config()).desc_sets == sets_needed(ring + 1) == 5
    ring = 4  # a_slots 16 are 4 stages of A, more than the 3 weight stages
    assert Sm90GroupedGemm(Config(tile_m=64, a_slots=16)).desc_sets == sets_needed(ring + 1) == 6


def test_tile_m_256_fits_with_three_a_slots() -> None:
    """bench_large's kernel: 256 rows x 64 K of fp16 A per slot, and a 256-row C tile."""
    c = Config(tile_m=256, tile_n=128, a_slots=3)
    assert check(c) == []
    assert c_tile_bytes(c) == 256 * (128 + C_ROW_PAD) * 2 == 69632
    assert smem_bytes(c) == 1024 + 3 * 18432 + 3 * 32768 + 69632 == 224256
    assert check(Config(tile_m=256, tile_n=128, a_slots=4)) == [
        f"stages 3 with tile_m 256 and a_slots 4 needs 257024 bytes of shared memory, more than "
        f"the {SMEM_LIMIT} a Hopper CTA can use; lower stages or a_slots (its C tile takes "
        f"69632 bytes)"]


def test_tile_m_112_fits_with_five_a_slots() -> None:
    """moe_down's kernel: 112 rows x 64 K of fp16 A per slot (14 KiB, so every slot stays
    1024-aligned for the 128-byte swizzle), and a 112-row C tile."""
    c = Config(tile_m=112, tile_n=192, a_slots=5, stream_a=True)
    assert check(c) == []
    assert c_tile_bytes(c) == 112 * (192 + C_ROW_PAD) * 2 == 44800
    assert smem_bytes(c) == 1024 + 3 * (192 * 128 + 2 * 2048) + 5 * 14336 + 45056 == 203776
    assert (112 * 64 * 2) % 1024 == 0


@pytest.mark.parametrize("kwargs, reason", [
    ({"tile_m": 256, "tile_n": 192, "a_slots": 2},
     "tile_m 256 needs tile_n 128 (two consumer warpgroups hold its accumulator), but got "
     "tile_n 192"),
    ({"tile_m": 104}, "tile_m must be one of [16, 32, 48, 64, 80, 96, 112, 128, 256], but got 104"),
    ({"tile_m": 24}, "tile_m must be one of [16, 32, 48, 64, 80, 96, 112, 128, 256], but got 24"),
    ({"patch_ahead": 1}, "patch_ahead must be true or false, but got 1"),
    ({"patch_ahead": False},
     "patch_ahead must be true (the kernel has no other path: patching at each tile's start "
     "was slower, docs/lab_notebook.md seventh session), but got false"),
    ({"async_epilogue": 1}, "async_epilogue must be true or false, but got 1"),
    ({"async_epilogue": False},
     "async_epilogue must be true (the kernel has no other path: its consumers' own C stores "
     "were slower, docs/lab_notebook.md sixth session), but got false"),
    ({"stream_a": 1}, "stream_a must be true or false, but got 1"),
    ({"stream_a": "yes"}, "stream_a must be true or false, but got 'yes'"),
    ({"stream_a": None}, "stream_a must be true or false, but got None"),
    ({"a_slots": 1}, "a_slots must be in 2..32, but got 1"),
    ({"w_prefetch": "yes"}, "w_prefetch must be true or false, but got 'yes'"),
    ({"a_slots": 12},
     f"stages 3 with tile_m 128 and a_slots 12 needs 287744 bytes of shared memory, more than "
     f"the {SMEM_LIMIT} a Hopper CTA can use; lower stages or a_slots (its C tile takes 34816 "
     f"bytes)"),
    ({"tile_n": 320}, "tile_n must be one of [128, 192, 256], but got 320"),
    ({"tile_n": 256},
     "tile_n 256 needs tile_m at most 64 (four consumer warpgroups get 104 registers each, "
     "room for a small accumulator only), but got tile_m 128"),
    ({"tile_n": 256, "tile_m": 32, "stream_a": True},
     "tile_n 256 needs stream_a: false (its stager warps need registers the four consumer "
     "warpgroups take)"),
    ({"tile_n": 192, "a_slots": 9},
     f"stages 3 with tile_m 128, tile_n 192 and a_slots 9 needs 285696 bytes of shared memory, "
     f"more than the {SMEM_LIMIT} a Hopper CTA can use; lower stages or a_slots or tile_n (its "
     f"C tile takes 51200 bytes)"),
])
def test_rejected_configs_say_why(kwargs, reason) -> None:
    assert check(Config(**kwargs)) == [reason]


def test_stream_a_is_off_by_default_and_costs_no_shared_memory() -> None:
    """Its progress counters live in the workspace header, not in shared memory."""
    assert Config().stream_a is False
    for kwargs in ({}, {"tile_n": 192, "a_slots": 5}, {"tile_m": 256, "tile_n": 128, "a_slots": 3}):
        on = Config(stream_a=True, **kwargs)
        assert check(on) == []
        assert smem_bytes(on) == smem_bytes(Config(**kwargs))


ONE_K = ("stream_a needs one k for all groups (it stages A in K order across groups), but the "
         "groups have k ")


@pytest.mark.parametrize("ks, reasons", [
    ([2048], []),
    ([2048, 2048], []),
    ([256] * LANE_GROUPS, []),  # one group per lane of a staging warp
    ([7168, 2048], [ONE_K + "[2048, 7168]"]),
    ([2048, 7168, 2048, 512], [ONE_K + "[512, 2048, 7168]"]),  # sorted, each k once
    ([256] * (LANE_GROUPS + 1),
     ["stream_a serves at most 32 groups (one per lane of a staging warp), but got 33"]),
    ([512] + [256] * 40,  # both, in this order
     [ONE_K + "[256, 512]",
      "stream_a serves at most 32 groups (one per lane of a staging warp), but got 41"]),
])
def test_stream_a_groups_need_one_k_and_at_most_32(ks: list[int], reasons: list[str]) -> None:
    assert LANE_GROUPS == 32
    assert check_groups(Config(stream_a=True), ks) == reasons


@pytest.mark.parametrize("ks", [[2048], [7168, 2048], [256] * 100, [512] + [256] * 40])
def test_without_stream_a_any_groups_do(ks: list[int]) -> None:
    assert check_groups(Config(), ks) == []


@pytest.mark.parametrize("config, ks", [
    (Config(), None), (Config(), [256, 512]), (Config(stream_a=True), [256, 512]),
    (Config(tile_m=7, stream_a=True), [256] * 40), (Config(tile_m=256, tile_n=192), [2048]),
])
def test_can_implement_is_check_then_check_groups(config: Config, ks: list[int] | None) -> None:
    """One legality function: the builder's two halves, in order, and nothing else."""
    whole = check(config) + ([] if ks is None else check_groups(config, ks))
    shapes = None if ks is None else [(64, 256, k) for k in ks]  # (m, n, k): only k matters
    assert can_implement(config, shapes) == whole
    assert can_implement(config, None if ks is None else [(256, k) for k in ks]) == whole


@pytest.mark.parametrize("warpgroups, producer, consumer, fits", [
    (3, 56, 152, True),   # the kernel's split: 128 at launch, 72 given up, 3 x 24 taken
    (3, 56, 160, False),  # one step more for the consumers than the producer gives up
    (2, 56, 224, True),   # tile_m 256: 168 at launch, 112 given up, 2 x 56 taken
    (2, 64, 224, False),
    (4, 56, 112, False),  # 96 at launch: hung on the H200 (2026-11-30, eighth session)
    (4, 32, 112, True),   # ran there
])
def test_register_split_fits_only_within_the_launch_allocation(warpgroups, producer, consumer,
                                                               fits) -> None:
    assert register_split_fits(warpgroups, producer, consumer) is fits


def test_launch_registers_come_in_steps_of_8() -> None:
    assert [launch_registers(t) for t in (384, 512, 640)] == [168, 128, 96]


def test_four_consumer_warpgroups_fit_the_register_file_and_shared_memory() -> None:
    """tile_n 256 (the decode tiers): 640 threads launch with 96 registers each; the split
    gives the consumers 104 without asking for more than the producer frees (a split that
    did hung on the H200), and the 16- and 32-row tiles fit shared memory."""
    from kernels.sm90.config import launch_registers, register_split_fits
    from kernels.sm90.staged import REGISTER_SPLITS
    assert launch_registers(640) == 96
    assert REGISTER_SPLITS[4] == (56, 104) and register_split_fits(4, 56, 104)
    assert not register_split_fits(4, 56, 112)
    for tile_m, smem in ((16, 137216), (32, 161792)):
        c = Config(tile_m=tile_m, tile_n=256)
        assert check(c) == []
        assert smem_bytes(c) == smem == (1024 + 3 * (256 * 128 + 2 * 2048) + 8 * tile_m * 128
                                         + -(-c_tile_bytes(c) // 1024) * 1024)
