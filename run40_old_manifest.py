"""The artifact manifest: its schema, parsing and validation.

This module is the single definition of `artifacts/manifest.json`. The builder writes manifests
through `Manifest.to_json`; the runtime reads them through `load_manifest`. Neither side spells a
field name anywhere else.

Schema 2 (issue 25; docs/manifest.md) has two lists:
- `kernels`: each distinct compiled kernel once, content-addressed by its `key` (family, arch,
  config incl. acc stages and out dtype, sources, DSL, builder, Python; never a set's shapes).
  A kernel record carries everything needed to launch the cubin without the DSL: symbol, block
  and cluster dims, dynamic shared memory, the grid policy, the tile the CTA prefix table
  counts, the layout of every device table, the per-group limits, and the launch ABI: each
  `.entry` parameter in order with its offset, size, alignment and the rule that fills it.
- `sets`: one record per (set, arch, acc stages, out dtype), named
  "<set>.<arch>.acc<n>.<f16|bf16>", pointing at the kernel that serves it by key and recording
  what it serves (an exact (m, n, k) list, or dynamic m: an (n, k) list and max_m).
Parsing gives typed, frozen records (Kernel, KernelEntry, Grid, Tile, Tables, ...); the runtime
selects among `sets` and launches the entry's kernel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .errors import ManifestError
from .formats import MAX_GROUPS, MAX_SHARDS, TABLE_DTYPES
from .records import Record, asdict, fields

# 2: kernels content-addressed, sets point at them (issue 25). 3: an expert set's E equal
# (n, k) rows are written once, `experts: E` (cold start, eighteenth session).
SCHEMA_VERSION = 3
MANIFEST_NAME = "manifest.json"

ARCHS = ("sm_90a", "sm_100a")
# Compute capability (major, minor) that runs each arch's cubins.
ARCH_CAPABILITY = {"sm_90a": (9, 0), "sm_100a": (10, 0)}

# How the runtime fills a parameter.
PARAM_KINDS = ("table", "tma_template", "scalar", "zeros", "operand")
# Device tables a `table` parameter points at. grid_barrier is the zeroed header_bytes of the
# tensormap workspace record (kernels/tables.py): the runtime passes the eager workspace's header
# or, for a launch under graph capture, a persistent zeroed copy of its own.
# alpha: one float32 per group, multiplied into the fp32 accumulator before the cast to the
# output type; the runtime passes the caller's (G,) tensor or a persistent array of ones.
TABLES = ("problem_sizes", "pointers", "cta_prefix", "tensormap_workspace", "grid_barrier",
          "alpha")
# Values a `scalar` parameter can carry.
# rows, n, k: a device-offsets kernel's call (T rows of a, every expert's N and K).
# max_m: a masked-layout kernel's rows per expert (a's second dimension).
SCALARS = ("num_groups", "rows", "n", "k", "max_m")
# Operands a tensor-map template describes, and the columns of the pointer table.
OPERANDS = ("a", "b", "sfa", "sfb", "c")
# Caller tensors whose device address an `operand` parameter carries (device-offsets kernels,
# Config.device_offsets: they derive their tables from these on the device): the stacked
# operands, the output and the int32 expert end offsets.
CALL_OPERANDS = ("a", "b", "sfa", "sfb", "c", "offs", "masked_m")
# The activation quantizers (Quantizer records; kernels/sm90/act_quant.py): bf16 tokens ->
# NVFP4 a and blocked sfa for one serving layout. Their operand and scalar parameters carry
# these names (a vocabulary of their own: they share no table or operand with the GEMMs).
QUANT_LAYOUTS = ("experts", "masked")
QUANT_OPERANDS = ("x", "offs", "scales", "a", "sfa", "masked_m")
QUANT_SCALARS = ("rows", "k", "experts", "blocks", "max_m", "sfa_chunks", "quant_ctas")
# The values runtime/quantize.py passes to each layout's kernel, by role: a record must take
# each exactly once (a renamed or repeated role would put one pointer in two slots).
QUANT_ROLES = {"experts": frozenset({"x", "offs", "scales", "a", "sfa", "rows", "k", "experts",
                                     "blocks"}),
               "masked": frozenset({"x", "scales", "a", "sfa", "max_m", "k", "experts",
                                    "blocks"})}
# Taken at most once, by layout: `sfa_chunks` (sfa's 16-byte chunks) marks a kernel that
# writes every byte of sfa, its padding's zeros from CTAs after the quantizing ones
# (twenty-seventh session); a record without it (built before) needs sfa zeroed first.
# `masked_m` and `quant_ctas` (together, twenty-eighth session): a masked kernel that takes the
# valid rows of each expert (or a null address) and quantizes grid-stride from quant_ctas
# CTAs; a record without them (built before) quantizes every row, one block per thread.
QUANT_OPTIONAL_ROLES = {"experts": frozenset({"sfa_chunks"}),
                        "masked": frozenset({"sfa_chunks", "masked_m", "quant_ctas"})}
# Optional roles a record takes all or none of.
QUANT_ROLES_TOGETHER = (frozenset({"masked_m", "quant_ctas"}),)
# Output element types a kernel can be built for (shapes.yaml `out_dtypes`), by torch name, and
# the short form in kernel names ("<set>.<arch>.acc<n>.<short>").
OUT_DTYPES = ("float16", "bfloat16")
OUT_DTYPE_SHORT = {"float16": "f16", "bfloat16": "bf16"}


def kernel_name(set_name: str, arch: str, acc_stages: int, out_dtype: str) -> str:
    """The one spelling of a kernel's name: "<set>.<arch>.acc<stages>.<f16|bf16>"."""
    return f"{set_name}.{arch}.acc{acc_stages}.{OUT_DTYPE_SHORT[out_dtype]}"

