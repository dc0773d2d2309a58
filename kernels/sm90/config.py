"""Build-time configuration of the sm_90a kernel (Hopper: dequantize NVFP4 to fp16, wgmma)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.manifest import OUT_DTYPES

# K elements per pipeline stage: one 128-byte row of packed fp4 per operand row.
K_TILE = 256
# Block scales in the blocked layout (facts.md): a 512-byte atom holds 128 rows x 4 scales (64 K);
# a pipeline stage holds K_TILE // 64 atoms of each 128-row block it covers.
SCALE_ATOM_BYTES = 512
SCALE_STAGE_BYTES = SCALE_ATOM_BYTES * K_TILE // 64
# The K a call's k must be a multiple of: one 64-K fp16 A slot, one 512-byte scale atom. A tile's
# last K_TILE stage may then run past k: TMA fills the weights, scales and fp16 A past k with
# zeros, whose products add exact zeros (gpt-oss's K = 2880, issue 26). stream_a (A staged and
# counted in whole K_TILE stages) keeps K_TILE (k_multiple()).
K_MULTIPLE = 64
# C rows are written with 16-byte vectors: n must keep them aligned.
N_MULTIPLE = 8
# Hopper accumulates in registers; there is no TMEM accumulator to double-buffer.
ACC_STAGES = (1,)
# Output rows (tokens) per CTA tile = the wgmma N. 256 (tile_n 128 only: its 128-register
# accumulator needs two consumer warpgroups' register share) converts each weight tile once for
# up to 256 tokens; 80..112 fit a set's m with fewer padded MMA rows (docs/lab_notebook.md,
# tenth session); 16 and 32 suit decode's few tokens per expert (issue 27), 48 the calls
# between the decode and mid tiers (thirty-first session). Multiples of 16 only: the DSL aborts
# the process compiling 88, 104 or 120.
TILE_MS = (16, 32, 48, 64, 80, 96, 112, 128, 256)
# Output columns (weight rows) per CTA tile: one consumer warpgroup per 64. 192 runs 1.5x the
# converting warps and gets 1.5x the MMA work out of every fp16 A tile loaded. 256 (tiles of up
# to 64 rows: their accumulator fits the 104 registers a 640-thread CTA gives; the build's
# stack-frame guard says so, thirty-first session) puts four converting warps on each scheduler
# to hide the conversion chain's latency.
TILE_NS = (128, 192, 256)
TILE_N_WIDE_MAX_M = 64
# inline_a: two converter warps (one storer warp left) take turns at a tile's 256-K stages of
# A, a lane loading one row's half h of each 64-K step (the words of parity h) for each
# INLINE_A_ROWS rows of the tile (two lanes per row); tile_m past INLINE_A_MAX_M would need more
# registers.
INLINE_A_WARPS = 2
INLINE_A_ARRIVALS = 32  # a slot is full once every lane of its converter warp has arrived
INLINE_A_ROWS = 16
INLINE_A_MAX_M = 32


@dataclass(frozen=True)
class Config:
    """The sm_90a kernel's build options. The defaults are the shipped v3 kernel (staged A,
    async epilogue, descriptors patched ahead: what shapes.yaml's sm_90a defaults give).
    Options deleted with their code paths are in REMOVED_OPTIONS."""

    acc_stages: int = 1
    # The element type C is written in (shapes.yaml `out_dtypes`, its own key, like acc_stages):
    # the epilogue multiplies the fp32 accumulator by the group's alpha, then rounds to it.
    out_dtype: str = "float16"
    tile_m: int = 128
    tile_n: int = 128
    stages: int = 3  # shared-memory stages of the packed-operand pipeline
    # fp16 A buffers of 64 K each: the TMA ring the wgmma reads from.
    a_slots: int = 8
    # Load each 64-K step's weight words from shared memory one step early (before the previous
    # step's waits and wgmma issue), off the head of its conversion chain. Faster on some sets
    # (dense_a), slower on others (moe_down): bench/RESULTS.md.
    w_prefetch: bool = False
    # Always on (_ALWAYS_ON): the consumers write each finished tile into a C_ROW_PAD-padded
    # shared C tile and go on; the producer warpgroup's three idle warps copy it out.
    async_epilogue: bool = True
    # Always on (_ALWAYS_ON): the producer patches (and prefetches) the descriptors of its next
    # tile's group one tile ahead, so a group change does not wait for the patch and the
    # descriptor fetch. One more descriptor set per CTA.
    patch_ahead: bool = True
    # Phase 1 overlaps the tile loop instead of ending in a grid barrier. Warps 1..3 stage A in
    # K order (kernels/sm90/staging.py, "streamed staging") while the consumers start, and the
    # producer waits for each stage's A rows alone. Needs one k for all groups and at most
    # LANE_GROUPS groups (check_groups).
    stream_a: bool = False
    # The serving contract (issue 26; kernels/sm90/offsets.py): the kernel takes the call's
    # int32 expert end offsets and operand base pointers instead of host-built tables, and
    # each CTA derives the tables from them on the device, so a call needs no host work per
    # routing and one captured graph serves every routing. Implied by shapes.yaml's
    # `experts:` sets (builder/spec.py); with the grid barrier only (not stream_a).
    device_offsets: bool = False
    # With device_offsets: DeepGEMM's masked layout (issue 27) instead of offsets: a is (E,
    # max_m, K/2), expert g's rows start at g * max_m and masked_m[g] of them are valid; sfa
    # holds round_up(max_m, 128) blocked rows per expert; c is (E, max_m, N).
    masked: bool = False
    # With device_offsets: CTA i runs the run of tiles [i q, (i + 1) q), q = ceil(tiles / grid),
    # instead of every grid-th tile from i. A decode call has one m-tile per expert, so a CTA's
    # consecutive tiles are n-tiles of one expert: one descriptor patch and one A row range per
    # run of tiles, instead of a new expert (patch, table walk) at every tile. The same
    # ceil(tiles / grid) tiles for the busiest CTA either way.
    blocked_tiles: bool = False
    # With device_offsets and tile_m <= 32 (decode tiles): no phase 1 and no grid barrier.
    # Warps 1 and 2 of the producer warpgroup convert each tile's packed A rows into the fp16
    # ring themselves as the consumers free its slots (kernels/sm90/inline_a.py); warp 3
    # stores C. Every n-tile of an expert converts its A again: cheap at 16-32
    # rows, which is why larger tiles keep phase 1 (docs/lab_notebook.md, second session).
    inline_a: bool = False


def launch_registers(threads: int) -> int:
    """Registers per thread a CTA of `threads` gets at launch when it takes the whole register
    file (65536; allocated in steps of 8 per thread)."""
    return 65536 // threads // 8 * 8


def register_split_fits(consumer_warpgroups: int, producer: int, consumer: int) -> bool:
    """Whether setmaxnreg can move the consumer warpgroups to `consumer` registers per thread
    while the producer warpgroup drops to `producer`. Registers only move inside the CTA's
    launch allocation, so the consumers take no more than the producer gives up; a split that
    asks for more hangs at the consumers' setmaxnreg.inc (docs/lab_notebook.md, eighth session)."""
    launch = launch_registers(128 * (consumer_warpgroups + 1))
    return (launch - producer) >= consumer_warpgroups * (consumer - launch)


