"""Build a start-up probe of experiments/ (first_load.py, first_code.py, smem_mma.py) in a
subprocess and read each kernel's SASS, for the tests that check what those kernels time.
NEEDS_DSL marks those tests: `dsl` (deselected by -m "not dsl") and skipped without the DSL.
No conftest here: a second conftest module would shadow tests/conftest.py for the tests that
import from it when both directories run in one pytest call."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1]
NEEDS_DSL = [pytest.mark.dsl,
             pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                reason="needs nvidia-cutlass-dsl")]


def probe_sass(script: str, out: Path) -> dict[int, str]:
    """Build experiments/`script` into `out` (sm_90a) and return each size's nvdisasm text;
    skips the test when no nvdisasm is found (after checking that the build worked)."""
    from kernels.introspect import nvdisasm_path

    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a")
    proc = subprocess.run([sys.executable, str(EXPERIMENTS / script), "build",
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