# A kernel record's readable name; its key makes it unique.
def kernel_record_name(family: str, arch: str, acc_stages: int, out_dtype: str, key: str) -> str:
    return f"{family}.{arch}.acc{acc_stages}.{OUT_DTYPE_SHORT[out_dtype]}.{key[:12]}"


_DYNAMIC_GROUPS_FORM = '{"groups": [[n, k], ...], "max_m": int or null}'
_DYNAMIC_EXPERTS_FORM = '{"experts": E, "group": [n, k], "max_m": int or null}'
_DYNAMIC_FORM = f"{_DYNAMIC_GROUPS_FORM} or {_DYNAMIC_EXPERTS_FORM}"
_SERVES_FORM = '{"groups": [[m, n, k], ...]} or {"dynamic_m": {...}}'
TMA_DTYPES = ("UINT8", "UINT16", "UINT32", "INT32", "UINT64", "FLOAT16", "16U4_ALIGN8B",
              "16U4_ALIGN16B")
# The `.entry` name in the cubin (ASCII: verify and the build search the ELF for its bytes).
_SYMBOL_RE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
TMA_SWIZZLES = ("NONE", "32B", "64B", "128B")
TMA_L2_PROMOTIONS = ("NONE", "64B", "128B", "256B")
TMA_OOB_FILLS = ("NONE", "NAN_REQUEST_ZERO_FMA")


class TmaGeometry(Record):
    """Arguments of `cuTensorMapEncodeTiled` for a template. Dims and strides describe a placeholder
    tensor: the kernel patches address, dims and strides per group in its workspace, so only
    dtype, rank, box, element strides, swizzle, interleave, promotion and fill must be exact."""

    dtype: str
    dims: tuple[int, ...]  # innermost first, as the driver takes them
    strides: tuple[int, ...]  # bytes, for dims[1:]
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    swizzle: str = "NONE"
    interleave: str = "NONE"
    l2_promotion: str = "NONE"
    oob_fill: str = "NONE"


class Param(Record):
    name: str
    kind: str
    offset: int
    size: int
    align: int
    table: str | None = None  # kind == "table"
    operand: str | None = None  # kind == "tma_template" (OPERANDS) or "operand" (CALL_OPERANDS)
    tma: TmaGeometry | None = None  # kind == "tma_template"
    value: str | None = None  # kind == "scalar"


# --------------------------------------------------------------------------------------------
# Launch facts: typed at parse time, so no caller spells a key of an untyped dict. Each has
# `record()`, its JSON form: the same dict the kernel family returned (keys left out when
# they hold their default), so a schema-2 record equals the schema-1 dict it replaces.
# --------------------------------------------------------------------------------------------


class Grid(Record):
    """How many CTAs to launch: persistent, min(tiles, SMs x ctas_per_sm) rounded up to whole
    clusters; every_sm: SMs x ctas_per_sm whatever the tile count; cooperative: the kernel has
    a grid-wide barrier, so the launch must make every CTA resident."""

    policy: str
    ctas_per_sm: int
    cooperative: bool = False
    every_sm: bool = False

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.policy, "ctas_per_sm": self.ctas_per_sm}
        if self.cooperative:
            out["cooperative"] = True
        if self.every_sm:
            out["every_sm"] = True
        return out


class Tile(Record):
    """The output tile the CTA prefix table counts (k: the K step, informational)."""

    m: int
    n: int
    k: int | None = None

    def record(self) -> dict[str, Any]:
        return {"m": self.m, "n": self.n, **({"k": self.k} if self.k is not None else {})}


class TableFormat(Record):
    """An integer device table: element type and, for 2-D tables, the column order."""

    dtype: str
    columns: tuple[str, ...] = ()

    def record(self) -> dict[str, Any]:
        return {"dtype": self.dtype, **({"columns": list(self.columns)} if self.columns else {})}


class Workspace(Record):
    """The tensormap workspace (kernels/tables.py): header_bytes zeroed by the runtime, then
    bytes_per_cta per launched CTA, then bytes_per_a_element per element of every group's A."""

    bytes_per_cta: int
    align: int
    header_bytes: int = 0
    bytes_per_a_element: int = 0

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bytes_per_cta": self.bytes_per_cta, "align": self.align}
        if self.header_bytes:
            out["header_bytes"] = self.header_bytes
        if self.bytes_per_a_element:
            out["bytes_per_a_element"] = self.bytes_per_a_element
        return out


