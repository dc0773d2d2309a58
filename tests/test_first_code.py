"""bench/first_code.py measures what fetching cold code costs at a kernel's start. Its number
means something only if the block between the stamps is the straight-line code it claims: N
IMADs with no branch among them, run twice by one loop."""

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


def test_first_code_kernels_time_one_straight_block_of_n_imads(tmp_path: Path) -> None:
    from kernels.introspect import nvdisasm_path

    out = tmp_path / "fc"
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "first_code.py"), "build",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          check=False, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    index = json.loads((out / "index.json").read_text())
    assert sorted(int(n) for n in index) == [512, 2048, 4096]
    tool = nvdisasm_path()
    if tool is None:
        pytest.skip("nvdisasm not found")
    for n, entry in index.items():
        sass = subprocess.run([tool, "-c", str(out / entry["cubin"])], capture_output=True,
                              text=True, timeout=120, check=True).stdout
        lines = [line for line in sass.splitlines() if "/*" in line and ";" in line]
        stamps = [i for i, line in enumerate(lines) if "SR_CLOCKLO" in line]
        assert len(stamps) == 2, stamps  # before the loop, and inside it after the block
        block = lines[stamps[0] + 1:stamps[1]]
        assert not [line for line in block if "BRA" in line], block
        imads = [line for line in block if "IMAD " in line or "IMAD\t" in line]
        assert len(imads) == int(n), (n, len(imads))
        # the loop's branch back comes after the second stamp
        assert any("BRA" in line for line in lines[stamps[1]:]), lines[stamps[1]:]
