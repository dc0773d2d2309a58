"""Assemble manifests from build results: entries, cubin names, reuse, merge.

Layout of an artifact directory:

    manifest.json                          written last: its presence marks a complete build
    cubins/<name>.<key[:12]>.cubin         content-addressed: a changed input changes the name

The manifest is deterministic: entries sorted by name, no timestamps, and compile_seconds left
at 0 (a timing would make two builds of the same inputs differ, and shard + merge must equal a
full build byte for byte). Compile times are printed in the build summary instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.dispatch import KernelIndex
from runtime.errors import ArtifactError, ManifestError
from runtime.loader import cubin_path
from runtime.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    KernelEntry,
    Manifest,
    Param,
    TmaGeometry,
    load_manifest,
    parse_manifest,
)

from .elf import cubin_arch
from .errors import BuildError
from .plan import BuildItem
from .selection import check_shards


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cubin_relpath(item: BuildItem) -> str:
    return f"cubins/{item.name}.{item.key[:12]}.cubin"


def _param(d: dict[str, Any]) -> Param:
    d = dict(d)
    if d.get("tma") is not None:
        d["tma"] = TmaGeometry(**{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in d["tma"].items()})
    return Param(**d)


def new_entry(item: BuildItem, kernel: dict[str, Any], sha256: str, nbytes: int) -> KernelEntry:
    """A manifest entry from a worker's result (the objects that built the kernel)."""
    return KernelEntry(
        name=item.name, key=item.key, set=item.set, arch=item.arch, family=item.family,
        acc_stages=item.acc_stages, symbol=kernel["symbol"], cubin=cubin_relpath(item),
        sha256=sha256, cubin_bytes=nbytes, block=tuple(kernel["block"]),
        cluster=tuple(kernel["cluster"]), dynamic_smem=kernel["dynamic_smem"],
        sm_count=kernel["sm_count"], grid=kernel["grid"], tile=kernel["tile"],
        constraints=kernel["constraints"], tables=kernel["tables"],
        params=tuple(_param(p) for p in kernel["params"]), options=item.options_dict(),
        out_dtype=item.out_dtype)


def validate_entry(entry: KernelEntry) -> None:
    """Fail (in the worker, so the error is reported for this kernel) when the recorded launch
    data would not load in the runtime: e.g. a parameter of an unknown kind or a bad slot."""
    one = Manifest(schema_version=SCHEMA_VERSION, builder_version="", dsl_version="",
                   kernels=(entry,))
    try:
        parse_manifest(json.loads(one.to_json()), "entry")
        KernelIndex((entry,))  # the served shapes, as the runtime's dispatch reads them
    except ManifestError as exc:
        raise BuildError(f"the recorded launch data is not a valid manifest entry: {exc}") from exc


def reused_entry(item: BuildItem, old: KernelEntry) -> KernelEntry:
    """An old entry with the same key, renamed for this item (the key ignores the set name)."""
    return dataclasses.replace(old, name=item.name, set=item.set, cubin=cubin_relpath(item),
                               compile_seconds=0.0)


def make_manifest(entries: list[KernelEntry], builder_version: str, dsl_version: str,
                  spec_fingerprint: str = "", shard: tuple[int, int] | None = None) -> Manifest:
    return Manifest(schema_version=SCHEMA_VERSION, builder_version=builder_version,
                    dsl_version=dsl_version, kernels=tuple(sorted(entries, key=lambda e: e.name)),
                    spec_fingerprint=spec_fingerprint, shard=shard)


def manifest_text(manifest: Manifest, source: str) -> str:
    """The JSON to write, validated by the runtime's own parser first: a manifest the runtime
    would reject must fail the build, not the first load in production."""
    text = manifest.to_json()
    try:
        parse_manifest(json.loads(text), source)
    except ManifestError as exc:
        raise BuildError(f"the assembled manifest is invalid: {exc}") from exc
    return text


def write_manifest(directory: Path, manifest: Manifest) -> None:
    (directory / MANIFEST_NAME).write_text(manifest_text(manifest, str(directory)))


@dataclass(frozen=True)
class Existing:
    """What a previous build left in the target directory.

    manifest: its entries that pass the runtime's own checks (None: no manifest, or none that
    can be read); names: the name of every entry it holds, good or bad (None: not readable, so
    unknown); notes: what could not be reused, and why."""

    manifest: Manifest | None
    names: frozenset[str] | None
    notes: tuple[str, ...] = ()


