"""Expand a ShapeSpec into a sorted list of plain-data build items, each with a content key.

An item is everything a worker needs to compile one kernel, as data (no closures), so a build
can be listed, sharded, shipped to a subprocess as JSON and compared with a previous manifest.

One item per (set, arch, acc stage, out dtype): a manifest set entry. Its `key` is the key of
the KERNEL that serves it (manifest schema 2): a sha256 over every input that can change the
cubin or what the manifest records about the kernel: the family's kernel sources (every file
under its directory, every shared file under kernels/ such as the ABI recorder and family
table, and the manifest schema and shared formats), every installed nvidia-cutlass-dsl*
distribution version, the Python major.minor, the arch, family, acc stages, out dtype, the
full config options, and BUILDER_VERSION. A set's name and shapes are left out: the families
compile shape-generic kernels (they read every problem size from the problem-size table), so
sets with one config share one kernel, compiled once. Before schema 2 the key covered the
set's groups, and the default shapes.yaml compiled 108 cubins for far fewer kernels.
Paths enter the hash relative to their package, so two checkouts (CI shards) agree on keys.

The families take `groups` as (m, n, k) rows (to check them and record them); the builder
compiles each kernel with the rows of the first item (by name) it serves (`compile_groups`,
m = a placeholder for dynamic-m sets) and records each set's own shapes as its `serves`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernels.families import OWN_KEYS
from runtime.formats import MAX_SHARDS  # merge needs all n shards; the manifest reader's bound
from runtime.manifest import Serves, kernel_name, kernel_record_name, quantizer_name

from .families import DEFAULT_MODULE, Families, load_families
from .spec import ShapeSpec

# Bump when the builder changes what it records for a kernel (entry fields, ABI checks), so
# that every existing artifact is rebuilt rather than silently reused.
BUILDER_VERSION = "3"  # 2: out_dtype and the alpha table; 3: manifest schema 2
REPO_ROOT = Path(__file__).resolve().parents[1]
KERNELS_DIR = REPO_ROOT / "kernels"
# Outside kernels/ but shared by every family: the schema the recorded ABI must fit.
COMMON_SOURCES = ("runtime/manifest.py", "runtime/formats.py")
DSL_PREFIX = "nvidia-cutlass-dsl"


# The m a dynamic-m item passes to compile_kernel when the set gives no max_m. The cubin does
# not depend on it (the kernels read m from the problem-size table); it only has to be legal.
DYNAMIC_M_PLACEHOLDER = 128


@dataclass(frozen=True)
class BuildItem:
    set: str
    arch: str
    family: str
    acc_stages: int
    options: tuple[tuple[str, Any], ...]  # every config field except acc_stages, sorted
    groups: tuple[tuple[int, ...], ...]  # (m, n, k) per group; (n, k) when dynamic_m
    key: str
    dynamic_m: bool = False
    max_m: int | None = None
    out_dtype: str = "float16"  # the element type C is written in (a config field of its own)

    @property
    def name(self) -> str:
        return kernel_name(self.set, self.arch, self.acc_stages, self.out_dtype)

    def describe(self) -> str:
        return (f"set {self.set}, arch {self.arch}, acc stages {self.acc_stages}, "
                f"out {self.out_dtype}")

    def options_dict(self) -> dict[str, Any]:
        return dict(self.options)

    def to_dict(self) -> dict[str, Any]:
        return {"set": self.set, "arch": self.arch, "family": self.family,
                "acc_stages": self.acc_stages, "options": self.options_dict(),
                "groups": [list(g) for g in self.groups], "key": self.key,
                "dynamic_m": self.dynamic_m, "max_m": self.max_m, "out_dtype": self.out_dtype}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BuildItem:
        max_m = d.get("max_m")
        return cls(set=d["set"], arch=d["arch"], family=d["family"],
                   acc_stages=int(d["acc_stages"]), options=tuple(sorted(d["options"].items())),
                   groups=tuple(tuple(int(x) for x in g) for g in d["groups"]), key=d["key"],
                   dynamic_m=bool(d.get("dynamic_m", False)),
                   max_m=None if max_m is None else int(max_m),
                   out_dtype=str(d.get("out_dtype", "float16")))

    def compile_groups(self) -> list[list[int]]:
        """The (m, n, k) rows to pass to the family's compile_kernel."""
        if not self.dynamic_m:
            return [list(g) for g in self.groups]
        m = self.max_m if self.max_m is not None else DYNAMIC_M_PLACEHOLDER
        return [[m, n, k] for n, k in self.groups]

    @property
    def kernel_name(self) -> str:
        """The name of the kernel record this item's key addresses."""
        return kernel_record_name(self.family, self.arch, self.acc_stages, self.out_dtype,
                                  self.key)

    def serves(self) -> Serves:
        """What the manifest records that this set serves."""
        return Serves(groups=self.groups, dynamic_m=self.dynamic_m,
                      max_m=self.max_m if self.dynamic_m else None)