# The most dynamic shared memory one CTA may opt in to on sm_90 (227 KiB).
SMEM_LIMIT = 232448
SUB_K = 64  # K of one fp16 A slot and of one wgmma step

C_ROW_PAD = 8  # fp16 elements after each shared C row: consumers' stores avoid bank conflicts
# Up to this many groups, phase 1 holds the group tables one per lane of each staging warp;
# more groups walk them (kernels/sm90/staged.py, _stage_a).
LANE_GROUPS = 32


def can_implement(config: Config, shapes: Sequence[Sequence[int]] | None = None) -> list[str]:
    """Every reason the kernel cannot be built for `config` or, given the groups it must serve
    (`shapes`: (m, n, k) or, m dynamic, (n, k) per group, in order; only each k matters),
    cannot serve them; empty when it can. The one legality function: the builder asks its two
    halves apart (check per set's options, check_groups per set's groups' k), the kernel class
    (Sm90GroupedGemm.can_implement) and compile_kernel ask it whole."""
    if shapes is None:
        return check(config)
    return check(config) + check_groups(config, [g[-1] for g in shapes])


def k_multiple(config: Config) -> int:
    """What every group's k must be a multiple of for this config (K_MULTIPLE's comment)."""
    return K_MULTIPLE if config.stream_a is False else K_TILE


