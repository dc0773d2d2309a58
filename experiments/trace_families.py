"""Build a spec's sm_90a sets as clock-stamp trace kernels (a diagnostic: never shipped).

    python experiments/trace_families.py --out .trace [--spec experiments/trace_ab.yaml] [-j N]
    python experiments/trace_families.py --spec experiments/trace_serving.yaml --out .trace_serving

Each set's kernel, list or device-offsets (serving), is built through the builder's families
hook (NVFP4_BUILD_FAMILIES, as experiments/diag_build.py does) by trace_kernels.compile_kernel:
the shipped kernel with its no-op hooks (kernels/sm90/hooks.py) overridden to store %clock64 at
fixed places of a per-CTA record in the workspace, between the descriptors (and a serving
kernel's derived tables) and the fp16 A. The build key includes this module and
trace_kernels.py, so a trace kernel never shares one with a shipped kernel.

This module is also the build's FAMILIES and the layout of its records (TRACE_*), which
experiments/trace_run.py reads back on the GPU; no DSL import here, so trace_run and the CPU
tests read the constants without it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from kernels.families import Family
from kernels.sm90 import config as sm90_config
from kernels.sm90.config import K_TILE, SUB_K

FAMILIES = {"sm_90a": Family("sm90", sm90_config, "trace_kernels")}

# The record per CTA: 8-byte clock stamps at fixed places. Tiles past TRACE_TILES are not
# recorded; stages past TRACE_STAGES share the last slot.
TRACE_TILES, TRACE_STAGES = 4, 32
# Per 64-K step of the first consumer warpgroup: weights ready, A slot ready, wgmma issued,
# the previous step's wgmma retired.
TRACE_STEP_EVENTS = 4
# Per weight stage of the producer: weight slot free, weights issued, then each A slot free
# and issued (K_TILE // SUB_K of them).
TRACE_STAGE_EVENTS = 2 + K_TILE // SUB_K
# Per tile (consumers): tile start, K loop retired, C tile free, C tile handed over.
TRACE_TILE_EVENTS = 4
# After the tiles' records, TRACE_CTA_SLOTS stamps of the CTA's own: its events, in this order
# (the first is the CTA's start, by thread 0), then the %globaltimer ones below.
TRACE_CTA_SLOTS = 16
TRACE_CTA_EVENTS = ("CTA start", "descriptor templates copied", "first group's descriptors patched",
                    "first weight stage issued", "first A stage found staged",
                    "stagers' first iteration counted", "stagers' tables read and scanned",
                    "stagers' first chunks converted and stored", "stagers' first proxy fence",
                    "phase 1 staged (CTA barrier)", "grid barrier passed")
# CTA events also stamped with %globaltimer (ns, comparable across CTAs: how far apart the CTAs
# start, and when the last of them counts), event -> slot after TRACE_CTA_EVENTS.
TRACE_GLOBAL_EVENTS = {e: len(TRACE_CTA_EVENTS) + i for i, e in enumerate((0, 4, 5, 9, 10))}
assert len(TRACE_CTA_EVENTS) + len(TRACE_GLOBAL_EVENTS) <= TRACE_CTA_SLOTS
TRACE_CONSUMER_BYTES = TRACE_TILES * TRACE_STAGES * (K_TILE // SUB_K) * TRACE_STEP_EVENTS * 8
TRACE_PRODUCER_BYTES = TRACE_TILES * TRACE_STAGES * TRACE_STAGE_EVENTS * 8
TRACE_TILE_BYTES = (TRACE_TILES * TRACE_TILE_EVENTS + TRACE_CTA_SLOTS) * 8
TRACE_BYTES = TRACE_CONSUMER_BYTES + TRACE_PRODUCER_BYTES + TRACE_TILE_BYTES

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
FAMILIES_MODULE = "trace_families"


def build_env() -> dict[str, str]:
    """The builder's environment for a trace build: these families, inherited by the build
    workers; experiments/ importable in the parent (the build key finds trace_kernels.py) and
    in the workers."""
    env = dict(os.environ)
    env["NVFP4_BUILD_FAMILIES"] = FAMILIES_MODULE
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT),
                                         *filter(None, [env.get("PYTHONPATH")])])
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=HERE / "trace_ab.yaml",
                    help="shapes.yaml-style spec, sm_90a sets (default: experiments/trace_ab.yaml)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    args = ap.parse_args()
    return subprocess.run([sys.executable, "build_kernels.py", "build", "--spec",
                           str(args.spec.resolve()), "--out", str(args.out.resolve()),
                           "-j", str(args.jobs)],
                          cwd=ROOT, env=build_env(), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
