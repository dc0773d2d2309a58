"""Assemble manifests from build results: entries, cubin names, reuse, merge.

Layout of an artifact directory:

    manifest.json                          written last: its presence marks a complete build
    cubins/<family>.<arch>.acc<n>.<f16|bf16>.<key[:12]>.cubin
                                           one per distinct kernel (manifest schema 2), content-
                                           addressed: a changed input changes the name

The manifest is deterministic: kernels and set entries sorted by name, no timestamps and no
compile times (a timing would make two builds of the same inputs differ, and shard + merge
must equal a full build byte for byte). Compile times are printed in the build summary instead.
"""

from __future__ import annotations

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
    Kernel,
    KernelEntry,
    Manifest,
    Quantizer,
    load_manifest,
    make_manifest,
    parse_kernel,
    parse_manifest,
    parse_quantizer,
)

from .elf import cubin_arch
from .errors import BuildError
from .plan import BuildItem, QuantItem
from .selection import check_shards


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cubin_relpath(item: BuildItem) -> str:
    return f"cubins/{item.kernel_name}.cubin"


def quantizer_relpath(item: QuantItem) -> str:
    return f"cubins/{item.record_name}.cubin"


def new_kernel(item: BuildItem, facts: dict[str, Any], sha256: str, nbytes: int) -> Kernel:
    """The kernel record from a worker's launch facts (the objects that built the kernel),
    typed by the runtime's own parser: one conversion from the families' dicts."""
    record = {**facts, "key": item.key, "name": item.kernel_name, "family": item.family,
              "arch": item.arch, "acc_stages": item.acc_stages, "out_dtype": item.out_dtype,
              "options": item.options_dict(), "cubin": cubin_relpath(item), "sha256": sha256,
              "cubin_bytes": nbytes}
    try:
        return parse_kernel(json.loads(json.dumps(record)), item.kernel_name)
    except ManifestError as exc:
        raise BuildError(f"the recorded launch data is not a valid kernel record: {exc}") from exc


def new_quantizer(item: QuantItem, facts: dict[str, Any], sha256: str,
                  nbytes: int) -> Quantizer:
    """The quantizer record from a worker's facts (kernels/sm90/act_quant.compile_quantizer),
    typed and checked by the runtime's own parser."""
    record = {**facts, "key": item.key, "name": item.record_name, "layout": item.layout,
              "arch": item.arch, "cubin": quantizer_relpath(item), "sha256": sha256,
              "cubin_bytes": nbytes}
    try:
        return parse_quantizer(json.loads(json.dumps(record)), item.record_name)
    except ManifestError as exc:
        raise BuildError(f"the recorded quantizer data is not a valid record: {exc}") from exc


def reusable_quantizer(item: QuantItem, old: Manifest | None, directory: Path) -> Quantizer | None:
    """The old quantizer with the item's key, when its record says what the item fixes and its
    cubin is intact (so it needs no compile); else None."""
    for q in old.quantizers if old is not None else ():
        if q.key == item.key and (q.layout, q.arch, q.name) == (item.layout, item.arch,
                                                                item.record_name) \
                and q.cubin == quantizer_relpath(item) and _intact(q, directory):
            return q
    return None


def new_entry(item: BuildItem, kernel: Kernel) -> KernelEntry:
    """The set entry of `item`, served by `kernel` (this build's or a reused one)."""
    return KernelEntry(name=item.name, set=item.set, arch=item.arch, acc_stages=item.acc_stages,
                       out_dtype=item.out_dtype, serves=item.serves(), kernel=kernel)


def validate_entry(entry: KernelEntry) -> None:
    """Fail (in the worker, so the error is reported for this kernel) when the recorded launch
    data would not load in the runtime: e.g. a parameter of an unknown kind or a bad slot."""
    one = make_manifest([entry], "", "")
    try:
        parse_manifest(json.loads(one.to_json()), "entry")
        KernelIndex((entry,))  # the served shapes, as the runtime's dispatch reads them
    except ManifestError as exc:
        raise BuildError(f"the recorded launch data is not a valid manifest entry: {exc}") from exc


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
    """The kernels and quantizers of a manifest that fails as a whole which still pass alone: a
    hand-edited field invalidates its own record (recompiled), not every other one. Set
    entries are not salvaged: the spec gives them again."""
    note = f"the existing manifest cannot be reused ({why}); rebuilding everything"
    try:
        obj = json.loads((directory / MANIFEST_NAME).read_text())
        raw, raw_sets = obj["kernels"], obj["sets"]
        raw_q = obj.get("quantizers") or []
        head = {k: obj[k] for k in ("schema_version", "builder_version", "dsl_version")}
        if not isinstance(raw, list) or not isinstance(raw_sets, list) \
                or not isinstance(raw_q, list):
            raise TypeError("kernels, sets or quantizers is not a list")
        first = parse_manifest({**head, "kernels": [], "sets": []}, str(directory))
    except (OSError, ValueError, RecursionError, KeyError, TypeError, ManifestError):
        return Existing(None, None, (note,))
    names = set()
    for e in raw_sets:
        name = e.get("name") if isinstance(e, dict) else None
        if not isinstance(name, str):
            return Existing(None, None, (note,))
        names.add(name)
    notes: list[str] = []
    good = _parse_each(raw, parse_kernel, "kernel", "kernels", notes)
    good_q = _parse_each(raw_q, parse_quantizer, "quantizer", "quantizers", notes)
    if not good and not good_q:
        return Existing(None, frozenset(names), (note,))
    if not notes:  # every record parses alone: the damage is in the set records
        notes.append(f"the existing set records cannot be reused ({why}); the spec gives them "
                     "again")
    return Existing(first.replace(kernels=tuple(good), quantizers=tuple(good_q)),
                    frozenset(names), tuple(notes))