def check_groups(config: Config, ks: list[int]) -> list[str]:
    """Reasons the config cannot serve groups of these k (in order); empty when it can."""
    reasons = []
    bad = sorted({k for k in ks if k % k_multiple(config)})
    if bad:
        why = ("stream_a stages A in whole K_TILE stages" if config.stream_a is not False
               else "one 64-K fp16 A slot and one scale atom")
        reasons.append(f"k must be a multiple of {k_multiple(config)} with these options "
                       f"({why}), but the groups have k {bad}")
    if config.stream_a is True:
        if len(set(ks)) > 1:
            reasons.append(f"stream_a needs one k for all groups (it stages A in K order "
                           f"across groups), but the groups have k {sorted(set(ks))}")
        if len(ks) > LANE_GROUPS:
            reasons.append(f"stream_a serves at most {LANE_GROUPS} groups (one per lane of a "
                           f"staging warp), but got {len(ks)}")
    return reasons


def c_tile_bytes(config: Config) -> int:
    """Shared memory of the async_epilogue's C tile (0 without it)."""
    return config.tile_m * (config.tile_n + C_ROW_PAD) * 2 if config.async_epilogue else 0


def scale_blocks(tile_n: int) -> int:
    """128-row scale blocks one weight tile's scales span: a 192-row tile starts at row 0 or 64
    of a block, so it needs two."""
    return 1 if tile_n <= 128 else 2