@dataclass(frozen=True)
class QuantItem:
    """One activation quantizer to build (a manifest `quantizers` record): per (arch, layout)
    of the families the spec builds for, whatever sets --only or --shard select, so a
    selective build never drops one and every shard carries the same ones (merge keeps one
    per key). Its key hashes what a kernel's does, less the config, plus the layout."""

    arch: str
    family: str
    layout: str
    key: str

    @property
    def name(self) -> str:
        return f"act_quant_{self.layout}.{self.arch}"

    @property
    def record_name(self) -> str:
        return quantizer_name(self.layout, self.arch, self.key)

    def describe(self) -> str:
        return f"activation quantizer, layout {self.layout}, arch {self.arch}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "quantizer", "arch": self.arch, "family": self.family,
                "layout": self.layout, "key": self.key}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantItem:
        return cls(arch=d["arch"], family=d["family"], layout=d["layout"], key=d["key"])


def item_from_dict(d: dict[str, Any]) -> BuildItem | QuantItem:
    """A worker job's item: a quantizer's dict says so by its `kind`."""
    return QuantItem.from_dict(d) if d.get("kind") == "quantizer" else BuildItem.from_dict(d)


# --------------------------------------------------------------------------------------------
# Fingerprints
# --------------------------------------------------------------------------------------------


def dsl_versions() -> dict[str, str]:
    """Every installed nvidia-cutlass-dsl* distribution: the libs wheels are versioned apart."""
    out = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith(DSL_PREFIX):
            out[name] = dist.version
    return dict(sorted(out.items()))


def dsl_version() -> str:
    return dsl_versions().get(DSL_PREFIX, "none")


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _tree_files(root: Path) -> list[Path]:
    # Caches and hidden files (editor swap files) must not change the key.
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and not any(part.startswith(".") for part in p.relative_to(root).parts)
                  and p.suffix != ".pyc")


def _family_root(family: Any) -> Path:
    return Path(family.config.__file__).resolve().parent


def family_sources(family: Any, families: Families) -> list[tuple[str, Path]]:
    """(label, path) of every source file a family's cubins depend on: its own directory, and
    everything else under kernels/ except the other families' directories (kernels/abi.py,
    kernels/families.py and any shared helper added later), plus COMMON_SOURCES."""
    root = _family_root(family)
    files = [(f"{family.name}/{p.relative_to(root).as_posix()}", p) for p in _tree_files(root)]
    spec = importlib.util.find_spec(family.compile_module)  # imports parent packages only
    if spec is not None and spec.origin:
        origin = Path(spec.origin).resolve()
        if root not in origin.parents:
            files.append((family.compile_module, origin))
    # Other families' directories are theirs, including the default families' when a test
    # injects fake ones (their sources must not change the fake kernels' keys).
    fams = [*families.by_arch.values()]
    if families.module != DEFAULT_MODULE:
        fams += load_families(DEFAULT_MODULE).by_arch.values()
    others = {_family_root(f) for f in fams} - {root}
    for p in _tree_files(KERNELS_DIR):
        if not any(o == p or o in p.parents for o in others) and root not in p.parents:
            files.append((f"kernels/{p.relative_to(KERNELS_DIR).as_posix()}", p))
    files += [(rel, REPO_ROOT / rel) for rel in COMMON_SOURCES]
    mod_file = families.module_file()
    if not mod_file.is_relative_to(KERNELS_DIR):
        files.append((families.module, mod_file))
    return files