class Tables(Record):
    problem_sizes: TableFormat
    pointers: TableFormat
    cta_prefix: TableFormat
    tensormap_workspace: Workspace

    def record(self) -> dict[str, Any]:
        return {k: getattr(self, k).record() for k in fields(self)}


class Limits(Record):
    """Per-group shape rules of a kernel: k and n must be multiples of these."""

    k_multiple: int = 1
    n_multiple: int = 1

    def record(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in fields(self) if getattr(self, k) != 1}


class Serves(Record):
    """What a set serves with its kernel: exactly `groups` ((m, n, k) rows), or, with
    dynamic_m, every call with `groups` as its (n, k) rows in order and any m >= 0 per group,
    up to max_m when that is not None."""

    groups: tuple[tuple[int, ...], ...]
    dynamic_m: bool = False
    max_m: int | None = None

    @property
    def one_row(self) -> bool:
        """Whether every group has the same row (an expert set: E equal (n, k))."""
        g = self.groups
        return g.count(g[0]) == len(g)

    def record(self) -> dict[str, Any]:
        if self.dynamic_m:
            g = self.groups
            if len(g) > 1 and self.one_row:
                # An expert set: E equal rows written once. The default manifest's expert sets
                # held some 18,000 rows, and parsing them was a quarter of runtime.load.
                return {"dynamic_m": {"experts": len(g), "group": list(g[0]),
                                      "max_m": self.max_m}}
            return {"dynamic_m": {"groups": [list(r) for r in g], "max_m": self.max_m}}
        return {"groups": [list(r) for r in self.groups]}


class Kernel(Record):
    """One compiled kernel, content-addressed: `key` hashes (family, arch, config with acc
    stages and out dtype, kernel sources, DSL versions, builder version, Python), never a
    set's name or shapes, so every set one kernel serves shares this record and its cubin."""

    key: str
    name: str  # readable: "<family>.<arch>.acc<n>.<f16|bf16>.<key[:12]>"
    family: str
    arch: str
    acc_stages: int
    out_dtype: str  # one of OUT_DTYPES: the element type the kernel writes C in
    options: dict[str, Any]  # every other config field
    symbol: str
    cubin: str  # path relative to the artifact directory
    sha256: str
    cubin_bytes: int
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    dynamic_smem: int
    sm_count: int | None  # an SM count baked into the cubin, None if read at run time
    grid: Grid
    tile: Tile
    tables: Tables
    limits: Limits
    params: tuple[Param, ...]

    @property
    def takes_alpha(self) -> bool:
        """Whether the kernel reads a per-group alpha (an `alpha` table parameter)."""
        return any(p.kind == "table" and p.table == "alpha" for p in self.params)

    @property
    def takes_offsets(self) -> bool:
        """Whether the kernel derives its tables from the call's expert offsets on the device
        (an `offs` operand parameter: Config.device_offsets, the serving contract's kernels).
        Such a kernel serves scaled_grouped_mm only, never the list API."""
        return any(p.kind == "operand" and p.operand in ("offs", "masked_m")
                   for p in self.params)

    @property
    def takes_masked(self) -> bool:
        """Whether the kernel serves the masked layout (a `masked_m` operand): masked_grouped_mm
        only."""
        return any(p.kind == "operand" and p.operand == "masked_m" for p in self.params)

    @property
    def param_bytes(self) -> int:
        return max((p.offset + p.size for p in self.params), default=0)

    def record(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in fields(self)}
        for name in ("grid", "tile", "tables", "limits"):
            out[name] = out[name].record()
        out["params"] = [asdict(p) for p in self.params]
        return out


_DELEGATED = ("key", "family", "options", "symbol", "cubin", "sha256", "cubin_bytes", "block",
              "cluster", "dynamic_smem", "sm_count", "grid", "tile", "tables", "limits",
              "params", "takes_alpha", "takes_offsets", "takes_masked", "param_bytes")


class KernelEntry(Record):
    """One served (set, arch, acc stages, out dtype): what the dispatch selects and the
    launcher runs. Its launch data is its `kernel`'s (read through the same attribute names
    as before schema 2: entry.symbol, entry.tile, entry.params, ...)."""

    name: str  # unique within the manifest: "<set>.<arch>.acc<stages>.<f16|bf16>"
    set: str
    arch: str
    acc_stages: int
    out_dtype: str
    serves: Serves
    kernel: Kernel

    def __getattr__(self, name: str) -> Any:
        if name in _DELEGATED:
            return getattr(self.kernel, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def constraints(self) -> dict[str, Any]:
        """The served shapes and limits as one dict (the schema-1 `constraints` form), for
        listings and messages."""
        return {**self.serves.record(), **self.kernel.limits.record()}

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "set": self.set, "arch": self.arch,
                "acc_stages": self.acc_stages, "out_dtype": self.out_dtype,
                "kernel": self.kernel.key, "serves": self.serves.record()}


