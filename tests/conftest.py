"""Shared fixtures for the builder tests: a fake family package and tree hashes."""

from __future__ import annotations

import hashlib
import importlib.util
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fakefam import write_fake_package

REPO = Path(__file__).resolve().parents[1]


def dsl_available() -> bool:
    return importlib.util.find_spec("cutlass") is not None


requires_dsl = pytest.mark.skipif(not dsl_available(), reason="nvidia-cutlass-dsl not installed")


@dataclass
class Fake:
    root: Path  # on sys.path
    pkg: str  # the package name
    log: Path  # one line per compile, written by workers

    @property
    def module(self) -> str:
        return f"{self.pkg}.families"

    @property
    def dsl_module(self) -> str:
        return f"{self.pkg}.dsl_families"

    def family_dir(self, family: str) -> Path:
        return self.root / self.pkg / family

    def compiles(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    """A fresh fake family package, importable here and (through the env) in workers."""
    root = tmp_path / "_fake" / "pkg"  # tests ignore "_fake" when listing tmp_path
    root.mkdir(parents=True)
    pkg = write_fake_package(root)
    monkeypatch.syspath_prepend(str(root))
    log = tmp_path / "_fake" / "compile.log"
    monkeypatch.setenv("FAKE_COMPILE_LOG", str(log))
    monkeypatch.setenv("NVFP4_BUILD_FAMILIES", f"{pkg}.families")
    return Fake(root=root, pkg=pkg, log=log)


def default_sigint() -> None:
    """Popen preexec_fn for a build that a test interrupts with SIGINT: a test run started in
    the background (a shell without job control, nohup) inherits SIGINT ignored, and so would
    the build, which then never sees the Ctrl-C the test sends (it hung for 60 s). Reset, the
    build gets Python's KeyboardInterrupt, as at a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def tree_hash(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by relative path (plus directories, as 'dir')."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


NEEDS_DSL = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="needs nvidia-cutlass-dsl")
_SM90_PRELUDE = f"""import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from kernels.sm90.config import Config
from kernels.sm90.compile import compile_kernel
"""


def compile_sm90(body: str) -> Any:
    """run_sm90_script of `body` after a prelude that imports json, Config and compile_kernel
    from this checkout: the compile tests' scripts hold only what they compare."""
    return run_sm90_script(_SM90_PRELUDE + body)


def run_sm90_script(script: str) -> Any:
    """Run `script` in a fresh interpreter with CUTE_DSL_ARCH=sm_90a (read once, at `import
    cutlass`) and no GPU visible; returns the JSON its last output line prints."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ test tiers
# dsl: compiles kernels with nvidia-cutlass-dsl (every test behind NEEDS_DSL / requires_dsl is
# marked here, so `-m "not dsl"` really leaves the compiler out). slow: spawns builds, kills or
# installs (seconds each). The edit loop: `pytest -m "not dsl and not gpu and not slow"`.
_SLOW_MODULES = {"test_build_reliability.py", "test_build_faults.py", "test_package.py"}
_SLOW_NAMES = ("killed", "concurrent", "clean_venv", "host_cost_bench", "shards_merged",
               "cli_", "never_imports_cutlass", "opcheck", "does_not_register", "standard_recipe",
               "lock", "toy_kernel", "second_run", "help_of_every")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any("cutlass-dsl" in str(m.kwargs.get("reason", ""))
               for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.dsl)
        if item.path.name in _SLOW_MODULES or any(s in item.name for s in _SLOW_NAMES):
            item.add_marker(pytest.mark.slow)