def fingerprint(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for label, path in files:
        data = path.read_bytes()
        h.update(f"{label}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def item_key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Expansion, selection, sharding
# --------------------------------------------------------------------------------------------


def expand(spec: ShapeSpec, families: Families, only: tuple[str, ...] = ()) -> list[BuildItem]:
    """One item per (set, arch, acc stage, out dtype), sorted by name (the manifest's order);
    items with one key are served by one kernel (`compile_list`)."""
    env = {"builder": BUILDER_VERSION, "python": python_version(), "dsl": dsl_versions()}
    prints: dict[str, str] = {}
    items = []
    for s in spec.sets:
        if only and s.name not in only:
            continue
        for build in s.builds:
            family = families.family_for(build.arch)
            if family.name not in prints:
                prints[family.name] = fingerprint(family_sources(family, families))
            for acc, out_dtype in itertools.product(build.acc_stages, s.out_dtypes):
                cfg = dataclasses.asdict(family.make_config(acc, build.options_dict(), out_dtype))
                options = tuple(sorted((k, v) for k, v in cfg.items() if k not in OWN_KEYS))
                # The kernel's inputs only: no set name, groups or max_m (module docstring).
                inputs = {**env, "sources": prints[family.name], "arch": build.arch,
                          "family": family.name, "acc_stages": acc, "out_dtype": out_dtype,
                          "options": dict(options)}
                items.append(BuildItem(set=s.name, arch=build.arch, family=family.name,
                                       acc_stages=acc, options=options, groups=s.groups,
                                       key=item_key(inputs), dynamic_m=s.dynamic_m,
                                       max_m=s.max_m, out_dtype=out_dtype))
    return sorted(items, key=lambda it: it.name)


def expand_quantizers(spec: ShapeSpec, families: Families) -> list[QuantItem]:
    """One QuantItem per layout of each arch the spec builds whose family has quantizers,
    sorted by name."""
    env = {"builder": BUILDER_VERSION, "python": python_version(), "dsl": dsl_versions()}
    archs = sorted({build.arch for s in spec.sets for build in s.builds})
    out = []
    for arch in archs:
        family = families.family_for(arch)
        layouts = getattr(family, "quantizer_layouts", ())
        if not layouts:
            continue
        sources = fingerprint(family_sources(family, families))
        for layout in layouts:
            inputs = {**env, "sources": sources, "arch": arch, "family": family.name,
                      "quantizer": layout}
            out.append(QuantItem(arch=arch, family=family.name, layout=layout,
                                 key=item_key(inputs)))
    return sorted(out, key=lambda q: q.name)


def compile_list(items: list[BuildItem]) -> list[BuildItem]:
    """The first item (by name) of each key: one compile per distinct kernel."""
    first: dict[str, BuildItem] = {}
    for it in sorted(items, key=lambda it: it.name):
        first.setdefault(it.key, it)
    return list(first.values())


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' -> (i, n), 0-based: shard i of n."""
    try:
        i_text, n_text = text.split("/")
        i, n = int(i_text), int(n_text)
    except ValueError:
        raise ValueError(f"--shard must be i/n (e.g. 0/4), but got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard i/n must have 0 <= i < n (i is 0-based), but got {text!r}")
    if n > MAX_SHARDS:
        raise ValueError(f"--shard i/n must have n <= {MAX_SHARDS} (merge takes every shard of "
                         f"n), but got {text!r}")
    return i, n


def shard(items: list[BuildItem], index: int, count: int) -> list[BuildItem]:
    """A deterministic slice: every count-th item of the sorted list, starting at index."""
    return items[index::count]
