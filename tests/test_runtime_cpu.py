"""CPU tests of the serve-time runtime: everything that needs no GPU.

Synthetic artifact directories are written with runtime.manifest types and fake cubins (a
64-byte CUDA ELF header with the e_flags ptxas writes, measured on DSL-built cubins), so these
tests do not depend on the kernels or the builder.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.dispatch import KernelIndex, arch_for_capability
from runtime.entry_rules import check_kernel
from runtime.errors import ArtifactError, InputError, ManifestError, NoKernelError
from runtime.loader import ArtifactStore, check_param_layout, cubin_arch
from runtime.manifest import (
    Grid,
    Kernel,
    KernelEntry,
    Limits,
    Param,
    Serves,
    TableFormat,
    Tables,
    Tile,
    TmaGeometry,
    Workspace,
    kernel_record_name,
    make_manifest,
    pack_offsets,
    parse_manifest,
)
from runtime.params import pack_params
from runtime.plan import cta_prefix, grid_size, make_plan, pointer_table_bytes
from runtime.validate import (
    _fast,
    blocked_scale_numel,
    check_inputs,
    check_no_overlap,
    check_placement,
    check_structure,
)

REPO = Path(__file__).resolve().parents[1]
FP4 = torch.float4_e2m1fn_x2
E4M3 = torch.float8_e4m3fn

# e_flags of real cubins from the DSL's ptxas (ABI version byte, flags).
ELF_FLAGS = {"sm_90a": (7, 0x005A0D5A), "sm_90": (7, 0x005A055A),
             "sm_100a": (8, 0x0600640A), "sm_100": (8, 0x06006402)}


def fake_cubin(arch: str, payload: bytes = b"") -> bytes:
    abi, flags = ELF_FLAGS[arch]
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x33 if abi == 7 else 0x41, abi]) + bytes(7)
    header = ident + struct.pack("<HHIQQQI", 2, 190, 1, 0, 0, 0, flags)
    header += bytes(64 - len(header))
    return header + payload


# ------------------------------------------------------------------ synthetic ABIs

GEO = TmaGeometry(dtype="UINT8", dims=(128, 64), strides=(128,), box=(128, 64),
                  element_strides=(1, 1), swizzle="128B", l2_promotion="256B")
TABLES = {
    "problem_sizes": {"dtype": "int32", "columns": ["m", "n", "k", "l"]},
    "pointers": {"dtype": "int64", "columns": ["a", "b", "sfa", "sfb", "c"]},
    "cta_prefix": {"dtype": "int32"},
    "tensormap_workspace": {"bytes_per_cta": 512, "align": 128},
}


def _params(specs: list[tuple[str, str, int, int, dict]]) -> tuple[Param, ...]:
    offsets = pack_offsets([(size, align) for _, _, size, align, _ in specs])
    return tuple(Param(name=n, kind=k, offset=o, size=s, align=a, **kw)
                 for (n, k, s, a, kw), o in zip(specs, offsets, strict=True))


def _tables() -> list[tuple[str, str, int, int, dict]]:
    return [("ptrs", "table", 8, 8, {"table": "pointers"}),
            ("workspace", "table", 8, 8, {"table": "tensormap_workspace"}),
            ("sizes", "table", 8, 8, {"table": "problem_sizes"}),
            ("prefix", "table", 8, 8, {"table": "cta_prefix"})]


def _tma(op: str) -> tuple[str, str, int, int, dict]:
    return (f"tma_{op}", "tma_template", 128, 64, {"operand": op, "tma": GEO})


def sm90_params() -> tuple[Param, ...]:
    """sm_90a-like: four TMA templates, four tables, num_groups."""
    return _params([_tma(op) for op in ("a", "b", "sfa", "sfb")] + _tables()
                   + [("num_groups", "scalar", 4, 4, {"value": "num_groups"})])


def sm100_params() -> tuple[Param, ...]:
    """sm_100a-like: a 12-byte tcgen05 MMA state passed as zeros first, then four templates."""
    return _params([("tiled_mma", "zeros", 12, 4, {})]
                   + [_tma(op) for op in ("a", "b", "sfa", "sfb")] + _tables())


_ENTRY_FIELDS = {"name", "set", "arch", "acc_stages", "out_dtype", "serves"}


def _typed(field: str, value: Any) -> Any:
    """Schema-1 style test overrides (dicts) as the typed records of schema 2."""
    if field == "grid" and isinstance(value, dict):
        return Grid(**value)
    if field == "tile" and isinstance(value, dict):
        return Tile(**value)
    if field == "tables" and isinstance(value, dict):
        return tables_of(value)
    return value


def tables_of(d: dict) -> Tables:
    fmt = {k: TableFormat(dtype=v["dtype"], columns=tuple(v.get("columns", ())))
           for k, v in d.items() if k != "tensormap_workspace"}
    return Tables(**fmt, tensormap_workspace=Workspace(**d["tensormap_workspace"]))


def serves_of(constraints: dict) -> tuple[Serves, Limits]:
    """A schema-1 `constraints` dict as (serves, limits)."""
    c = dict(constraints)
    dyn = c.pop("dynamic_m", None)
    groups = c.pop("groups", None)
    serves = (Serves(tuple(tuple(g) for g in dyn["groups"]), True, dyn.get("max_m"))
              if dyn is not None else Serves(tuple(tuple(g) for g in groups)))
    return serves, Limits(**c)


def entry(name: str = "dense.sm_90a.acc1.f16", *, set_: str = "dense", arch: str = "sm_90a",
          groups: list | None = None, params: tuple[Param, ...] | None = None,
          cubin: bytes | None = None, **over) -> tuple[KernelEntry, bytes]:
    """A set entry and its kernel's cubin; `over` may name entry fields, kernel fields (a
    dict for grid / tile / tables) or `constraints` (the schema-1 dict: serves and limits)."""
    image = cubin if cubin is not None else fake_cubin(arch, name.encode())
    serves, limits = serves_of(over.pop("constraints", None)
                               or {"groups": groups or [[192, 3072, 4096], [320, 3072, 4096]]})
    family = arch[:-1].replace("_", "")
    key = hashlib.sha256(name.encode()).hexdigest()
    k = Kernel(
        key=key, name=kernel_record_name(family, arch, 1, over.get("out_dtype", "float16"), key),
        family=family, arch=arch, acc_stages=over.get("acc_stages", 1),
        out_dtype=over.get("out_dtype", "float16"), options={}, symbol=f"{set_}_0",
        cubin=f"cubins/{name}.cubin", sha256=hashlib.sha256(image).hexdigest(),
        cubin_bytes=len(image), block=(384, 1, 1), cluster=(1, 1, 1), dynamic_smem=200 * 1024,
        sm_count=None, grid=Grid("persistent", 1), tile=Tile(128, 128, 256),
        tables=tables_of(TABLES), limits=limits,
        params=params if params is not None else sm90_params(),
    )
    k = k.replace(**{f: _typed(f, v) for f, v in over.items() if f not in _ENTRY_FIELDS})
    e = KernelEntry(name=name, set=set_, arch=arch, acc_stages=k.acc_stages,
                    out_dtype=k.out_dtype, serves=serves, kernel=k)
    return e.replace(**{f: v for f, v in over.items() if f in _ENTRY_FIELDS}), image


def swap(e: KernelEntry, **kernel_fields: Any) -> KernelEntry:
    """`e` served by a copy of its kernel with these fields replaced."""
    return e.replace(kernel=e.kernel.replace(
        **{f: _typed(f, v) for f, v in kernel_fields.items()}))


def write_artifacts(root: Path, entries: list[tuple[KernelEntry, bytes]]) -> Path:
    (root / "cubins").mkdir(parents=True, exist_ok=True)
    for e, image in entries:
        (root / e.cubin).write_bytes(image)
    manifest = make_manifest([e for e, _ in entries], "test", "4.8.1")
    (root / "manifest.json").write_text(manifest.to_json())
    return root


# ------------------------------------------------------------------ loading


def test_load_reads_only_the_manifest(tmp_path: Path) -> None:
    e, image = entry()
    store = ArtifactStore(write_artifacts(tmp_path, [(e, image)]))
    assert store.kernels == (e,)
    assert store.read_cubin(e) == image


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError) as exc:
        ArtifactStore(tmp_path / "nowhere")
    assert str(exc.value) == (
        f"no manifest at {tmp_path / 'nowhere' / 'manifest.json'}; build one with "
        "`python build_kernels.py build` or pass the artifact directory that holds manifest.json")


def test_malformed_manifest_json(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match=r"manifest.json is not valid JSON: Expecting "):
        ArtifactStore(tmp_path)


def test_wrong_schema_version(tmp_path: Path) -> None:
    write_artifacts(tmp_path, [entry()])
    obj = json.loads((tmp_path / "manifest.json").read_text())
    obj["schema_version"] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(obj))
    with pytest.raises(ManifestError) as exc:
        ArtifactStore(tmp_path)
    assert str(exc.value) == (
        f"{tmp_path / 'manifest.json'}: schema_version must be 3, but got 99; rebuild the "
        "artifacts with this version of build_kernels.py")


def test_cubin_missing(tmp_path: Path) -> None:
    e, image = entry()
    store = ArtifactStore(write_artifacts(tmp_path, [(e, image)]))
    (tmp_path / e.cubin).unlink()
    with pytest.raises(ArtifactError) as exc:
        store.read_cubin(e)
    assert str(exc.value) == (
        f"cubin of kernel 'dense.sm_90a.acc1.f16' is missing: {tmp_path / e.cubin}; rebuild the "
        "artifacts with `python build_kernels.py build` or restore the directory")


def test_cubin_altered_names_file_and_both_hashes(tmp_path: Path) -> None:
    e, image = entry()
    store = ArtifactStore(write_artifacts(tmp_path, [(e, image)]))
    bad = image[:-1] + b"X"
    (tmp_path / e.cubin).write_bytes(bad)
    with pytest.raises(ArtifactError) as exc:
        store.read_cubin(e)
    assert str(exc.value) == (
        f"cubin {tmp_path / e.cubin} of kernel 'dense.sm_90a.acc1.f16' has sha256 "
        f"{hashlib.sha256(bad).hexdigest()}, but the manifest records {e.sha256}; the file is "
        "altered or truncated, rebuild it")


def test_cubin_truncated(tmp_path: Path) -> None:
    e, image = entry()
    store = ArtifactStore(write_artifacts(tmp_path, [(e, image)]))
    (tmp_path / e.cubin).write_bytes(image[:40])
    with pytest.raises(ArtifactError) as exc:
        store.read_cubin(e)
    assert str(exc.value) == (
        f"cubin {tmp_path / e.cubin} of kernel 'dense.sm_90a.acc1.f16' has sha256 "
        f"{hashlib.sha256(image[:40]).hexdigest()}, but the manifest records {e.sha256}; it has "
        f"40 bytes, the manifest records {len(image)} (truncated); the file is altered or "
        "truncated, rebuild it")


def test_cubin_for_another_arch(tmp_path: Path) -> None:
    # A consistent manifest (sha matches) whose cubin was compiled for sm_100a.
    e, image = entry(cubin=fake_cubin("sm_100a", b"x"))
    store = ArtifactStore(write_artifacts(tmp_path, [(e, image)]))
    with pytest.raises(ArtifactError) as exc:
        store.read_cubin(e)
    assert str(exc.value) == (
        f"cubin {tmp_path / e.cubin} of kernel 'dense.sm_90a.acc1.f16' must target sm_90a "
        "(manifest), but its ELF header says sm_100a")


def test_cubin_plain_sm90_is_not_sm90a(tmp_path: Path) -> None:
    e, image = entry(cubin=fake_cubin("sm_90", b"x"))
    store = ArtifactStore(write_artifacts(tmp_path, [(e, image)]))
    with pytest.raises(ArtifactError, match="must target sm_90a .*ELF header says sm_90$"):
        store.read_cubin(e)


def test_not_a_cubin(tmp_path: Path) -> None:
    e, image = entry(cubin=b"// PTX text, not a cubin\n" * 4)
    store = ArtifactStore(write_artifacts(tmp_path, [(e, image)]))
    with pytest.raises(ArtifactError, match=r"is not a CUDA cubin: not an ELF file$"):
        store.read_cubin(e)


@pytest.mark.parametrize("arch", sorted(ELF_FLAGS))
def test_cubin_arch_from_measured_flags(arch: str) -> None:
    assert cubin_arch(fake_cubin(arch)) == arch


def test_param_layout_check_names_the_parameter() -> None:
    e, _ = entry()
    good = [(p.offset, p.size) for p in e.params]
    check_param_layout(e, good)
    bad = list(good)
    bad[5] = (bad[5][0] + 8, 8)
    with pytest.raises(ArtifactError) as exc:
        check_param_layout(e, bad)
    assert str(exc.value) == (
        f"kernel 'dense.sm_90a.acc1.f16': parameter 5 'workspace' must be at offset {good[5][0]} "
        f"with size 8 (manifest layout from a parameter base at 0 mod 128), but the cubin has "
        f"offset {good[5][0] + 8} and size 8. The manifest's ABI does not match the cubin; "
        "rebuild.")
    with pytest.raises(ArtifactError, match=r"records 9 parameters but the cubin's dense_0 has "
                                            r"8; first missing: params\[8\] 'num_groups'"):
        check_param_layout(e, good[:-1])
    with pytest.raises(ArtifactError, match=r"has 10 parameters but the manifest records 9; "
                                            r"extra \(offset, size\): \(600, 4\)"):
        check_param_layout(e, good + [(600, 4)])
    with pytest.raises(ArtifactError, match=r"parameter 8 'num_groups' must be at offset 544 "
                                            r"with size 4 .* has offset 544 and size 8"):
        check_param_layout(e, good[:-1] + [(544, 8)])


def test_param_layout_accepts_the_h200_parameter_base() -> None:
    # Measured on the H200 (driver 580) with a DSL kernel whose first parameter is a
    # CUtensorMap (align 64): cuFuncGetParamInfo reports every offset 48 bytes later than PTX,
    # because the constant-bank parameter base sits 16 bytes past a 64-byte boundary.
    params = _params([_tma("a")] + _tables() + [("num_groups", "scalar", 4, 4,
                                                 {"value": "num_groups"})])
    e, _ = entry(params=params)
    assert [p.offset for p in params] == [0, 128, 136, 144, 152, 160]
    measured = [(48, 128), (176, 8), (184, 8), (192, 8), (200, 8), (208, 4)]
    check_param_layout(e, measured)
    # The sm_100a-like ABI from the same base: zeros stay at 0, templates move by -16.
    e100, _ = entry(params=sm100_params())
    shifted = [(0, 12), (48, 128), (176, 128), (304, 128), (432, 128), (560, 8), (568, 8),
               (576, 8), (584, 8)]
    check_param_layout(e100, shifted)
    # A manifest whose offsets are not its own (size, align) packing is rejected first.
    tampered = swap(e, params=params[:-1] + (
        params[-1].replace(offset=164),))
    with pytest.raises(ArtifactError, match=r"parameter 5 'num_groups' must be at offset 160 "
                                            r"\(its size and alignment after the previous "
                                            r"parameters\), but the manifest records offset 164"):
        check_param_layout(tampered, measured)


# ------------------------------------------------------------------ dispatch

DENSE_A = [[192, 3072, 4096], [320, 3072, 4096]]
MOE_DOWN = [[40, 7168, 2048], [76, 7168, 2048], [168, 7168, 2048]]


def _shapes(groups: list) -> tuple[tuple[int, int, int], ...]:
    return tuple(tuple(g) for g in groups)


def test_dispatch_exact_match_per_arch() -> None:
    e90, _ = entry("dense_a.sm_90a.acc1.f16", set_="dense_a", groups=DENSE_A)
    e100, _ = entry("dense_a.sm_100a.acc1.f16", set_="dense_a", arch="sm_100a", groups=DENSE_A)
    index = KernelIndex([e90, e100])
    assert index.select(_shapes(DENSE_A), "sm_90a") is e90
    assert index.select(_shapes(DENSE_A), "sm_100a") is e100
    assert arch_for_capability((9, 0)) == "sm_90a"
    assert arch_for_capability((10, 0)) == "sm_100a"
    assert arch_for_capability((8, 9)) is None


def test_dispatch_no_match_lists_what_was_built() -> None:
    e1, _ = entry("dense_a.sm_90a.acc1.f16", set_="dense_a", groups=DENSE_A)
    e2, _ = entry("moe_down.sm_100a.acc2.f16", set_="moe_down", arch="sm_100a", groups=MOE_DOWN)
    e3, _ = entry("moe_dyn.sm_90a.acc1.f16", set_="moe_dyn", groups=[[7168, 2048]],
                  constraints={"dynamic_m": {"groups": [[7168, 2048]], "max_m": 4096}})
    index = KernelIndex([e1, e2, e3])
    with pytest.raises(NoKernelError) as exc:
        index.select(_shapes(MOE_DOWN), "sm_90a", "cuda:0 (NVIDIA H200, compute capability 9.0)")
    assert str(exc.value) == textwrap.dedent("""\
        no built kernel serves 3 group(s) with (m, n, k) = [(40, 7168, 2048), (76, 7168, 2048), \
(168, 7168, 2048)] and float16 output on cuda:0 (NVIDIA H200, compute capability 9.0) \
(sm_90a); nothing was launched.
        Built kernels (3):
          - set 'dense_a' sm_90a float16 (dense_a.sm_90a.acc1.f16): (m, n, k) = [(192, 3072, 4096), \
(320, 3072, 4096)]
          - set 'moe_down' sm_100a float16 (moe_down.sm_100a.acc2.f16): (m, n, k) = [(40, 7168, 2048), \
(76, 7168, 2048), (168, 7168, 2048)]
          - set 'moe_dyn' sm_90a float16 (moe_dyn.sm_90a.acc1.f16): any m <= 4096, (n, k) = [(7168, 2048)]
        Add the shapes to shapes.yaml and rebuild, or call with built shapes.""")


def test_dispatch_device_without_a_built_arch() -> None:
    e, _ = entry(groups=DENSE_A)
    with pytest.raises(NoKernelError, match=r"on cuda:0 \(an arch no kernel family targets\)"):
        KernelIndex([e]).select(_shapes(DENSE_A), None, "cuda:0")


def test_dispatch_prefers_exact_then_dynamic_m() -> None:
    exact, _ = entry("moe.exact", set_="moe", groups=MOE_DOWN)
    dyn, _ = entry("moe.dyn", set_="moe_dyn",
                   constraints={"dynamic_m": {"groups": [[7168, 2048]] * 3, "max_m": 256}})
    index = KernelIndex([dyn, exact])
    assert index.select(_shapes(MOE_DOWN), "sm_90a") is exact
    other = ((0, 7168, 2048), (13, 7168, 2048), (256, 7168, 2048))
    assert index.select(other, "sm_90a") is dyn
    with pytest.raises(NoKernelError):
        index.select(((257, 7168, 2048),) * 3, "sm_90a")  # above max_m
    with pytest.raises(NoKernelError):
        index.select(((8, 7168, 2048),) * 2, "sm_90a")  # group count differs


def test_load_rejects_malformed_served_shapes() -> None:
    e, _ = entry()
    record = json.loads(make_manifest([e], "t", "t").to_json())
    record["sets"][0]["serves"]["groups"] = [[1, 2]]
    with pytest.raises(ManifestError, match=r"manifest.sets\[0\].serves.groups\[0\] must be a "
                                            r"list of 3 ints, but got \[1, 2\]"):
        parse_manifest(record)


# ------------------------------------------------------------------ plan


def test_cta_prefix_for_known_shapes() -> None:
    shapes = _shapes(MOE_DOWN)  # tile 128x128: m tiles 1, 1, 2; n tiles 7168/128 = 56
    assert cta_prefix(shapes, 128, 128) == (0, 56, 112, 224)
    assert cta_prefix(shapes, 64, 128) == (0, 56, 168, 336)
    assert cta_prefix(((0, 4096, 256), (1, 100, 256)), 128, 128) == (0, 0, 1)


def test_plan_tables_grid_and_workspace() -> None:
    e, _ = entry(groups=DENSE_A)
    plan = make_plan(e, _shapes(DENSE_A), sm_count=132)
    # m tiles 2 and 3, n tiles 3072/128 = 24 -> 48 + 72 tiles.
    assert plan.cta_prefix == (0, 48, 120)
    assert plan.total_tiles == 120
    assert plan.grid == 120  # fewer tiles than 132 SMs x 1 CTA
    assert plan.workspace_bytes == 120 * 512
    assert plan.problem_sizes == struct.pack("<8i", 192, 3072, 4096, 1, 320, 3072, 4096, 1)
    assert plan.plan_tables[:32] == plan.problem_sizes
    assert plan.cta_prefix_offset == 128
    assert plan.plan_tables[128:140] == struct.pack("<3i", 0, 48, 120)
    # A call without alpha reads the plan's own ones (one float32 per group).
    assert plan.ones_offset == 256
    assert plan.plan_tables[256:] == struct.pack("<2f", 1.0, 1.0)
    big = make_plan(e, _shapes(MOE_DOWN), sm_count=132)
    assert big.total_tiles == 224 and big.grid == 132 and big.workspace_bytes == 132 * 512
    two = make_plan(swap(e, grid={"policy": "persistent", "ctas_per_sm": 2}),
                    _shapes(MOE_DOWN), sm_count=100)
    assert two.grid == 200


def test_plan_uses_recorded_column_order() -> None:
    tables = dict(TABLES, problem_sizes={"dtype": "int32", "columns": ["k", "m", "l", "n"]},
                  pointers={"dtype": "int64", "columns": ["c", "a", "b", "sfb", "sfa"]})
    e, _ = entry(groups=DENSE_A, tables=tables)
    plan = make_plan(e, _shapes(DENSE_A), sm_count=132)
    assert plan.problem_sizes == struct.pack("<8i", 4096, 192, 1, 3072, 4096, 320, 1, 3072)
    assert plan.pointer_columns == ("c", "a", "b", "sfb", "sfa")
    assert pointer_table_bytes(plan, [1, 2, 3, 4, 5]) == struct.pack("<5q", 1, 2, 3, 4, 5)


def test_plan_all_m_zero_launches_nothing() -> None:
    e, _ = entry()
    plan = make_plan(e, ((0, 3072, 4096), (0, 3072, 4096)), sm_count=132)
    assert (plan.total_tiles, plan.grid, plan.workspace_bytes) == (0, 0, 0)


def test_plan_rounds_grid_to_whole_clusters() -> None:
    e, _ = entry(cluster=(2, 1, 1))
    assert grid_size(e, 7, 132) == 8
    assert grid_size(e, 1000, 132) == 132
    with pytest.raises(ManifestError, match=r"cluster must be \(x, 1, 1\) \(a persistent 1-D "
                                            r"grid\), but got \[1, 2, 1\]"):
        check_kernel(swap(e, cluster=(1, 2, 1)).kernel)


def test_plan_every_sm_grid_ignores_the_tile_count() -> None:
    """Stream-K kernels split K over every CTA: 80 tiles still launch 132 CTAs."""
    e, _ = entry()
    sk = swap(e, grid={**e.grid.record(), "every_sm": True})
    assert grid_size(e, 80, 132) == 80
    assert grid_size(sk, 80, 132) == 132
    assert grid_size(sk, 1000, 132) == 132
    assert grid_size(sk, 0, 132) == 0  # nothing to compute: no launch
    record = json.loads(make_manifest([e], "t", "t").to_json())
    record["kernels"][0]["grid"]["every_sm"] = 1
    with pytest.raises(ManifestError, match=r"manifest.kernels\[0\].grid.every_sm must be bool, "
                                            r"but got int"):
        parse_manifest(record)


def test_plan_checks_baked_sm_count_and_policy() -> None:
    e, _ = entry(sm_count=148)
    with pytest.raises(ArtifactError) as exc:
        make_plan(e, _shapes(DENSE_A), sm_count=132)
    assert str(exc.value) == ("kernel 'dense.sm_90a.acc1.f16' was built for 148 SMs (baked into the "
                              "cubin), but the device has 132; rebuild it for this device")
    assert make_plan(e, _shapes(DENSE_A), sm_count=148).grid == 120
    bad, _ = entry(grid={"policy": "one_cta_per_tile", "ctas_per_sm": 1})
    with pytest.raises(ManifestError, match="grid.policy must be 'persistent', but got "
                                            "'one_cta_per_tile'"):
        check_kernel(bad.kernel)  # at load, before any plan


# ------------------------------------------------------------------ parameter packing

TEMPLATES = {f"tma_{op}": bytes([i + 1]) * 128 for i, op in enumerate(("a", "b", "sfa", "sfb"))}
TABLE_VALUES = {"pointers": 0x7F0000001000, "tensormap_workspace": 0x7F0000002000,
                "problem_sizes": 0x7F0000003000, "cta_prefix": 0x7F0000003080}


def test_pack_sm90_like_abi_exact_bytes() -> None:
    params = sm90_params()
    assert [(p.name, p.offset) for p in params] == [
        ("tma_a", 0), ("tma_b", 128), ("tma_sfa", 256), ("tma_sfb", 384), ("ptrs", 512),
        ("workspace", 520), ("sizes", 528), ("prefix", 536), ("num_groups", 544)]
    packed = pack_params(params, {**TEMPLATES, **TABLE_VALUES, "num_groups": 8})
    raw = packed.raw()
    assert len(raw) == 548
    expected = (b"\x01" * 128 + b"\x02" * 128 + b"\x03" * 128 + b"\x04" * 128
                + struct.pack("<4Q", 0x7F0000001000, 0x7F0000002000, 0x7F0000003000,
                              0x7F0000003080) + struct.pack("<I", 8))
    assert raw == expected
    # kernelParams: one pointer per parameter, each at its manifest offset in the buffer.
    base = ctypes.addressof(packed.buffer)
    ptrs = (ctypes.c_void_p * len(params)).from_address(packed.kernel_params)
    assert [p - base for p in ptrs] == [p.offset for p in params]
    assert ctypes.string_at(ptrs[8], 4) == struct.pack("<I", 8)


def test_pack_sm100_like_abi_exact_bytes() -> None:
    params = sm100_params()
    assert [(p.name, p.offset, p.size) for p in params] == [
        ("tiled_mma", 0, 12), ("tma_a", 64, 128), ("tma_b", 192, 128), ("tma_sfa", 320, 128),
        ("tma_sfb", 448, 128), ("ptrs", 576, 8), ("workspace", 584, 8), ("sizes", 592, 8),
        ("prefix", 600, 8)]
    packed = pack_params(params, {**TEMPLATES, **TABLE_VALUES})
    raw = packed.raw()
    assert len(raw) == 608
    assert raw[:64] == bytes(64)  # zeros state and alignment padding
    assert raw[64:576] == b"".join(TEMPLATES.values())
    assert struct.unpack_from("<4Q", raw, 576) == tuple(TABLE_VALUES.values())


def test_pack_per_call_update_and_missing_value() -> None:
    params = sm90_params()
    packed = pack_params(params, {**TEMPLATES, **TABLE_VALUES, "num_groups": 2})
    packed.set("pointers", 0x1234)
    packed.set("tensormap_workspace", 0x5678)
    packed.set("no_such_role", 1)  # roles the kernel does not take are ignored
    assert struct.unpack_from("<2Q", packed.raw(), 512) == (0x1234, 0x5678)
    values = {**TEMPLATES, **TABLE_VALUES}
    with pytest.raises(ManifestError, match=r"parameter 8 'num_groups' \(scalar\) needs a value "
                                            r"for 'num_groups'"):
        pack_params(params, values)
    with pytest.raises(ManifestError, match="a TMA template must be 128 bytes"):
        pack_params(params, {**values, "num_groups": 1, "tma_b": b"short"})


def test_tma_encode_args_map_names_to_driver_enums() -> None:
    from cuda.bindings import driver

    from runtime.tma import encode_args

    geo = TmaGeometry(dtype="16U4_ALIGN8B", dims=(256, 64, 8), strides=(128, 8192),
                      box=(256, 64, 1), element_strides=(1, 1, 1), swizzle="128B",
                      l2_promotion="256B")
    args = encode_args(geo, 0x7F0000000000)
    assert args[0] == driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B
    assert args[1:3] == (3, 0x7F0000000000)
    assert [int(x) for x in args[3]] == [256, 64, 8]
    assert [int(x) for x in args[4]] == [128, 8192]
    assert [int(x) for x in args[5]] == [256, 64, 1]
    assert all(isinstance(x, driver.cuuint32_t) for x in args[5] + args[6])
    assert args[7:] == (driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    with pytest.raises(ManifestError, match=r"TMA dtype 'FLOAT8' is not supported by this "
                                            r"cuda.bindings"):
        encode_args(geo.replace(dtype="FLOAT8"), 0x7F0000000000)
    with pytest.raises(ValueError, match="16-byte aligned"):
        encode_args(geo, 0x7F0000000008)


def test_launch_config_cluster_attribute_only_for_real_clusters() -> None:
    from runtime.launch import make_config

    plain = make_config(132, (384, 1, 1), 200 * 1024, (1, 1, 1))
    assert (plain.gridDimX, plain.blockDimX, plain.sharedMemBytes, plain.numAttrs) == (
        132, 384, 204800, 0)
    clustered = make_config(132, (256, 1, 1), 1024, (2, 1, 1))
    assert clustered.numAttrs == 1
    assert clustered.attrs[0].value.clusterDim.x == 2


def test_launch_config_cooperative_attribute() -> None:
    from cuda.bindings import driver

    from runtime.launch import make_config

    coop = make_config(132, (384, 1, 1), 1024, (1, 1, 1), cooperative=True)
    assert coop.numAttrs == 1
    assert coop.attrs[0].id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    assert coop.attrs[0].value.cooperative == 1
    both = make_config(132, (256, 1, 1), 1024, (2, 1, 1), cooperative=True)
    assert [a.id for a in both.attrs] == [
        driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE]


# ------------------------------------------------------------------ input validation


def group(m: int = 40, n: int = 256, k: int = 512, *, a_dtype=FP4, sf_dtype=E4M3):
    a = torch.zeros(m, k // 2, dtype=torch.uint8).view(a_dtype)
    b = torch.zeros(n, k // 2, dtype=torch.uint8).view(a_dtype)
    sfa = torch.zeros(blocked_scale_numel(m, k), dtype=torch.uint8).view(sf_dtype)
    sfb = torch.zeros(blocked_scale_numel(n, k), dtype=torch.uint8).view(sf_dtype)
    return a, b, sfa, sfb


def lists(*groups):
    return [list(x) for x in zip(*groups, strict=True)]


def structure_error(*args) -> str:
    # The fast path must defer every case the detailed checks reject.
    assert _fast(*args, cuda=False) is None
    with pytest.raises(InputError) as exc:
        check_structure(*args)
    return str(exc.value)


def test_blocked_scale_numel_formula() -> None:
    assert blocked_scale_numel(40, 2048) == 128 * 32 * 4
    assert blocked_scale_numel(129, 7168) == 256 * 112 * 4
    assert blocked_scale_numel(0, 256) == 0
    # The fast path inlines the formula; it must agree with the helper everywhere.
    for rows in (0, 1, 127, 128, 129, 300):
        for k in (16, 48, 64, 80, 256, 7168):
            a, b, sfa, sfb = lists(group(rows, 128, k))
            assert _fast(a, b, sfa, sfb, None, cuda=False) is not None, (rows, k)


def test_fast_path_agrees_with_detailed_checks() -> None:
    a, b, sfa, sfb = lists(group(40, 256, 512), group(0, 128, 1024, a_dtype=torch.uint8,
                                                         sf_dtype=torch.uint8))
    out = [torch.empty(40, 256, dtype=torch.float16), torch.empty(0, 128, dtype=torch.float16)]
    shapes, ordinal, ptrs = _fast(a, b, sfa, sfb, out, cuda=False)
    assert shapes == check_structure(a, b, sfa, sfb, out) == ((40, 256, 512), (0, 128, 1024))
    assert ptrs == tuple([t.data_ptr() for t in x] for x in (a, b, sfa, sfb, out))
    assert _fast(a, b, sfa, sfb, None, cuda=False)[2][4] == []
    # CPU tensors: the fast path defers and the detailed checks name the problem.
    assert _fast(a, b, sfa, sfb, out) is None
    with pytest.raises(InputError, match=r"^a_list\[0\] must be a CUDA tensor"):
        check_inputs(a, b, sfa, sfb, out)


def test_valid_structure_gives_shapes() -> None:
    a, b, sfa, sfb = lists(group(40, 256, 512), group(0, 128, 1024, a_dtype=torch.uint8,
                                                         sf_dtype=torch.uint8))
    out = [torch.empty(40, 256, dtype=torch.float16), torch.empty(0, 128, dtype=torch.float16)]
    assert check_structure(a, b, sfa, sfb, out) == ((40, 256, 512), (0, 128, 1024))


def test_list_errors() -> None:
    a, b, sfa, sfb = lists(group(), group())
    assert structure_error(a, b[:1], sfa, sfb, None) == (
        "b_list must have 2 tensors (one per group, like a_list), but got 1")
    assert structure_error([], [], [], [], None) == (
        "a_list must hold at least one tensor (one per group), but got an empty list")
    assert structure_error(a[0], b, sfa, sfb, None) == (
        "a_list must be a list or tuple of tensors, but got Tensor")
    assert structure_error(a, b, sfa, sfb, [torch.empty(40, 256, dtype=torch.float16)]) == (
        "out must have 2 tensors (one per group, like a_list), but got 1")


def test_dtype_and_shape_errors() -> None:
    a, b, sfa, sfb = lists(group(), group())
    bad = list(a)
    bad[1] = torch.zeros(40, 256, dtype=torch.float16)
    assert structure_error(bad, b, sfa, sfb, None) == (
        "a_list[1] must have dtype torch.float4_e2m1fn_x2 or torch.uint8, but got torch.float16")
    bad_sf = [sfa[0], sfa[1].view(torch.int8)]
    assert structure_error(a, b, bad_sf, sfb, None) == (
        "sfa_list[1] must have dtype torch.float8_e4m3fn or torch.uint8, but got torch.int8")
    assert structure_error(a, [b[0], "b"], sfa, sfb, None) == (
        "b_list[1] must be a torch.Tensor, but got str")
    assert structure_error([a[0].reshape(-1)], b[:1], sfa[:1], sfb[:1], None) == (
        "a_list[0] must be 2-D (m, k/2) packed fp4, but got shape (10240,)")
    wide_b = torch.zeros(256, 512, dtype=torch.uint8).view(FP4)
    assert structure_error(a[:1], [wide_b], sfa[:1], sfb[:1], None) == (
        "b_list[0].shape[1] must equal a_list[0].shape[1] = 256 (k/2 bytes, k = 512), "
        "but got 512")
    odd = torch.zeros(40, 4, dtype=torch.uint8)
    assert structure_error([odd], [torch.zeros(256, 4, dtype=torch.uint8)], sfa[:1], sfb[:1],
                           None) == (
        "a_list[0].shape[1] (k/2) must be a positive multiple of 8 (k a multiple of 16: one "
        "scale per 16 values), but got 4")


def test_scale_size_error_spells_out_the_layout() -> None:
    a, b, sfa, sfb = lists(group(40, 256, 512))
    short = torch.zeros(40 * 32, dtype=E4M3)  # plain (m, k/16): not the blocked layout
    assert structure_error(a, b, [short], sfb, None) == (
        "sfa_list[0] must have 4096 elements (blocked scale layout: ceil(40/128)*128 rows x "
        "ceil(512/64)*4 scale columns), but got 1280 (shape (1280,))")


def test_contiguity_and_out_errors() -> None:
    a, b, sfa, sfb = lists(group(40, 256, 512))
    strided = torch.zeros(40, 512, dtype=torch.uint8)[:, ::2]
    assert structure_error([strided], b, sfa, sfb, None) == (
        "a_list[0] must be contiguous, but got strides (512, 2) for shape (40, 256)")
    assert structure_error(a, b, sfa, sfb, [torch.empty(40, 256, dtype=torch.float32)]) == (
        "out[0] must have dtype torch.float16 or torch.bfloat16, but got torch.float32")
    # One kernel writes every group: mixed output dtypes are refused, naming out[0]'s.
    a2, b2, sfa2, sfb2 = lists(group(40, 256, 512), group(72, 256, 512))
    mixed = [torch.empty(40, 256, dtype=torch.bfloat16), torch.empty(72, 256, dtype=torch.float16)]
    assert structure_error(a2, b2, sfa2, sfb2, mixed) == (
        "out[1] must have out[0]'s dtype torch.bfloat16 (one kernel writes every group), but "
        "got torch.float16")
    assert structure_error(a, b, sfa, sfb, [torch.empty(256, 40, dtype=torch.float16)]) == (
        "out[0] must have shape (m, n) = (40, 256), but got (256, 40)")
    assert structure_error(a, b, sfa, sfb, [torch.empty(256, 40, dtype=torch.float16).t()]) == (
        "out[0] must be contiguous, but got strides (1, 40) for shape (40, 256)")


def test_cpu_tensor_must_be_a_cuda_tensor() -> None:
    a, b, sfa, sfb = lists(group())
    with pytest.raises(InputError) as exc:
        check_placement(a, b, sfa, sfb, None)
    assert str(exc.value) == "a_list[0] must be a CUDA tensor, but got a tensor on cpu"


def test_public_api_rejects_bad_input_before_touching_cuda(tmp_path: Path) -> None:
    import runtime

    gg = runtime.load(write_artifacts(tmp_path, [entry()]))
    a, b, sfa, sfb = lists(group())
    with pytest.raises(runtime.InputError, match="^a_list\\[0\\] must be a CUDA tensor, but got "
                                                 "a tensor on cpu$"):
        gg.grouped_gemm(a, b, sfa, sfb)
    with pytest.raises(runtime.InputError, match="^sfb_list must have 1 tensors"):
        gg.grouped_gemm(a, b, sfa, sfb + sfb)
    assert gg.kernels == gg.store.kernels
    assert isinstance(gg, runtime.GroupedGemm)


def test_output_overlap_is_rejected() -> None:
    pool = torch.zeros(1 << 16, dtype=torch.uint8)
    a, b, sfa, sfb = lists(group(40, 256, 512))
    inside_b = pool[:256 * 256].view(FP4).view(256, 256)
    out_on_b = pool[1024:1024 + 40 * 256 * 2].view(torch.float16).view(40, 256)
    with pytest.raises(InputError) as exc:
        check_no_overlap(a, [inside_b], sfa, sfb, [out_on_b])
    assert str(exc.value) == "out[0] must not overlap any other argument, but it overlaps b_list[0]"
    # An output that starts first and covers an input is caught too.
    out_first = pool[:40 * 256 * 2].view(torch.float16).view(40, 256)
    sfa_inside = pool[4096:4096 + 4096].view(E4M3)
    with pytest.raises(InputError, match=r"^out\[0\] must not overlap .* sfa_list\[0\]$"):
        check_no_overlap(a, b, [sfa_inside], sfb, [out_first])
    # Two outputs sharing memory.
    a2, b2, sfa2, sfb2 = lists(group(40, 256, 512), group(40, 256, 512))
    c = pool[:40 * 256 * 2].view(torch.float16).view(40, 256)
    with pytest.raises(InputError, match=r"^out\[1\] must not overlap .* out\[0\]$"):
        check_no_overlap(a2, b2, sfa2, sfb2, [c, c])
    # Disjoint: fine.
    check_no_overlap(a, b, sfa, sfb, [torch.empty(40, 256, dtype=torch.float16)])


# ------------------------------------------------------------------ import hygiene


def test_runtime_never_imports_cutlass(tmp_path: Path) -> None:
    root = write_artifacts(tmp_path / "art", [entry(groups=DENSE_A)])
    code = textwrap.dedent(f"""
        import sys
        import runtime
        assert "torch" not in sys.modules, "import runtime must stay cheap"
        assert "cuda.bindings.driver" not in sys.modules
        import torch
        from runtime.plan import make_plan
        from runtime.params import pack_params
        from runtime.launch import make_config
        from runtime.tma import encode_args
        gg = runtime.load({str(root)!r})
        (e,) = gg.kernels
        gg.store.read_cubin(e)
        assert gg.index.select(((192, 3072, 4096), (320, 3072, 4096)), "sm_90a") is e
        plan = make_plan(e, ((192, 3072, 4096), (320, 3072, 4096)), 132)
        make_config(plan.grid, e.block, e.dynamic_smem, e.cluster)
        try:
            gg.grouped_gemm([torch.zeros(8, 8, dtype=torch.uint8)], [], [], [])
        except runtime.InputError:
            pass
        bad = [m for m in sys.modules if m == "cutlass" or m.startswith(("cutlass.", "kernels",
                                                                          "builder"))]
        assert not bad, bad
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


