"""Path setup for the experiments' tests (outside the default test path: run them with
`python -m pytest experiments/tests`). The repository root is on sys.path through pyproject's
`pythonpath`; experiments/ goes on it here so the tests import the probes by module name, and
this directory so they import probe_sass. Nothing here is shared with tests/conftest.py."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent, HERE.parents[1]):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