def _parse_each(raw: list, parse: Any, what: str, field: str, notes: list[str]) -> list:
    """The records of `raw` that parse alone; a note for each that does not."""
    good = []
    for i, k in enumerate(raw):
        try:
            good.append(parse(k, f"{field}[{i}]"))
        except ManifestError as exc:
            label = k.get("name") if isinstance(k, dict) else None
            notes.append(f"the existing {what} {label or i} cannot be reused ({exc}); "
                         "recompiling it")
    return good


def read_existing(directory: Path) -> Existing:
    """The previous build in `directory`, checked as strictly as `runtime.load` checks it."""
    if not (directory / MANIFEST_NAME).is_file():
        return Existing(None, frozenset())
    try:
        m = load_manifest(directory)
    except ManifestError as exc:
        return _salvage(directory, exc)
    return Existing(m, frozenset(e.name for e in m.sets))


def _intact(e: Kernel | Quantizer, directory: Path) -> bool:
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


def reusable(old: Manifest | None, directory: Path) -> dict[str, Kernel]:
    """key -> an old kernel whose cubin is intact, so its items need no compile."""
    out: dict[str, Kernel] = {}
    if old is None:
        return out
    for k in old.kernels:
        if k.key not in out and _intact(k, directory):
            out[k.key] = k
    return out


def derived_mismatch(item: BuildItem, old: Kernel) -> str | None:
    """The first field of an old kernel with the item's key that disagrees with what the spec
    fixes for it (None: none). The key says the inputs are the same, but the record is data on
    disk: a hand-edited `options` that still parses would describe another kernel."""
    checks = (("arch", old.arch, item.arch), ("family", old.family, item.family),
              ("acc_stages", old.acc_stages, item.acc_stages),
              ("out_dtype", old.out_dtype, item.out_dtype),
              ("options", old.options, item.options_dict()),
              ("name", old.name, item.kernel_name), ("cubin", old.cubin, cubin_relpath(item)))
    for field, got, want in checks:
        if got != want:
            return f"{field} must be {want!r} for its key, but got {got!r}"
    return None


def copy_cubin(src: Path, staging: Path, rel: str) -> None:
    dst = staging / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _take_cubin(sources: dict[str, tuple[Path, Any]], d: Path, k: Any, same: bool,
                differ: str) -> None:
    """Note that kernel or quantizer k's cubin comes from shard d, unless its key came from an
    earlier shard (whose record must be the `same`: else BuildError saying how they `differ`);
    the cubin must be there and match its sha256."""
    if k.key in sources:
        if not same:
            raise BuildError(f"{k.name} is in {sources[k.key][0]} and in {d} {differ}; were "
                             "the shards built with different DSL or sources?")
        return
    try:
        path = cubin_path(d, k)
    except ArtifactError as exc:
        raise BuildError(f"cannot merge {d}: {exc}") from exc
    if not path.is_file() or sha256_file(path) != k.sha256:
        raise BuildError(f"cannot merge {d}: cubin {k.cubin} of {k.name} is missing or "
                         "does not match its sha256; run `verify` on it")
    sources[k.key] = (d, k)


def merge_manifests(dirs: list[Path]) -> tuple[Manifest, list[tuple[Path, Any]]]:
    """One manifest from shard directories, and (source dir, kernel or quantizer record) of
    each cubin to copy."""
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
    cubins: dict[str, tuple[Path, Kernel]] = {}  # kernel key -> where its cubin comes from
    for d, m in loaded:
        for e in m.sets:
            if e.name in chosen:
                first_dir, first = chosen[e.name]
                if (first.key, first.sha256) != (e.key, e.sha256):
                    raise BuildError(f"kernel {e.name} is in {first_dir} (key {first.key[:12]}) "
                                     f"and in {d} (key {e.key[:12]}) with different keys; "
                                     "were the shards built from different sources or specs?")
                if first.serves != e.serves:
                    raise BuildError(f"kernel {e.name} serves {first.serves.record()} in "
                                     f"{first_dir} but {e.serves.record()} in {d}; were the "
                                     "shards built from different specs?")
                continue
            chosen[e.name] = (d, e)
        for k in m.kernels:
            _take_cubin(cubins, d, k, cubins.get(k.key, (d, k))[1].sha256 == k.sha256,
                        "with different cubins (sha256)")
    quantizers: dict[str, tuple[Path, Quantizer]] = {}  # key -> where its cubin comes from
    for d, m in loaded:  # every shard builds them: one per key
        for q in m.quantizers:
            _take_cubin(quantizers, d, q, quantizers.get(q.key, (d, q))[1] == q,
                        "with different records")
    fingerprint, shard = check_shards(loaded)
    first_m = loaded[0][1] if loaded else None
    # Each entry keeps the kernel record of the directory its cubin is copied from.
    entries = [e.replace(kernel=cubins[e.key][1]) for _, e in chosen.values()]
    manifest = make_manifest(entries, first_m.builder_version if first_m else "",
                             first_m.dsl_version if first_m else "", fingerprint, shard,
                             [q for _, q in quantizers.values()])
    return manifest, [*cubins.values(), *quantizers.values()]
