"""Re-check an artifact directory: every problem found, not just the first."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from runtime.errors import ArtifactError, ManifestError
from runtime.loader import check_param_layout, cubin_param_layout, cubin_path
from runtime.manifest import (
    MANIFEST_NAME,
    kernel_name,
    kernel_record_name,
    load_manifest,
    pack_offsets,
)

from .elf import check_cubin_arch
from .errors import BuildError


def verify_dir(directory: Path) -> list[str]:
    """Problems with `directory`: schema, each cubin's presence, size, sha256, ELF arch and
    symbol, the recorded parameter offsets (against their own packing and against the
    parameter list in the cubin's .nv.info), and files the manifest does not name."""
    try:
        manifest = load_manifest(directory)
    except ManifestError as exc:
        return [str(exc)]
    problems: list[str] = []
    expected = {MANIFEST_NAME}
    for s in manifest.sets:
        want_name = kernel_name(s.set, s.arch, s.acc_stages, s.out_dtype)
        if s.name != want_name:
            problems.append(f"{s.name}: name must be <set>.<arch>.acc<stages>.<out> = "
                            f"{want_name}, but got {s.name}")
    for e in manifest.kernels:
        expected.add(Path(e.cubin).as_posix())
        want_name = kernel_record_name(e.family, e.arch, e.acc_stages, e.out_dtype, e.key)
        if e.name != want_name:
            problems.append(f"{e.name}: name must be <family>.<arch>.acc<stages>.<out>.<key[:12]>"
                            f" = {want_name}, but got {e.name}")
        problems += _cubin_problems(directory, e)
    for q in manifest.quantizers:  # their names are checked at parse
        expected.add(Path(q.cubin).as_posix())
        problems += _cubin_problems(directory, q)
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel not in expected:
            problems.append(f"stray file {rel} (not in the manifest)")
    return problems


def _cubin_problems(directory: Path, e: Any) -> list[str]:
    """A kernel's or quantizer's parameter offsets against their own packing, and its cubin:
    presence, size, sha256, ELF arch, symbol and the recorded parameter list against the one in
    the cubin's .nv.info."""
    problems: list[str] = []
    want = pack_offsets([(p.size, p.align) for p in e.params])
    got = [p.offset for p in e.params]
    if got != want:
        problems.append(f"{e.name}: parameter offsets must be {want} for the recorded sizes "
                        f"and alignments, but got {got}")
    try:
        path = cubin_path(directory, e)
    except ArtifactError as exc:
        problems.append(f"{e.name}: {exc}")
        return problems
    if not path.is_file():
        problems.append(f"{e.name}: cubin {e.cubin} is missing")
        return problems
    data = path.read_bytes()
    if len(data) != e.cubin_bytes:
        problems.append(f"{e.name}: cubin {e.cubin} has {len(data)} bytes, manifest says "
                        f"{e.cubin_bytes}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != e.sha256:
        problems.append(f"{e.name}: cubin {e.cubin} has sha256 {digest[:16]}..., manifest "
                        f"says {e.sha256[:16]}... (altered or corrupt: rebuild it)")
    try:
        check_cubin_arch(data, e.arch, e.cubin)
    except BuildError as exc:
        problems.append(f"{e.name}: {exc}")
    if b"\0" + e.symbol.encode() + b"\0" not in data:
        problems.append(f"{e.name}: symbol {e.symbol!r} is not in cubin {e.cubin}")
        return problems
    try:  # the ABI against the parameter list ptxas recorded in the cubin
        layout = cubin_param_layout(data, e.symbol)
        if layout is not None:
            check_param_layout(e, layout)
    except ValueError as exc:
        problems.append(f"{e.name}: cubin {e.cubin}: {exc}")
    except ArtifactError as exc:
        problems.append(f"{e.name}: {exc}")
    return problems