def smem_bytes(config: Config) -> int:
    """Shared memory the kernel allocates: barriers, weight stages (packed and scales), the fp16
    A ring and the C tile."""
    b_stage = config.tile_n * (K_TILE // 2) + scale_blocks(config.tile_n) * SCALE_STAGE_BYTES
    c_tile = -(-c_tile_bytes(config) // 1024) * 1024  # 1024-aligned after the A ring
    return 1024 + config.stages * b_stage + config.a_slots * config.tile_m * SUB_K * 2 + c_tile


# Options the kernel always has (the off paths are on branch wip-v3-direct-epilogue), and why.
_ALWAYS_ON = {
    "async_epilogue": "its consumers' own C stores were slower, docs/lab_notebook.md sixth session",
    "patch_ahead": "patching at each tile's start was slower, docs/lab_notebook.md seventh session",
}

# Options deleted with their code paths: when, why and where the code is. A shapes.yaml option
# naming one is refused with this, not as an unknown key.
REMOVED_OPTIONS = {
    "a_fp16": "in issue 25: v2, which converted A per tile (a_fp16: false), lost to v3 with "
              "stream_a, and every sm_90a kernel converts A once per call (v2 is last at commit "
              "b6627c2)",
    "w_regs": "in issue 25: weights through a shared fp16 tile (w_regs: false) lost to the "
              "register operand (branch wip-smem-fp16-b-option)",
    "stream_k": "in issue 25: stream-K lost 7% on moe_down and 3-8 us on the dense sets (branch "
                "wip-stream-k-option)",
    "trace": "in issue 25: the clock-stamp diagnostic is a build of its own, not an option "
             "(python experiments/trace_families.py --spec SPEC --out DIR traces a spec's list "
             "and serving sets: experiments/trace_ab.yaml, experiments/trace_serving.yaml)",
}


def check(config: Config) -> list[str]:
    """Reasons the config cannot be built; empty when it can."""
    reasons = []
    if config.out_dtype not in OUT_DTYPES:
        reasons.append(f"out_dtype must be one of {list(OUT_DTYPES)}, but got "
                       f"{config.out_dtype!r}")
    if config.acc_stages not in ACC_STAGES:
        reasons.append(f"acc_stages must be one of {list(ACC_STAGES)} on sm_90a (Hopper "
                       f"accumulates in registers), but got {config.acc_stages}")
    if config.tile_m not in TILE_MS:
        reasons.append(f"tile_m must be one of {list(TILE_MS)}, but got {config.tile_m}")
    if config.tile_n not in TILE_NS:
        reasons.append(f"tile_n must be one of {list(TILE_NS)}, but got {config.tile_n}")
    if config.tile_m == 256 and config.tile_n != 128:
        reasons.append(f"tile_m 256 needs tile_n 128 (two consumer warpgroups hold its "
                       f"accumulator), but got tile_n {config.tile_n!r}")
    if not isinstance(config.w_prefetch, bool):
        reasons.append(f"w_prefetch must be true or false, but got {config.w_prefetch!r}")
    if config.tile_n == 256 and config.tile_m > TILE_N_WIDE_MAX_M:
        reasons.append(f"tile_n 256 needs tile_m at most {TILE_N_WIDE_MAX_M} (four consumer "
                       f"warpgroups get 104 registers each, room for a small accumulator "
                       f"only), but got tile_m {config.tile_m}")
    if config.tile_n == 256 and config.stream_a is True:
        reasons.append("tile_n 256 needs stream_a: false (its stager warps need registers the "
                       "four consumer warpgroups take)")
    for name in ("async_epilogue", "patch_ahead", "stream_a"):
        value = getattr(config, name)
        if not isinstance(value, bool):
            reasons.append(f"{name} must be true or false, but got {value!r}")
        elif name in _ALWAYS_ON and not value:
            reasons.append(f"{name} must be true (the kernel has no other path: "
                           f"{_ALWAYS_ON[name]}), but got false")
    if not isinstance(config.device_offsets, bool):
        reasons.append(f"device_offsets must be true or false, but got "
                       f"{config.device_offsets!r}")
    elif config.device_offsets and config.stream_a is not False:
        reasons.append("device_offsets needs stream_a: false (the device-offsets prologue is "
                       f"built on the kernel with the grid barrier), but got stream_a "
                       f"{config.stream_a!r}")
    if not isinstance(config.masked, bool):
        reasons.append(f"masked must be true or false, but got {config.masked!r}")
    elif config.masked and config.device_offsets is not True:
        reasons.append("masked needs device_offsets: true (the masked layout's tables are "
                       "derived on the device; give it on an experts: set)")
    if not isinstance(config.blocked_tiles, bool):
        reasons.append(f"blocked_tiles must be true or false, but got {config.blocked_tiles!r}")
    elif config.blocked_tiles and config.device_offsets is not True:
        reasons.append("blocked_tiles needs device_offsets: true (the list kernels keep the "
                       "strided tile order their bit-identical cubins were measured with)")
    if not isinstance(config.inline_a, bool):
        reasons.append(f"inline_a must be true or false, but got {config.inline_a!r}")
    elif config.inline_a and config.device_offsets is not True:
        reasons.append("inline_a needs device_offsets: true (the list kernels stage A in phase "
                       "1; give it on an experts: set)")
    elif config.inline_a and config.tile_m > INLINE_A_MAX_M:
        reasons.append(f"inline_a needs tile_m at most {INLINE_A_MAX_M} (a converter lane "
                       f"holds its chunks of tile_m / 16 rows in registers), but got tile_m "
                       f"{config.tile_m}")
    if not 2 <= config.a_slots <= 32:
        reasons.append(f"a_slots must be in 2..32, but got {config.a_slots}")
    if not 2 <= config.stages <= 8:
        reasons.append(f"stages must be in 2..8, but got {config.stages}")
    if not reasons and smem_bytes(config) > SMEM_LIMIT:
        reasons.append(
            f"stages {config.stages} with tile_m {config.tile_m}"
            + (f", tile_n {config.tile_n}" if config.tile_n != 128 else "")
            + f" and a_slots {config.a_slots}"
            + f" needs {smem_bytes(config)} bytes of shared memory, more than the {SMEM_LIMIT} "
            "a Hopper CTA can use; lower stages or a_slots"
            + (" or tile_n" if config.tile_n != 128 else "")
            + (f" (its C tile takes {c_tile_bytes(config)} bytes)"
               if config.async_epilogue else ""))
    return reasons
