"""Shared fixtures for the builder tests: a fake family package and tree hashes."""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

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


def tree_hash(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by relative path (plus directories, as 'dir')."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out
