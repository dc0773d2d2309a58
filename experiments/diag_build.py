"""Diagnostic builds of the sm_90a v3 kernel: each removes one part of the tile loop, so a
bench run shows what that part costs. Their results are WRONG by design; never serve them.

    python experiments/diag_build.py VARIANT --spec SPEC.yaml --out DIR [-j N]
    # then on the GPU: python bench/bench_grouped.py --artifacts DIR --no-baselines

Each variant is a subclass of the shipped kernel class that overrides one role method or two
(experiments/diag_kernels.py); build_kernels.py builds it through the builder's families hook
(NVFP4_BUILD_FAMILIES=diag_families, experiments/diag_families.py) with NVFP4_DIAG_VARIANT naming
the variant, always recompiling (--force: the build key does not know the variant). Variants
(docs/lab_notebook.md, 2026-11-30, has runs of the first three):
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
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
ENV_VARIANT = "NVFP4_DIAG_VARIANT"  # diag_kernels.ENV_VARIANT (that module imports cutlass)
FAMILIES_MODULE = "diag_families"

# Variant name -> what it removes (the module docstring has the details); diag_kernels.PARTS
# has each one's overrides.
VARIANTS: dict[str, str] = {
    "noconv": "weight words go to the wgmma fragments unconverted",
    "nomma": "no wgmma; the converted fragments folded into the accumulator",
    "half_a": "fp16 A TMA box of tile_m / 2 rows",
    "compute_only": "no TMA, no pipeline waits or releases",
    "sync_only": "waits and releases only: no conversion, no MMA",
    "phase1_only": "no tiles: staging, grid barrier, launch",
    "stage_only": "no tiles, no grid barrier: staging and launch",
    "empty": "no tiles, no barrier, no staging",
    "bare": "the kernel returns after its smem check",
    "stage_nofence": "stage_only without the staging's closing proxy fence",
    "stage_nostore": "stage_only without the staging's stores",
    "nostore": "the whole loop without the epilogue's C stores",
    "mma2x": "every step's wgmmas issued twice",
    "wait0": "each warpgroup retires its step's wgmma before converting the next",
    "nohmul": "the conversion's scale multiplies become XORs",
    "nolds": "the conversion reads no shared memory",
    "sa_nowait": "(stream_a) the producer never waits for staged A",
    "sa_nostore": "(stream_a) sa_nowait, and the stagers store nothing",
    "sa_nofence": "(stream_a) the stagers' proxy fence dropped",
    "sa_nostage": "(stream_a) no staging at all",
    "sa_storers_first": "(stream_a) the consumers start after the stagers (racecheck probe)",
}


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, but got {variant!r}")


def build_env(variant: str) -> dict[str, str]:
    """The builder's environment for `variant`: the diagnostic families and the variant, both
    inherited by the build workers; experiments/ importable in the parent and the workers."""
    check_variant(variant)
    env = dict(os.environ)
    env["NVFP4_BUILD_FAMILIES"] = FAMILIES_MODULE
    env[ENV_VARIANT] = variant
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT),
                                         *filter(None, [env.get("PYTHONPATH")])])
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant", choices=sorted(VARIANTS))
    ap.add_argument("--spec", required=True, type=Path, help="shapes.yaml-style spec (sm_90a)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    args = ap.parse_args()
    return subprocess.run([sys.executable, "build_kernels.py", "build", "--spec",
                           str(args.spec.resolve()), "--out", str(args.out.resolve()),
                           "-j", str(args.jobs), "--force"],
                          cwd=ROOT, env=build_env(args.variant), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