def quantizer_name(layout: str, arch: str, key: str) -> str:
    """The one spelling of a quantizer record's name."""
    return f"act_quant_{layout}.{arch}.{key[:12]}"


class Quantizer(Record):
    """An activation quantizer (kernels/sm90/act_quant.py), content-addressed like a Kernel:
    `key` hashes its family's sources, arch, layout, DSL, builder and Python. One per (layout,
    arch) in a manifest. The runtime launches it with one thread per 16 elements of x,
    `block` threads per CTA; `max_experts` bounds the experts layout's E and a masked call's
    E with masked_m (their tables live in shared memory), 0 for a masked record with no table
    (any E). Its attribute names are a Kernel's where they mean the same
    (the loader reads both alike)."""

    key: str
    name: str  # "act_quant_<layout>.<arch>.<key[:12]>"
    layout: str
    arch: str
    symbol: str
    cubin: str
    sha256: str
    cubin_bytes: int
    block: tuple[int, int, int]
    dynamic_smem: int
    max_experts: int
    params: tuple[Param, ...]

    # No cluster: the loader's checks read one.
    cluster = property(lambda self: (1, 1, 1))

    @property
    def fills_sfa(self) -> bool:
        """Whether the kernel writes all of sfa, padding zeros included (QUANT_OPTIONAL_ROLES):
        then the runtime launches its filling CTAs and skips the memset."""
        return any(p.kind == "scalar" and p.value == "sfa_chunks" for p in self.params)

    @property
    def takes_mask(self) -> bool:
        """Whether the (masked) kernel takes masked_m and its quantizing CTA count
        (QUANT_OPTIONAL_ROLES): it then skips the masked rows, and serves a call with masked_m."""
        return any(p.kind == "operand" and p.operand == "masked_m" for p in self.params)

    def record(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in fields(self)}
        out["block"] = list(self.block)
        out["params"] = [asdict(p) for p in self.params]
        return out


class Manifest(Record):
    schema_version: int
    builder_version: str
    dsl_version: str
    kernels: tuple[Kernel, ...]  # each distinct kernel once, sorted by name
    sets: tuple[KernelEntry, ...]  # what each set is served by, sorted by name
    # What the build was part of, for `merge` (issue 28): a hash of the whole spec's kernel
    # names and keys, and (i, n) for a `--shard i/n` build.
    spec_fingerprint: str = ""
    shard: tuple[int, int] | None = None
    # The activation quantizers, sorted by name; an optional key of schema 3 (absent when
    # none was built, so a runtime that predates them reads the rest unchanged).
    quantizers: tuple[Quantizer, ...] = ()

    def to_json(self) -> str:
        """Deterministic JSON: the same build gives byte-identical manifests."""
        obj = {"schema_version": self.schema_version, "builder_version": self.builder_version,
               "dsl_version": self.dsl_version, "spec_fingerprint": self.spec_fingerprint,
               "shard": list(self.shard) if self.shard is not None else None,
               "kernels": [k.record() for k in self.kernels],
               "sets": [e.record() for e in self.sets]}
        if self.quantizers:
            obj["quantizers"] = [q.record() for q in self.quantizers]
        return json.dumps(obj, indent=1, sort_keys=True) + "\n"

    def quantizer(self, layout: str, arch: str) -> Quantizer | None:
        """The quantizer of `layout` for `arch`, or None if none was built."""
        for q in self.quantizers:
            if q.layout == layout and q.arch == arch:
                return q
        return None

    def entry(self, name: str) -> KernelEntry:
        for e in self.sets:
            if e.name == name:
                return e
        raise ManifestError(f"no kernel named {name!r}; built: {[e.name for e in self.sets]}")


def make_manifest(entries: Any, builder_version: str, dsl_version: str,
                  spec_fingerprint: str = "", shard: tuple[int, int] | None = None,
                  quantizers: Any = ()) -> Manifest:
    """A manifest of these served entries and the kernels they point at, and of these
    quantizers, each sorted by name."""
    entries = sorted(entries, key=lambda e: e.name)
    kernels = {e.kernel.key: e.kernel for e in entries}
    return Manifest(schema_version=SCHEMA_VERSION, builder_version=builder_version,
                    dsl_version=dsl_version,
                    kernels=tuple(sorted(kernels.values(), key=lambda k: k.name)),
                    sets=tuple(entries), spec_fingerprint=spec_fingerprint, shard=shard,
                    quantizers=tuple(sorted(quantizers, key=lambda q: q.name)))


def pack_offsets(sizes_aligns: list[tuple[int, int]]) -> list[int]:
    """Offsets of kernel parameters laid out in order with natural alignment (the CUDA ABI)."""
    offsets, at = [], 0
    for size, align in sizes_aligns:
        at = (at + align - 1) // align * align
        offsets.append(at)
        at += size
    return offsets


# --------------------------------------------------------------------------------------------
# Parsing and validation
# --------------------------------------------------------------------------------------------


