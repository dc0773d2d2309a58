"""The artifact manifest: its schema, parsing and validation.

This module is the single definition of `artifacts/manifest.json`. The builder writes manifests
through `Manifest.to_json`; the runtime reads them through `load_manifest`. Neither side spells a
field name anywhere else.

A kernel entry carries everything needed to launch the cubin without the DSL: symbol, block and
cluster dims, dynamic shared memory, the grid policy, the tile used by the CTA prefix table, the
layout of every device table, and the launch ABI: each `.entry` parameter in order with its
offset, size, alignment and the rule that fills it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ManifestError

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"

ARCHS = ("sm_90a", "sm_100a")
# Compute capability (major, minor) that runs each arch's cubins.
ARCH_CAPABILITY = {"sm_90a": (9, 0), "sm_100a": (10, 0)}

# How the runtime fills a parameter.
PARAM_KINDS = ("table", "tma_template", "scalar", "zeros")
# Device tables a `table` parameter points at. grid_barrier is the zeroed header_bytes of the
# tensormap workspace record (kernels/tables.py): the runtime passes the eager workspace's header
# or, for a launch under graph capture, a persistent zeroed copy of its own.
# alpha: one float32 per group, multiplied into the fp32 accumulator before the cast to the
# output type; the runtime passes the caller's (G,) tensor or a persistent array of ones.
TABLES = ("problem_sizes", "pointers", "cta_prefix", "tensormap_workspace", "grid_barrier",
          "alpha")
# Values a `scalar` parameter can carry.
SCALARS = ("num_groups",)
# Operands a tensor-map template describes, and the columns of the pointer table.
OPERANDS = ("a", "b", "sfa", "sfb", "c")
# Output element types a kernel can be built for (shapes.yaml `out_dtypes`), by torch name, and
# the short form in kernel names ("<set>.<arch>.acc<n>.<short>").
OUT_DTYPES = ("float16", "bfloat16")
OUT_DTYPE_SHORT = {"float16": "f16", "bfloat16": "bf16"}


def kernel_name(set_name: str, arch: str, acc_stages: int, out_dtype: str) -> str:
    """The one spelling of a kernel's name: "<set>.<arch>.acc<stages>.<f16|bf16>"."""
    return f"{set_name}.{arch}.acc{acc_stages}.{OUT_DTYPE_SHORT[out_dtype]}"

TMA_DTYPES = ("UINT8", "UINT16", "UINT32", "INT32", "UINT64", "FLOAT16", "16U4_ALIGN8B",
              "16U4_ALIGN16B")
TMA_SWIZZLES = ("NONE", "32B", "64B", "128B")
TMA_L2_PROMOTIONS = ("NONE", "64B", "128B", "256B")
TMA_OOB_FILLS = ("NONE", "NAN_REQUEST_ZERO_FMA")


@dataclass(frozen=True)
class TmaGeometry:
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


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    offset: int
    size: int
    align: int
    table: str | None = None  # kind == "table"
    operand: str | None = None  # kind == "tma_template"
    tma: TmaGeometry | None = None  # kind == "tma_template"
    value: str | None = None  # kind == "scalar"


@dataclass(frozen=True)
class KernelEntry:
    name: str  # unique within the manifest: "<set>.<arch>.acc<stages>.<f16|bf16>"
    key: str  # content hash of (kernel sources, DSL version, spec, options)
    set: str
    arch: str
    family: str
    acc_stages: int
    symbol: str
    cubin: str  # path relative to the artifact directory
    sha256: str
    cubin_bytes: int
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    dynamic_smem: int
    sm_count: int | None  # an SM count baked into the cubin, None if read at run time
    # {"policy": "persistent", "ctas_per_sm": int, optional "cooperative": bool, "every_sm": bool}
    grid: dict[str, Any]
    tile: dict[str, int]  # {"m": .., "n": .., "k": ..} of the output tile the prefix table counts
    constraints: dict[str, Any]  # shapes served: {"groups": [[m, n, k], ...], "k_multiple": ..}
    tables: dict[str, Any]  # layout of each device table the params point at
    params: tuple[Param, ...]
    options: dict[str, Any] = field(default_factory=dict)
    compile_seconds: float = 0.0
    out_dtype: str = "float16"  # one of OUT_DTYPES: the element type the kernel writes C in

    @property
    def takes_alpha(self) -> bool:
        """Whether the kernel reads a per-group alpha (an `alpha` table parameter)."""
        return any(p.kind == "table" and p.table == "alpha" for p in self.params)

    @property
    def param_bytes(self) -> int:
        return max((p.offset + p.size for p in self.params), default=0)


