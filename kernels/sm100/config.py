"""Build-time configuration of the sm_100a kernel (the original tcgen05 kernel)."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.manifest import OUT_DTYPES

# Tile of one CTA: M x N output, K per pipeline stage (fixed by the tcgen05 block-scaled MMA setup).
TILE_M, TILE_N, K_TILE = 128, 128, 256
# What a call's k must be a multiple of (whole K tiles: the tcgen05 pipeline has no partial one).
K_MULTIPLE = K_TILE
# C rows are written with 16-byte vectors when a tile is full: keep them aligned.
N_MULTIPLE = 8
ACC_STAGES = (1, 2)
# Shared memory: each A/B/SFA/SFB stage holds a 128x256 fp4 tile of A and of B and their scales.
SMEM_LIMIT = 232448  # the most dynamic shared memory one sm_100 CTA may opt in to
STAGE_BYTES = 2 * (TILE_M * K_TILE // 2) + 2 * (TILE_M * K_TILE // 16)
SMEM_OVERHEAD_BYTES = 1024  # barriers, tensormaps, tile coordinates (measured: see the kernel)


@dataclass(frozen=True)
class Config:
    acc_stages: int = 2  # TMEM accumulator buffers: 2 overlaps the epilogue with the next tile
    # The element type C is written in (shapes.yaml `out_dtypes`, its own key, like acc_stages):
    # the epilogue multiplies the fp32 accumulator by the group's alpha, then rounds to it.
    out_dtype: str = "float16"
    ab_stages: int = 6  # shared-memory stages of the A/B/SFA/SFB pipeline
    # The serving contract (issue 26; kernels/sm100/offsets.py): the kernel takes the expert
    # offsets and base pointers and derives its tables on the device, as on sm_90a. Implied by
    # shapes.yaml's `experts:` sets. `masked`: the masked layout (issue 27) instead.
    device_offsets: bool = False
    masked: bool = False


def check(config: Config) -> list[str]:
    """Reasons the config cannot be built; empty when it can."""
    reasons = []
    if config.out_dtype not in OUT_DTYPES:
        reasons.append(f"out_dtype must be one of {list(OUT_DTYPES)}, but got "
                       f"{config.out_dtype!r}")
    if config.acc_stages not in ACC_STAGES:
        reasons.append(f"acc_stages must be one of {list(ACC_STAGES)}, but got {config.acc_stages}")
    for name in ("device_offsets", "masked"):
        if not isinstance(getattr(config, name), bool):
            reasons.append(f"{name} must be true or false, but got {getattr(config, name)!r}")
    if config.masked is True and config.device_offsets is not True:
        reasons.append("masked needs device_offsets: true (the masked layout's tables are "
                       "derived on the device; give it on an experts: set)")
    if not 2 <= config.ab_stages <= 8:
        reasons.append(f"ab_stages must be in 2..8, but got {config.ab_stages}")
    elif config.ab_stages * STAGE_BYTES + SMEM_OVERHEAD_BYTES > SMEM_LIMIT:
        need = config.ab_stages * STAGE_BYTES + SMEM_OVERHEAD_BYTES
        reasons.append(
            f"ab_stages {config.ab_stages} needs {config.ab_stages} x {STAGE_BYTES} + "
            f"{SMEM_OVERHEAD_BYTES} = {need} bytes of shared memory, more than the {SMEM_LIMIT} "
            f"an sm_100 CTA may use; ab_stages must be <= "
            f"{(SMEM_LIMIT - SMEM_OVERHEAD_BYTES) // STAGE_BYTES}")
    return reasons