def _salvage(directory: Path, why: ManifestError) -> Existing:
    """The entries of a manifest that fails as a whole which still pass alone: a hand-edited
    field invalidates its own kernel (recompiled), not every other one."""
    note = f"the existing manifest cannot be reused ({why}); rebuilding everything"
    try:
        obj = json.loads((directory / MANIFEST_NAME).read_text())
        raw = obj["kernels"]
        head = {k: obj[k] for k in ("schema_version", "builder_version", "dsl_version")}
        if not isinstance(raw, list):
            raise TypeError("kernels is not a list")
        first = parse_manifest({**head, "kernels": []}, str(directory))
    except (OSError, ValueError, KeyError, TypeError, ManifestError):
        return Existing(None, None, (note,))
    good, names, notes = [], set(), []
    for i, k in enumerate(raw):
        name = k.get("name") if isinstance(k, dict) else None
        if not isinstance(name, str):
            return Existing(None, None, (note,))
        names.add(name)
        try:
            good.extend(parse_manifest({**head, "kernels": [k]}, f"kernels[{i}]").kernels)
        except ManifestError as exc:
            notes.append(f"the existing entry of {name} cannot be reused ({exc}); recompiling it")
    if not good:
        return Existing(None, frozenset(names), (note,))
    return Existing(dataclasses.replace(first, kernels=tuple(good)), frozenset(names),
                    tuple(notes))


def read_existing(directory: Path) -> Existing:
    """The previous build in `directory`, checked as strictly as `runtime.load` checks it."""
    if not (directory / MANIFEST_NAME).is_file():
        return Existing(None, frozenset())
    try:
        m = load_manifest(directory)
    except ManifestError as exc:
        return _salvage(directory, exc)
    return Existing(m, frozenset(e.name for e in m.kernels))


def _intact(e: KernelEntry, directory: Path) -> bool:
    """The cubin is there, inside the directory, has its recorded sha256, arch and symbol (a
    hand-edited manifest can make a wrong cubin's sha256 match; the arch and symbol checks cost
    nothing more)."""
    try:
        path = cubin_path(directory, e)
    except ArtifactError:
        return False
    if not path.is_file():
        return False
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != e.sha256 or b"\0" + e.symbol.encode() + b"\0" \
            not in data:
        return False
    try:
        return cubin_arch(data) == e.arch
    except BuildError:
        return False


def reusable(old: Manifest | None, directory: Path) -> dict[str, KernelEntry]:
    """key -> an old entry whose cubin is intact, so the item need not be compiled again."""
    out: dict[str, KernelEntry] = {}
    if old is None:
        return out
    for e in old.kernels:
        if e.key not in out and _intact(e, directory):
            out[e.key] = e
    return out


def derived_mismatch(item: BuildItem, old: KernelEntry) -> str | None:
    """The first field of an old entry with the item's key that disagrees with what the spec
    fixes for the item (None: none). The key says the inputs are the same, but the entry is
    data on disk: a hand-edited `constraints` that still parses would serve other shapes."""
    if item.dynamic_m:
        want_c: Any = ("dynamic_m", {"groups": [list(g) for g in item.groups],
                                     "max_m": item.max_m})
    else:
        want_c = ("groups", [list(g) for g in item.groups])
    checks = (("arch", old.arch, item.arch), ("family", old.family, item.family),
              ("acc_stages", old.acc_stages, item.acc_stages),
              ("out_dtype", old.out_dtype, item.out_dtype),
              ("options", old.options, item.options_dict()),
              (f"constraints.{want_c[0]}", old.constraints.get(want_c[0]), want_c[1]))
    for field, got, want in checks:
        if got != want:
            return f"{field} must be {want!r} for its key, but got {got!r}"
    return None


def copy_cubin(src: Path, staging: Path, rel: str) -> None:
    dst = staging / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def merge_manifests(dirs: list[Path]) -> tuple[Manifest, list[tuple[Path, KernelEntry]]]:
    """One manifest from shard directories, and (source dir, entry) of each cubin to copy."""
    loaded = []
    for d in dirs:
        try:
            loaded.append((d, load_manifest(d)))
        except ManifestError as exc:
            raise BuildError(f"cannot merge {d}: {exc}") from exc
    for field in ("builder_version", "dsl_version"):
        values = {getattr(m, field) for _, m in loaded}
        if len(values) > 1:
            seen = ", ".join(f"{d} has {getattr(m, field)!r}" for d, m in loaded)
            raise BuildError(f"shards must share one {field.replace('_', ' ')}, but {seen}; "
                             "rebuild them with the same builder and DSL")
    chosen: dict[str, tuple[Path, KernelEntry]] = {}
    for d, m in loaded:
        for e in m.kernels:
            if e.name in chosen:
                first_dir, first = chosen[e.name]
                if (first.key, first.sha256) != (e.key, e.sha256):
                    raise BuildError(f"kernel {e.name} is in {first_dir} (key {first.key[:12]}) "
                                     f"and in {d} (key {e.key[:12]}) with different keys; "
                                     "were the shards built from different sources or specs?")
                continue
            try:
                path = cubin_path(d, e)
            except ArtifactError as exc:
                raise BuildError(f"cannot merge {d}: {exc}") from exc
            if not path.is_file() or sha256_file(path) != e.sha256:
                raise BuildError(f"cannot merge {d}: cubin {e.cubin} of {e.name} is missing or "
                                 "does not match its sha256; run `verify` on it")
            chosen[e.name] = (d, e)
    fingerprint, shard = check_shards(loaded)
    first = loaded[0][1] if loaded else None
    manifest = make_manifest([e for _, e in chosen.values()],
                             first.builder_version if first else "",
                             first.dsl_version if first else "", fingerprint, shard)
    return manifest, list(chosen.values())
