"""Build a start-up probe of bench/ (first_load.py, first_code.py) in a subprocess and read
each kernel's SASS, for the tests that check what those kernels time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def probe_sass(script: str, out: Path) -> dict[int, str]:
    """Build bench/`script` into `out` (sm_90a) and return each size's nvdisasm text; skips the
    test when no nvdisasm is found (after checking that the build worked)."""
    from kernels.introspect import nvdisasm_path

    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "build",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          check=False, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    index = json.loads((out / "index.json").read_text())
    tool = nvdisasm_path()
    if tool is None:
        pytest.skip("nvdisasm not found")
    return {int(size): subprocess.run([tool, "-c", str(out / e["cubin"])], capture_output=True,
                                      text=True, timeout=120, check=True).stdout
            for size, e in index.items()}
