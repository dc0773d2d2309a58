"""bench/first_load.py measures how long a kernel's first loads take on their own. Its number
means something only if each thread has every copy in flight before it waits: the built
kernels must issue all their cp.async copies, then one wait for all, then the CTA barrier and
the stamp, in that order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NEEDS_DSL

ROOT = Path(__file__).resolve().parents[1]

pytestmark = NEEDS_DSL


def test_first_load_kernels_issue_every_copy_before_one_wait(tmp_path: Path) -> None:
    from kernels.introspect import nvdisasm_path

    out = tmp_path / "fl"
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "first_load.py"), "build",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          check=False, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    index = json.loads((out / "index.json").read_text())
    assert sorted(int(v) for v in index) == [2, 25, 100]
    tool = nvdisasm_path()
    if tool is None:
        pytest.skip("nvdisasm not found")
    for vecs, entry in index.items():
        sass = subprocess.run([tool, "-c", str(out / entry["cubin"])], capture_output=True,
                              text=True, timeout=120, check=True).stdout
        ops = [op for line in sass.splitlines()
               for op in ("LDGSTS", "DEPBAR.LE SB0, 0x0", "BAR.SYNC", "CS2R") if op in line]
        copies = ops.count("LDGSTS")
        assert copies == int(vecs), (vecs, ops)
        last_copy = max(i for i, op in enumerate(ops) if op == "LDGSTS")
        # start stamps, every copy, the one wait, the barrier, the end stamps
        assert ops[last_copy + 1:] == ["DEPBAR.LE SB0, 0x0", "BAR.SYNC", "CS2R", "CS2R"], ops
        assert ops[:2] == ["CS2R", "CS2R"], ops
