"""Config.w_prefetch (not yet measured on a GPU) must keep building: the compile's own guards
(no stack frame, asynchronous wgmma) pass, and the option moves the weight loads of the next
64-K step ahead of the current step's wgmma, which the PTX shows."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                reason="needs nvidia-cutlass-dsl")

SCRIPT = """
import json, re, sys
sys.path.insert(0, {repo!r})
from kernels.sm90.config import Config
from kernels.sm90.grouped_gemm import compile_kernel
out = {{}}
for name, opts in (("off", {{"tile_n": 192}}), ("on", {{"tile_n": 192, "w_prefetch": True}})):
    ptx = compile_kernel(Config(**opts), arch="sm_90a", groups=[(128, 4096, 7168)]).ptx
    # In each 64-K step (text up to its wgmma fence), do shared loads follow the step's scale
    # conversion? Only when they belong to the next step.
    late = 0
    for step in ptx.split("wgmma.commit_group")[:-1]:
        if "wgmma.fence" not in step:
            continue
        head = step[: step.rindex("wgmma.fence")]
        if "cvt.rn.f16x2.e4m3x2" in head and "ld.shared" in head:
            late += head.rindex("ld.shared") > head.rindex("cvt.rn.f16x2.e4m3x2")
    out[name] = late
print(json.dumps(out))
"""


def test_prefetch_builds_and_loads_the_next_step_before_waiting() -> None:
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(repo=str(REPO))], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["off"] == 0
    assert counts["on"] > 0
