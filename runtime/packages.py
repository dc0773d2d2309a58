"""Installed artifact packages: find artifact directories without a path.

`python build_kernels.py package ARTIFACT_DIR` turns an artifact directory into a wheel named
`nvfp4-artifacts-<name>` whose import package `nvfp4_artifacts_<name>` holds `artifacts/`
(manifest.json + cubins) and `package.json`, and which declares an entry point

    [nvfp4_grouped_gemm.artifacts]
    <name> = nvfp4_artifacts_<name>

This module finds such packages through importlib.metadata, without importing them (no code of
theirs runs): the distribution's own file list locates `package.json` and `artifacts/`.

    resolve(None)            the only usable installed package (error if none or several)
    resolve("pkg:<name>")    the installed package <name>
    resolve("some/dir")      that directory, unchanged
    load(spec=None)          runtime.load(resolve(spec)): a GroupedGemm

Version lock: a package records the manifest schema it was built for; a package whose schema
is not this runtime's SCHEMA_VERSION is refused with an error naming the package and the fix
(its manifest would be refused too, with a less helpful message). Torch-free and cutlass-free:
`python -m runtime.packages` lists installed packages and their kernels on any machine.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import ManifestError
from .manifest import MANIFEST_NAME, SCHEMA_VERSION

ENTRY_POINT_GROUP = "nvfp4_grouped_gemm.artifacts"
PACKAGE_INFO = "package.json"  # inside the import package, next to artifacts/
ARTIFACTS_SUBDIR = "artifacts"
PKG_PREFIX = "pkg:"
PACKAGE_FORMAT = 1  # layout of package.json and of the import package

__all__ = [
    "ENTRY_POINT_GROUP",
    "ArtifactPackage",
    "find_artifact_dirs",
    "installed",
    "resolve",
]


@dataclass(frozen=True)
class ArtifactPackage:
    """One installed artifact package, usable or not (`problem` says why not)."""

    name: str  # the entry point name: what "pkg:<name>" selects
    distribution: str  # e.g. nvfp4-artifacts-moe
    version: str
    module: str  # the import package, e.g. nvfp4_artifacts_moe
    artifact_dir: Path | None
    info: dict[str, Any] = field(default_factory=dict)  # package.json
    problem: str | None = None

    @property
    def usable(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        return f"{self.name} ({self.distribution} {self.version})"


def _check(pkg: ArtifactPackage) -> str | None:
    """Why `pkg` cannot be loaded by this runtime, or None."""
    info = pkg.info
    if info.get("format") != PACKAGE_FORMAT:
        return (f"its {PACKAGE_INFO} has format {info.get('format')!r}, but this runtime reads "
                f"format {PACKAGE_FORMAT}")
    schema = info.get("schema_version")
    if schema != SCHEMA_VERSION:
        return (f"it was built for manifest schema {schema}, but this runtime reads schema "
                f"{SCHEMA_VERSION}; install an artifact package built by this version of "
                f"nvfp4-grouped-gemm (rebuild and repackage: `python build_kernels.py build` "
                f"then `python build_kernels.py package artifacts --name {pkg.name}`)")
    if pkg.artifact_dir is None or not (pkg.artifact_dir / MANIFEST_NAME).is_file():
        return f"its {ARTIFACTS_SUBDIR}/{MANIFEST_NAME} is missing (a broken install?)"
    return None


def _from_entry_point(dist: md.Distribution, ep: md.EntryPoint) -> ArtifactPackage:
    module = ep.value.split(":")[0].strip()
    base = {"name": ep.name, "distribution": dist.metadata["Name"] or "?",
            "version": dist.version or "?", "module": module}
    # Locate the files through the distribution, not through an import: nothing of the package
    # runs, and a package shadowed on sys.path cannot be mistaken for this one.
    root = Path(str(dist.locate_file(module.replace(".", "/"))))
    info_path = root / PACKAGE_INFO
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError) as exc:
        return ArtifactPackage(**base, artifact_dir=None,
                               problem=f"cannot read {info_path}: {exc}")
    if not isinstance(info, dict):
        return ArtifactPackage(**base, artifact_dir=None,
                               problem=f"{info_path} must hold a JSON object")
    pkg = ArtifactPackage(**base, artifact_dir=root / ARTIFACTS_SUBDIR, info=info)
    problem = _check(pkg)
    return pkg if problem is None else replace(pkg, problem=problem)


def installed(path: list[str] | None = None) -> list[ArtifactPackage]:
    """Every artifact package on `path` (default sys.path), sorted by name; the first
    distribution of a name on the path wins, as for imports."""
    dists = md.distributions(path=path) if path is not None else md.distributions()
    seen: set[str] = set()
    out: list[ArtifactPackage] = []
    for dist in dists:
        dist_name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if dist_name in seen:
            continue
        seen.add(dist_name)
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP:
                out.append(_from_entry_point(dist, ep))
    return sorted(out, key=lambda p: (p.name, p.distribution))


def find_artifact_dirs(path: list[str] | None = None) -> dict[str, Path]:
    """{name: artifact directory} of the usable installed artifact packages."""
    return {p.name: p.artifact_dir for p in installed(path) if p.usable and p.artifact_dir}


def _listing(pkgs: list[ArtifactPackage]) -> str:
    return ", ".join(p.describe() + ("" if p.usable else f" [unusable: {p.problem}]")
                     for p in pkgs) or "none"


def resolve(spec: str | os.PathLike[str] | None = None, *,
            path: list[str] | None = None) -> Path:
    """The artifact directory `spec` names: None -> the only usable installed artifact package,
    "pkg:<name>" -> that installed package, anything else -> Path(spec) unchanged."""
    if spec is not None and not (isinstance(spec, str) and spec.startswith(PKG_PREFIX)):
        return Path(spec)
    pkgs = installed(path)
    how = ("build one with `python build_kernels.py package ARTIFACT_DIR --out dist` and "
           "`pip install dist/nvfp4_artifacts_*.whl`, or pass an artifact directory")
    if spec is None:
        usable = [p for p in pkgs if p.usable]
        if len(usable) == 1:
            return usable[0].artifact_dir  # type: ignore[return-value]
        if not usable:
            raise ManifestError(
                "no artifact directory given and no usable artifact package is installed "
                f"(entry point group {ENTRY_POINT_GROUP!r}; installed: {_listing(pkgs)}); {how}")
        raise ManifestError(
            f"no artifact directory given and {len(usable)} artifact packages are installed: "
            f"{_listing(usable)}; choose one, e.g. runtime.load('pkg:{usable[0].name}')")
    name = spec[len(PKG_PREFIX):]
    match = [p for p in pkgs if p.name == name]
    if not match:
        raise ManifestError(f"no installed artifact package is named {name!r} (installed: "
                            f"{_listing(pkgs)}); {how}")
    pkg = match[0]
    if not pkg.usable:
        raise ManifestError(f"artifact package {pkg.describe()} cannot be used: {pkg.problem}")
    return pkg.artifact_dir  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    """`python -m runtime.packages [--verify]`: installed artifact packages and their kernels.

    --verify also checks every cubin's sha256 and ELF arch (no GPU needed)."""
    from .loader import ArtifactStore

    args = sys.argv[1:] if argv is None else argv
    if any(a not in ("--verify",) for a in args):
        print("usage: python -m runtime.packages [--verify]", file=sys.stderr)
        return 2
    pkgs = installed()
    if not pkgs:
        print(f"no artifact packages installed (entry point group {ENTRY_POINT_GROUP})")
        return 1
    status = 0
    for p in pkgs:
        head = f"pkg:{p.name}  {p.distribution} {p.version}  module {p.module}"
        if not p.usable:
            print(f"{head}\n  UNUSABLE: {p.problem}")
            status = 1
            continue
        try:
            store = ArtifactStore(p.artifact_dir)  # type: ignore[arg-type]
            if "--verify" in args:
                for e in (*store.kernels, *store.manifest.quantizers):
                    store.read_cubin(e)
        except ManifestError as exc:
            print(f"{head}\n  UNUSABLE: {exc}")
            status = 1
            continue
        print(f"{head}\n  {p.artifact_dir}  schema {p.info.get('schema_version')}, builder "
              f"{p.info.get('builder_version')}, dsl {p.info.get('dsl_version')}, "
              f"{len(store.kernels)} kernel(s){' (verified)' if '--verify' in args else ''}")
        for e in store.kernels:
            print(f"    {e.name}  {e.symbol}  {e.cubin_bytes} B")
    return status


if __name__ == "__main__":
    sys.exit(main())