class _Reader:
    """Typed access to a JSON object that reports the path of a bad field."""

    def __init__(self, obj: Any, path: str) -> None:
        if not isinstance(obj, dict):
            raise ManifestError(f"{path} must be an object, but got {type(obj).__name__}")
        self.obj, self.path = obj, path

    def get(self, key: str, typ: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.obj:
            if optional:
                return None
            raise ManifestError(f"{self.path}.{key} is missing")
        value = self.obj[key]
        if optional and value is None:
            return None
        # bool is an int subclass; never accept it where a number is meant.
        if isinstance(value, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
            raise ManifestError(f"{self.path}.{key} must be {_tname(typ)}, but got bool")
        if not isinstance(value, typ):
            raise ManifestError(
                f"{self.path}.{key} must be {_tname(typ)}, but got {type(value).__name__}"
            )
        return value

    def choice(self, key: str, choices: tuple[str, ...], *, optional: bool = False) -> str | None:
        value = self.get(key, str, optional=optional)
        if value is not None and value not in choices:
            raise ManifestError(f"{self.path}.{key} must be one of {list(choices)}, but got "
                                f"{value!r}")
        return value

    def ints(self, key: str, length: int | None = None) -> tuple[int, ...]:
        value = self.get(key, list)
        if length is not None and len(value) != length:
            raise ManifestError(f"{self.path}.{key} must have {length} entries, but has "
                                f"{len(value)}")
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ManifestError(f"{self.path}.{key}[{i}] must be int, but got "
                                    f"{type(v).__name__}")
        return tuple(value)

    def sub(self, key: str) -> _Reader:
        return _Reader(self.get(key, dict), f"{self.path}.{key}")


def _tname(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def _parse_tma(r: _Reader) -> TmaGeometry:
    geo = TmaGeometry(
        dtype=r.choice("dtype", TMA_DTYPES),
        dims=r.ints("dims"),
        strides=r.ints("strides"),
        box=r.ints("box"),
        element_strides=r.ints("element_strides"),
        swizzle=r.choice("swizzle", TMA_SWIZZLES),
        interleave=r.choice("interleave", ("NONE",)),
        l2_promotion=r.choice("l2_promotion", TMA_L2_PROMOTIONS),
        oob_fill=r.choice("oob_fill", TMA_OOB_FILLS),
    )
    rank = len(geo.dims)
    if not 1 <= rank <= 5:
        raise ManifestError(f"{r.path}.dims must have 1 to 5 entries, but has {rank}")
    for key, want in (("strides", rank - 1), ("box", rank), ("element_strides", rank)):
        if len(getattr(geo, key)) != want:
            raise ManifestError(f"{r.path}.{key} must have {want} entries for rank {rank}")
    for i, b in enumerate(geo.box):
        if not 1 <= b <= 256:
            raise ManifestError(f"{r.path}.box[{i}] must be in 1..256, but got {b}")
    return geo


def _parse_param(r: _Reader, kinds: tuple[str, ...] = PARAM_KINDS,
                 operands: tuple[str, ...] = CALL_OPERANDS,
                 scalars: tuple[str, ...] = SCALARS) -> Param:
    """One parameter slot; a quantizer's take `kinds` operand and scalar only, with its own
    operand and scalar names."""
    kind = r.choice("kind", kinds)
    p = Param(
        name=r.get("name", str),
        kind=kind,
        offset=r.get("offset", int),
        size=r.get("size", int),
        align=r.get("align", int),
        table=r.choice("table", TABLES, optional=kind != "table"),
        operand=r.choice("operand", operands if kind == "operand" else OPERANDS,
                         optional=kind not in ("tma_template", "operand")),
        tma=_parse_tma(r.sub("tma")) if kind == "tma_template" else None,
        value=r.choice("value", scalars, optional=kind != "scalar"),
    )
    if p.size <= 0 or p.align not in (1, 2, 4, 8, 16, 32, 64, 128) or p.offset % p.align:
        raise ManifestError(
            f"{r.path}: offset {p.offset}, size {p.size}, align {p.align} is not a valid "
            "parameter slot"
        )
    expected = {"table": (8, 8), "tma_template": (128, 64), "scalar": (4, 4),
                "operand": (8, 8)}.get(kind)
    if expected and (p.size, p.align) != expected:
        raise ManifestError(
            f"{r.path}: {'an' if kind[0] in 'aeiou' else 'a'} {kind} parameter must have size "
            f"{expected[0]} and align {expected[1]}, "
            f"but got size {p.size} and align {p.align}"
        )
    return p


def _parse_grid(r: _Reader) -> Grid:
    return Grid(policy=r.get("policy", str), ctas_per_sm=r.get("ctas_per_sm", int),
                cooperative=r.get("cooperative", bool, optional=True) or False,
                every_sm=r.get("every_sm", bool, optional=True) or False)


def _parse_tables(r: _Reader) -> Tables:
    def fmt(key: str) -> TableFormat:
        t = r.sub(key)
        cols = t.get("columns", list, optional=True) or []
        if not all(isinstance(c, str) for c in cols):
            raise ManifestError(f"{t.path}.columns must be a list of names, but got {cols!r}")
        return TableFormat(dtype=t.choice("dtype", TABLE_DTYPES), columns=tuple(cols))

    ws = r.sub("tensormap_workspace")
    return Tables(
        problem_sizes=fmt("problem_sizes"), pointers=fmt("pointers"), cta_prefix=fmt("cta_prefix"),
        tensormap_workspace=Workspace(
            bytes_per_cta=ws.get("bytes_per_cta", int), align=ws.get("align", int),
            header_bytes=ws.get("header_bytes", int, optional=True) or 0,
            bytes_per_a_element=ws.get("bytes_per_a_element", int, optional=True) or 0))


def _rows(r: _Reader, key: str, width: int) -> tuple[tuple[int, ...], ...]:
    groups = r.get(key, list)
    if not groups:
        raise ManifestError(f"{r.path}.{key} must be a non-empty list, but got []")
    for i, g in enumerate(groups):
        if (not isinstance(g, list) or len(g) != width
                or any(isinstance(v, bool) or not isinstance(v, int) for v in g)):
            raise ManifestError(f"{r.path}.{key}[{i}] must be a list of {width} ints, "
                                f"but got {g!r}")
    return tuple(tuple(g) for g in groups)


def _unknown_keys(r: _Reader, allowed: tuple[str, ...], form: str) -> None:
    """ManifestError for a key the schema does not have: a misspelled optional one (`maxm`
    for max_m) was ignored, dropping what it meant."""
    extra = sorted(set(r.obj) - set(allowed))
    if extra:
        raise ManifestError(f"{r.path} has unknown key(s) {extra}: it must be an object {form}")


def _parse_serves(r: _Reader) -> Serves:
    if "dynamic_m" not in r.obj:
        _unknown_keys(r, ("groups",), _SERVES_FORM)
        return Serves(groups=_rows(r, "groups", 3))
    if "groups" in r.obj:
        raise ManifestError(f"{r.path} must have either groups (exact shapes) or dynamic_m, "
                            "not both")
    _unknown_keys(r, ("dynamic_m",), _SERVES_FORM)
    dyn = r.obj["dynamic_m"]
    if not isinstance(dyn, dict) or ("groups" in dyn) == ("experts" in dyn):
        raise ManifestError(f"{r.path}.dynamic_m must be an object {_DYNAMIC_FORM}, "
                            f"but got {dyn!r}")
    d = _Reader(dyn, f"{r.path}.dynamic_m")
    if "experts" in dyn:
        _unknown_keys(d, ("experts", "group", "max_m"), _DYNAMIC_EXPERTS_FORM)
    else:
        _unknown_keys(d, ("groups", "max_m"), _DYNAMIC_GROUPS_FORM)
    max_m = dyn.get("max_m")
    if max_m is not None and (isinstance(max_m, bool) or not isinstance(max_m, int)):
        raise ManifestError(f"{d.path}.max_m must be a positive int or null, but got {max_m!r}")
    if "experts" in dyn:
        experts = d.get("experts", int)
        if experts < 1:
            raise ManifestError(f"{d.path}.experts must be a positive int, but got {experts}")
        if experts > MAX_GROUPS:  # the spec's limit; load builds the E rows
            raise ManifestError(f"{d.path}.experts must be at most {MAX_GROUPS} (the groups a "
                                f"set may have), but got {experts}")
        row = d.ints("group", 2)
        return Serves(groups=(row,) * experts, dynamic_m=True, max_m=max_m)
    return Serves(groups=_rows(d, "groups", 2), dynamic_m=True, max_m=max_m)


def _parse_params(r: _Reader, **vocab: Any) -> tuple[Param, ...]:
    params = tuple(
        _parse_param(_Reader(p, f"{r.path}.params[{i}]"), **vocab)
        for i, p in enumerate(r.get("params", list))
    )
    for i in range(1, len(params)):
        prev = params[i - 1]
        if params[i].offset < prev.offset + prev.size:
            raise ManifestError(f"{r.path}.params[{i}] ({params[i].name}) overlaps the "
                                "previous one")
    return params


def _check_cubin_fields(r: _Reader, k: Any) -> None:
    """sha256, cubin path and symbol of a Kernel or Quantizer record."""
    if len(k.sha256) != 64:
        raise ManifestError(f"{r.path}.sha256 must be 64 hex digits, but got {k.sha256!r}")
    if not k.cubin.isprintable():  # NUL made every path operation raise ValueError
        raise ManifestError(f"{r.path}.cubin must be a path of printable characters (no NUL or "
                            f"other control characters), but got {k.cubin!r}")
    if Path(k.cubin).is_absolute() or ".." in Path(k.cubin).parts:
        raise ManifestError(f"{r.path}.cubin must be a relative path inside the artifact directory")
    if not _SYMBOL_RE.fullmatch(k.symbol):  # verify and the build look for it encoded in ELF
        raise ManifestError(f"{r.path}.symbol must be a PTX identifier ({_SYMBOL_RE.pattern}), "
                            f"but got {k.symbol!r}")


def _parse_kernel(r: _Reader) -> Kernel:
    params = _parse_params(r)
    tile, limits = r.sub("tile"), r.sub("limits")
    k = Kernel(
        key=r.get("key", str),
        name=r.get("name", str),
        family=r.get("family", str),
        arch=r.choice("arch", ARCHS),
        acc_stages=r.get("acc_stages", int),
        out_dtype=r.choice("out_dtype", OUT_DTYPES),
        options=r.get("options", dict),
        symbol=r.get("symbol", str),
        cubin=r.get("cubin", str),
        sha256=r.get("sha256", str),
        cubin_bytes=r.get("cubin_bytes", int),
        block=r.ints("block", 3),
        cluster=r.ints("cluster", 3),
        dynamic_smem=r.get("dynamic_smem", int),
        sm_count=r.get("sm_count", int, optional=True),
        grid=_parse_grid(r.sub("grid")),
        tile=Tile(m=tile.get("m", int), n=tile.get("n", int), k=tile.get("k", int, optional=True)),
        tables=_parse_tables(r.sub("tables")),
        limits=Limits(k_multiple=limits.get("k_multiple", int, optional=True) or 1,
                      n_multiple=limits.get("n_multiple", int, optional=True) or 1),
        params=params,
    )
    _check_cubin_fields(r, k)
    return k


def parse_quantizer(obj: Any, source: str) -> Quantizer:
    """One quantizer record, typed and checked (its values too: they size the launch)."""
    # The launch limits a kernel's record is held to (entry_rules imports this module).
    from .entry_rules import MAX_DYNAMIC_SMEM, MAX_THREADS

    r = _Reader(obj, source)
    _unknown_keys(r, fields(Quantizer), "with the fields of a quantizer record")
    q = Quantizer(
        key=r.get("key", str), name=r.get("name", str), layout=r.choice("layout", QUANT_LAYOUTS),
        arch=r.choice("arch", ARCHS), symbol=r.get("symbol", str), cubin=r.get("cubin", str),
        sha256=r.get("sha256", str), cubin_bytes=r.get("cubin_bytes", int),
        block=r.ints("block", 3), dynamic_smem=r.get("dynamic_smem", int),
        max_experts=r.get("max_experts", int),
        params=_parse_params(r, kinds=("operand", "scalar"), operands=QUANT_OPERANDS,
                             scalars=QUANT_SCALARS))
    _check_cubin_fields(r, q)
    if q.name != quantizer_name(q.layout, q.arch, q.key):
        raise ManifestError(f"{source}.name must be {quantizer_name(q.layout, q.arch, q.key)!r} "
                            f"(act_quant_<layout>.<arch>.<key[:12]>), but got {q.name!r}")
    threads = q.block[0] * q.block[1] * q.block[2]
    if min(q.block) < 1 or threads > MAX_THREADS or q.block[1:] != (1, 1):
        raise ManifestError(f"{source}.block must be [threads, 1, 1] with 1 <= threads <= "
                            f"{MAX_THREADS}, but got {list(q.block)}")
    if not 0 <= q.dynamic_smem <= MAX_DYNAMIC_SMEM:
        raise ManifestError(f"{source}.dynamic_smem must be in 0..{MAX_DYNAMIC_SMEM}, but got "
                            f"{q.dynamic_smem}")
    if q.cubin_bytes < 1:
        raise ManifestError(f"{source}.cubin_bytes must be positive, but got {q.cubin_bytes}")
    roles = [p.operand if p.kind == "operand" else p.value for p in q.params]
    optional = QUANT_OPTIONAL_ROLES[q.layout]
    if len(set(roles)) != len(roles) or set(roles) - optional != QUANT_ROLES[q.layout] \
            or any(0 < len(set(roles) & both) < len(both) for both in QUANT_ROLES_TOGETHER):
        together = " and ".join(f"{sorted(both)} all or none" for both in QUANT_ROLES_TOGETHER
                                if both <= optional)
        raise ManifestError(f"{source}.params must take each of "
                            f"{sorted(QUANT_ROLES[q.layout])} once, and may take "
                            f"{sorted(optional)} once{', ' + together if together else ''} "
                            f"(the {q.layout} layout's launch values), but take {roles}")
    # masked: what its masked_m table holds, 0 for no table (a record without masked_m, or the
    # first masked_m kernel of 2026-12-07, which walked x's blocks with no table: any E).
    want_experts = (1, MAX_GROUPS) if q.layout == "experts" else (0, MAX_GROUPS)
    if not want_experts[0] <= q.max_experts <= want_experts[1]:
        raise ManifestError(f"{source}.max_experts must be in {want_experts[0]}.."
                            f"{want_experts[1]} for the {q.layout} layout, but got "
                            f"{q.max_experts}")
    return q


def parse_kernel(obj: Any, source: str) -> Kernel:
    """One kernel record, typed and checked (runtime/entry_rules.py) as parse_manifest does."""
    from .entry_rules import check_kernel

    k = _parse_kernel(_Reader(obj, source))
    check_kernel(k)
    return k


def _parse_entry(r: _Reader, kernels: dict[str, Kernel]) -> KernelEntry:
    key = r.get("kernel", str)
    if key not in kernels:
        raise ManifestError(f"{r.path}.kernel must be the key of a kernel in the manifest, but "
                            f"got {key!r}")
    e = KernelEntry(name=r.get("name", str), set=r.get("set", str), arch=r.choice("arch", ARCHS),
                    acc_stages=r.get("acc_stages", int),
                    out_dtype=r.choice("out_dtype", OUT_DTYPES),
                    serves=_parse_serves(r.sub("serves")), kernel=kernels[key])
    k = e.kernel
    for field_name in ("arch", "acc_stages", "out_dtype"):
        if getattr(e, field_name) != getattr(k, field_name):
            raise ManifestError(f"{r.path}.{field_name} must be its kernel's "
                                f"({getattr(k, field_name)!r}), but got "
                                f"{getattr(e, field_name)!r}")
    return e


def _check_version(r: _Reader, source: str) -> int:
    version = r.get("schema_version", int)
    if version != SCHEMA_VERSION:
        old = {1: " (schema 1 gave every set its own cubin; schema 2 shares one per distinct "
                  "kernel)",
               2: " (schema 2 wrote an expert set's E equal (n, k) rows out; schema 3 writes "
                  "one, with `experts`)"}.get(version, "")
        raise ManifestError(
            f"{source}: schema_version must be {SCHEMA_VERSION}, but got {version}{old}; "
            "rebuild the artifacts with this version of build_kernels.py"
        )
    return version


def _unique(source: str, what: str, names: list[str]) -> None:
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ManifestError(f"{source}: {what} must be unique, but {dupes} repeat")


def parse_manifest(obj: Any, source: str = "manifest") -> Manifest:
    """Validate a decoded manifest into typed records; every error names the offending field.
    The launch values (served shapes, smem, block, tile, grid) are checked once here, by
    runtime.entry_rules, for load, verify, package and the builder's reuse alike."""
    r = _Reader(obj, source)
    version = _check_version(r, source)
    kernels = tuple(
        _parse_kernel(_Reader(k, f"{source}.kernels[{i}]"))
        for i, k in enumerate(r.get("kernels", list))
    )
    _unique(source, "kernel keys", [k.key for k in kernels])
    _unique(source, "kernel names", [k.name for k in kernels])
    by_key = {k.key: k for k in kernels}
    sets = tuple(
        _parse_entry(_Reader(e, f"{source}.sets[{i}]"), by_key)
        for i, e in enumerate(r.get("sets", list))
    )
    _unique(source, "set entry names", [e.name for e in sets])
    from .entry_rules import check_entry, check_kernel  # they import dispatch and plan

    for k in kernels:
        check_kernel(k)
    for e in sets:
        check_entry(e)
    quantizers = tuple(
        parse_quantizer(q, f"{source}.quantizers[{i}]")
        for i, q in enumerate(r.get("quantizers", list, optional=True) or [])
    )
    _unique(source, "kernel and quantizer keys",
            [k.key for k in kernels] + [q.key for q in quantizers])
    _unique(source, "quantizer (layout, arch) pairs",
            [f"{q.layout} {q.arch}" for q in quantizers])
    shard = r.ints("shard", 2) if r.obj.get("shard") is not None else None
    if shard is not None and not 0 <= shard[0] < shard[1] <= MAX_SHARDS:
        # merge looks for all n shards: an n of 10**20 made it build range(n).
        raise ManifestError(f"{source}.shard must be [i, n] with 0 <= i < n <= {MAX_SHARDS}, "
                            f"but got {list(shard)}")
    return Manifest(
        schema_version=version,
        builder_version=r.get("builder_version", str),
        dsl_version=r.get("dsl_version", str),
        kernels=kernels,
        sets=sets,
        spec_fingerprint=r.get("spec_fingerprint", str, optional=True) or "",
        shard=shard,  # type: ignore[arg-type]
        quantizers=quantizers,
    )


def load_manifest(artifact_dir: str | Path) -> Manifest:
    """Read and validate `<artifact_dir>/manifest.json` (cubins are checked by the loader)."""
    path = Path(artifact_dir) / MANIFEST_NAME
    if path.exists() and not path.is_file():
        raise ManifestError(f"{path} is not a file (it is a directory or a special file); "
                            "it must be the manifest.json a build wrote")
    if not path.is_file():
        raise ManifestError(
            f"no manifest at {path}; build one with `python build_kernels.py build` "
            "or pass the artifact directory that holds manifest.json"
        )
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path} is not valid JSON: {exc}") from exc
    except RecursionError:
        # Arrays or objects nested some thousand deep: json recurses per level.
        raise ManifestError(f"{path} is not a manifest: its JSON nests arrays or objects too "
                            "deeply to read (a manifest nests a few levels)") from None
    except ValueError as exc:
        # An integer literal longer than sys.get_int_max_str_digits(): not the advice to
        # raise the limit that Python's own message ends with.
        raise ManifestError(f"{path} is not a manifest: {str(exc).split('; use ')[0]}") from None
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return parse_manifest(obj, str(path))