@dataclass(frozen=True)
class Manifest:
    schema_version: int
    builder_version: str
    dsl_version: str
    kernels: tuple[KernelEntry, ...]
    # What the build was part of, for `merge` (issue 28): a hash of the whole spec's kernel
    # names and keys ("" in manifests older than it), and (i, n) for a `--shard i/n` build.
    spec_fingerprint: str = ""
    shard: tuple[int, int] | None = None

    def to_json(self) -> str:
        """Deterministic JSON: the same build gives byte-identical manifests."""
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    def kernel(self, name: str) -> KernelEntry:
        for k in self.kernels:
            if k.name == name:
                return k
        raise ManifestError(f"no kernel named {name!r}; built: {[k.name for k in self.kernels]}")


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


def _parse_param(r: _Reader) -> Param:
    kind = r.choice("kind", PARAM_KINDS)
    p = Param(
        name=r.get("name", str),
        kind=kind,
        offset=r.get("offset", int),
        size=r.get("size", int),
        align=r.get("align", int),
        table=r.choice("table", TABLES, optional=kind != "table"),
        operand=r.choice("operand", OPERANDS, optional=kind != "tma_template"),
        tma=_parse_tma(r.sub("tma")) if kind == "tma_template" else None,
        value=r.choice("value", SCALARS, optional=kind != "scalar"),
    )
    if p.size <= 0 or p.align not in (1, 2, 4, 8, 16, 32, 64, 128) or p.offset % p.align:
        raise ManifestError(
            f"{r.path}: offset {p.offset}, size {p.size}, align {p.align} is not a valid "
            "parameter slot"
        )
    expected = {"table": (8, 8), "tma_template": (128, 64), "scalar": (4, 4)}.get(kind)
    if expected and (p.size, p.align) != expected:
        raise ManifestError(
            f"{r.path}: a {kind} parameter must have size {expected[0]} and align {expected[1]}, "
            f"but got size {p.size} and align {p.align}"
        )
    return p


def _parse_kernel(r: _Reader) -> KernelEntry:
    params = tuple(
        _parse_param(_Reader(p, f"{r.path}.params[{i}]"))
        for i, p in enumerate(r.get("params", list))
    )
    for i in range(1, len(params)):
        prev = params[i - 1]
        if params[i].offset < prev.offset + prev.size:
            raise ManifestError(f"{r.path}.params[{i}] ({params[i].name}) overlaps the "
                                "previous one")
    entry = KernelEntry(
        name=r.get("name", str),
        key=r.get("key", str),
        set=r.get("set", str),
        arch=r.choice("arch", ARCHS),
        family=r.get("family", str),
        acc_stages=r.get("acc_stages", int),
        symbol=r.get("symbol", str),
        cubin=r.get("cubin", str),
        sha256=r.get("sha256", str),
        cubin_bytes=r.get("cubin_bytes", int),
        block=r.ints("block", 3),
        cluster=r.ints("cluster", 3),
        dynamic_smem=r.get("dynamic_smem", int),
        sm_count=r.get("sm_count", int, optional=True),
        grid=r.get("grid", dict),
        tile=r.get("tile", dict),
        constraints=r.get("constraints", dict),
        tables=r.get("tables", dict),
        params=params,
        options=r.get("options", dict, optional=True) or {},
        compile_seconds=float(r.get("compile_seconds", (int, float), optional=True) or 0.0),
        out_dtype=r.choice("out_dtype", OUT_DTYPES),
    )
    if len(entry.sha256) != 64:
        raise ManifestError(f"{r.path}.sha256 must be 64 hex digits, but got {entry.sha256!r}")
    if Path(entry.cubin).is_absolute() or ".." in Path(entry.cubin).parts:
        raise ManifestError(f"{r.path}.cubin must be a relative path inside the artifact directory")
    return entry


def parse_manifest(obj: Any, source: str = "manifest") -> Manifest:
    """Validate a decoded manifest; every error names the offending field."""
    r = _Reader(obj, source)
    version = r.get("schema_version", int)
    if version != SCHEMA_VERSION:
        raise ManifestError(
            f"{source}: schema_version must be {SCHEMA_VERSION}, but got {version}; "
            "rebuild the artifacts with this version of build_kernels.py"
        )
    kernels = tuple(
        _parse_kernel(_Reader(k, f"{source}.kernels[{i}]"))
        for i, k in enumerate(r.get("kernels", list))
    )
    from .entry_rules import check_entry  # imports dispatch and plan, which import this

    for k in kernels:
        check_entry(k)
    names = [k.name for k in kernels]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ManifestError(f"{source}: kernel names must be unique, but {dupes} repeat")
    shard = r.ints("shard", 2) if r.obj.get("shard") is not None else None
    if shard is not None and not 0 <= shard[0] < shard[1]:
        raise ManifestError(f"{source}.shard must be [i, n] with 0 <= i < n, but got "
                            f"{list(shard)}")
    return Manifest(
        schema_version=version,
        builder_version=r.get("builder_version", str),
        dsl_version=r.get("dsl_version", str),
        kernels=kernels,
        spec_fingerprint=r.get("spec_fingerprint", str, optional=True) or "",
        shard=shard,  # type: ignore[arg-type]
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
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return parse_manifest(obj, str(path))