@pytest.mark.dsl
@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                    reason="nvidia-cutlass-dsl not installed")
def test_toy_kernel_artifacts_load(tmp_path: Path) -> None:
    """The GPU tests' toy kernel builds with the DSL and its artifacts pass every CPU check."""
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, str(REPO / "tests" / "toy_kernel.py"),
                          str(tmp_path / "toy")], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    store = ArtifactStore(tmp_path / "toy")
    for e in store.kernels:
        assert store.read_cubin(e)[:4] == b"\x7fELF"
        assert [p.kind for p in e.params] == ["tma_template"] + ["table"] * 4 + ["scalar"]
    index = KernelIndex(store.kernels)
    assert index.select(((0, 256, 512), (3, 128, 256)), "sm_90a").set == "toy_dyn"


def test_runtime_sources_do_not_import_build_time_packages() -> None:
    for path in sorted((REPO / "runtime").glob("*.py")):
        text = path.read_text()
        for banned in ("import cutlass", "from cutlass", "import kernels", "from kernels",
                       "import builder", "from builder"):
            assert banned not in text, f"{path.name} contains {banned!r}"


def test_schema1_artifacts_get_an_error_naming_the_schema(tmp_path: Path) -> None:
    """A directory built before manifest schema 2 (issue 25) is refused with the fix."""
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"schema_version": 1, "builder_version": "2", "dsl_version": "4.3", "kernels": []}))
    with pytest.raises(ManifestError) as exc:
        ArtifactStore(tmp_path)
    assert str(exc.value) == (
        f"{tmp_path / 'manifest.json'}: schema_version must be 3, but got 1 (schema 1 gave every "
        "set its own cubin; schema 2 shares one per distinct kernel); rebuild the artifacts with "
        "this version of build_kernels.py")


def test_sets_share_one_kernel_record(tmp_path: Path) -> None:
    a, image = entry("a.sm_90a.acc1.f16", set_="a")
    b = a.replace(name="b.sm_90a.acc1.f16", set="b",
                            serves=Serves(((64, 3072, 4096),)))
    store = ArtifactStore(write_artifacts(tmp_path, [(a, image), (b, image)]))
    assert len(store.manifest.kernels) == 1 and len(store.kernels) == 2
    assert store.kernels[0].kernel is store.kernels[1].kernel
    index = KernelIndex(store.kernels)
    assert index.select(((64, 3072, 4096),), "sm_90a").name == "b.sm_90a.acc1.f16"
