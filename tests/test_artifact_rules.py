"""Issue 28: one check of the launch data for load, verify, package and the builder's reuse;
self-contained artifact directories; the planner and device errors are the runtime's own.

Artifacts come from the fake family build (tests/fakefam.py): real worker subprocesses,
synthetic cubins, a directory that verifies.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Fake
from test_build_pipeline import cli, run
from test_runtime_cpu import entry

import runtime
from builder.package import PackageError, build_wheel
from builder.verify import verify_dir
from runtime.errors import ArtifactError, DeviceError, InputError, ManifestError
from runtime.loader import ArtifactStore
from runtime.manifest import MANIFEST_NAME, load_manifest
from runtime.plan import make_plan

SPEC = """\
schema_version: 1
defaults:
  archs: [sm_90a]
  acc_stages: [1]
  out_dtypes: [float16]
sets:
  - name: dense
    groups: [[192, 3072, 4096]]
  - name: mixed
    groups: [[96, 1024, 512], [40, 2048, 768]]
  - name: anym
    m: dynamic
    groups: [[1024, 512]]
"""
DENSE = "dense.sm_90a.acc1.f16"
TABLES = {"problem_sizes": {"dtype": "int32", "columns": ["m", "n", "k", "l"]},
          "pointers": {"dtype": "int64", "columns": ["a", "b", "sfa", "sfb", "c"]},
          "cta_prefix": {"dtype": "int32"},
          "tensormap_workspace": {"bytes_per_cta": 512, "align": 128}}  # tests/fakefam.py's

# (field, corrupt value, what the error names): each parses as JSON types but cannot launch.
CORRUPT = [
    ("dynamic_smem", 10**9, "dynamic_smem must be in 0..232448"),
    ("block", [2048, 1, 1], "block must be (x, y, z)"),
    ("tile", {"m": 0, "n": 128, "k": 256}, "tile.m must be a positive int"),
    ("serves", {"groups": [[192, 3072]]}, "serves.groups[0] must be a list of 3 ints"),
    ("serves", {"groups": [[192, 3072, 2**31]]}, "serves.groups[0] must be m, n, k"),
    # Table layouts the kernels cannot read (runtime/formats.py): load and verify took them.
    ("tables", {**TABLES, "problem_sizes": {"dtype": "int64", "columns": list("mnkl")}},
     "tables.problem_sizes.dtype must be 'int32' (the kernels read int32 sizes), but got "
     "'int64'"),
    ("tables", {**TABLES, "cta_prefix": {"dtype": "int64"}},
     "tables.cta_prefix.dtype must be 'int32' (the kernels read int32 tile counts), but got "
     "'int64'"),
    ("tables", {**TABLES, "problem_sizes": {"dtype": "int32", "columns": ["n", "k", "l"]}},
     "tables.problem_sizes.columns must be ['m', 'n', 'k', 'l'] in some order, each once, but "
     "got ['n', 'k', 'l']"),
    ("tables", {**TABLES, "pointers": {"dtype": "int64", "columns": ["a"]}},
     "tables.pointers.columns must be ['a', 'b', 'sfa', 'sfb', 'c'] in some order, each once, "
     "but got ['a']"),
    ("tables", {**TABLES, "pointers": {"dtype": "int64",
                                       "columns": ["a", "b", "sfa", "sfb", "c", "c"]}},
     "tables.pointers.columns must be ['a', 'b', 'sfa', 'sfb', 'c'] in some order, each once, "
     "but got ['a', 'b', 'sfa', 'sfb', 'c', 'c']"),
    ("tables", {**TABLES, "tensormap_workspace": {"bytes_per_cta": 2**62, "align": 128}},
     f"tables.tensormap_workspace.bytes_per_cta must be below 2^40 (1 TiB), but got {2**62}"),
    ("serves", {"dynamic_m": {"groups": [[3072, 4096]], "max_m": None, "maxm": 64}},
     "serves.dynamic_m has unknown key(s) ['maxm']: it must be an object "
     '{"groups": [[n, k], ...], "max_m": int or null}'),
]
SET_FIELDS = ("serves",)


def _edit(art: Path, name: str, **fields: Any) -> None:
    path = art / MANIFEST_NAME
    obj = json.loads(path.read_text())
    (entry,) = (e for e in obj["sets"] if e["name"] == name)
    entry.update({f: v for f, v in fields.items() if f in SET_FIELDS})
    for k in obj["kernels"]:  # the kernel that serves the set (no other set shares it here)
        if k["key"] == entry["kernel"]:
            k.update({f: v for f, v in fields.items() if f not in SET_FIELDS})
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")


@pytest.fixture
def art(fake: Fake, tmp_path: Path) -> Path:
    out = tmp_path / "artifacts"
    run(fake, out, SPEC)
    return out


# ------------------------------------------------------------------ case 3: verify == load


@pytest.mark.parametrize("field,value,message", CORRUPT, ids=[c[2][:24] for c in CORRUPT])
def test_verify_package_and_load_refuse_the_same_launch_data(
        art: Path, tmp_path: Path, field: str, value: Any, message: str) -> None:
    _edit(art, DENSE, **{field: value})
    with pytest.raises(ManifestError, match=re.escape(message)):
        runtime.load(art)
    problems = verify_dir(art)
    assert len(problems) == 1 and message in problems[0], problems
    with pytest.raises(PackageError, match="does not verify"):
        build_wheel(art, tmp_path / "dist")


# ------------------------------------------------------------------ case 2: no copy-forward


@pytest.mark.parametrize("field,value,message", CORRUPT, ids=[c[2][:24] for c in CORRUPT])
def test_rebuild_recompiles_an_entry_with_corrupt_launch_data(
        fake: Fake, art: Path, field: str, value: Any, message: str) -> None:
    good = load_manifest(art).entry(DENSE)
    _edit(art, DENSE, **{field: value})
    before = len(fake.compiles())
    report = run(fake, art, SPEC)
    assert report.changed
    # Only the damaged kernel; a damaged set record costs no compile (the spec gives it again).
    assert len(fake.compiles()) == before + (field not in SET_FIELDS)
    assert any(message in n for n in report.notes), report.notes
    assert load_manifest(art).entry(DENSE) == good
    assert verify_dir(art) == []
    runtime.load(art)


@pytest.mark.parametrize("field,value", [
    ("serves", {"groups": [[200, 3072, 4096]]}),  # valid, not the spec's
    ("serves", {"dynamic_m": {"groups": [[3072, 4096]], "max_m": None}}),
    ("options", {"tile_m": 64}),
])
def test_rebuild_rederives_what_the_spec_fixes(fake: Fake, art: Path, field: str,
                                               value: Any) -> None:
    good = load_manifest(art).entry(DENSE)
    _edit(art, DENSE, **{field: value})
    runtime.load(art)  # still a valid manifest: only the spec can tell it is wrong
    before = len(fake.compiles())
    report = run(fake, art, SPEC)
    if field in SET_FIELDS:  # set records always come from the spec: nothing to compile
        assert len(fake.compiles()) == before and report.changed
    else:
        assert len(fake.compiles()) == before + 1
        assert any(f"cannot be reused ({field}" in n for n in report.notes), report.notes
    assert load_manifest(art).entry(DENSE) == good


# ------------------------------------------------------------------ case 4: list / inspect


@pytest.mark.parametrize("command", [["list"], ["inspect", "dense"]])
def test_list_and_inspect_on_a_malformed_manifest_print_an_error(
        fake: Fake, art: Path, command: list[str]) -> None:
    _edit(art, DENSE, serves={"groups": [[192]]})
    args = [*command, str(art)] if command == ["list"] else [*command, "--artifacts", str(art)]
    r = cli(fake, *args)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    assert "serves.groups[0] must be a list of 3 ints" in r.stderr


# ------------------------------------------------------------------ case 4: no GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
@pytest.mark.parametrize("call", ["select", "preload"])
def test_select_and_preload_without_a_gpu_raise_device_error(art: Path, call: str) -> None:
    gg = runtime.load(art)
    with pytest.raises(DeviceError, match="must be a CUDA device, but this machine has none"):
        if call == "select":
            gg.select([(192, 3072, 4096)])
        else:
            gg.preload()


# ------------------------------------------------------------------ case 5: the planner


@pytest.mark.parametrize("shapes,message", [
    ([(192, 3072, 2**31)], "group 0: k must be in 0..2147483647"),
    ([(1, 2**31, 4096)], "group 0: n must be in 0..2147483647"),
])
def test_make_plan_raises_input_error_for_values_its_tables_cannot_hold(
        shapes: list, message: str) -> None:
    e, _ = entry()
    with pytest.raises(InputError, match=message):
        make_plan(e, shapes, 132)
    try:
        make_plan(e, shapes, 132)
    except InputError as exc:
        assert not isinstance(exc.__context__, struct.error)


# ------------------------------------------------------------------ case 6: self-contained


def _outside_copy(art: Path, tmp_path: Path, rel: str) -> Path:
    outside = tmp_path / "elsewhere" / Path(rel).name
    outside.parent.mkdir(exist_ok=True)
    shutil.move(art / rel, outside)
    return outside


def test_a_cubin_symlinked_out_of_the_directory_is_refused(art: Path, tmp_path: Path) -> None:
    e = load_manifest(art).entry(DENSE)
    os.symlink(_outside_copy(art, tmp_path, e.cubin), art / e.cubin)
    problems = verify_dir(art)
    assert any("must be inside the artifact directory" in p for p in problems), problems
    with pytest.raises(ArtifactError, match="a symlink out of it"):
        ArtifactStore(art).read_cubin(e)


def test_a_cubins_directory_symlinked_out_is_refused(art: Path, tmp_path: Path) -> None:
    e = load_manifest(art).entry(DENSE)
    os.symlink(_outside_copy(art, tmp_path, "cubins"), art / "cubins")
    assert len([p for p in verify_dir(art) if "must be inside" in p]) == 1  # one kernel serves the three sets
    with pytest.raises(ArtifactError, match="a symlink out of it"):
        ArtifactStore(art).read_cubin(e.replace())


# ------------------------------------------------------------------ case 7: JSON Python can't read

# Valid JSON that json.loads still refuses: it recursed once per level (RecursionError) and
# refuses integer literals past sys.get_int_max_str_digits() (ValueError). Both escaped load,
# verify, list, merge and the next build as tracebacks.
UNREADABLE = [
    ("[" * 100_000, "its JSON nests arrays or objects too deeply to read (a manifest nests a "
                    "few levels)"),
    ('{"schema_version": ' + "9" * 5000 + "}",
     f"Exceeds the limit ({sys.get_int_max_str_digits()} digits) for integer string "
     "conversion: value has 5000 digits"),
]


def _refused_by_load_verify_and_list(fake: Fake, art: Path, message: str) -> None:
    """runtime.load raises `message`, verify reports it alone, `list` prints it and exits 1."""
    with pytest.raises(ManifestError) as info:
        runtime.load(art)
    assert str(info.value) == message
    assert verify_dir(art) == [message]
    r = cli(fake, "list", str(art))
    assert (r.returncode, r.stderr) == (1, f"error: {message}\n")


@pytest.mark.parametrize("text,problem", UNREADABLE, ids=["nested", "long_int"])
def test_a_manifest_json_cannot_parse_is_a_manifest_error_everywhere(
        fake: Fake, art: Path, tmp_path: Path, text: str, problem: str) -> None:
    path = art / MANIFEST_NAME
    path.write_text(text)
    message = f"{path} is not a manifest: {problem}"
    _refused_by_load_verify_and_list(fake, art, message)
    r = cli(fake, "merge", str(tmp_path / "merged"), str(art))
    assert (r.returncode, r.stderr) == (1, f"error: cannot merge {art}: {message}\n")
    assert not (tmp_path / "merged").exists()
    report = run(fake, art, SPEC)  # the next build replaces it
    assert f"the existing manifest cannot be reused ({message}); rebuilding everything" \
        in report.notes
    assert verify_dir(art) == []


# ------------------------------------------------------------------ case 8: fields that crashed

# (field, tampered value, the error after "<manifest>.sets[1]" or "<manifest>.kernels[0]"):
# load built 10**12 rows (MemoryError), a NUL in a path raised ValueError in verify and the
# build, a lone surrogate in the symbol UnicodeEncodeError where they look for it in the cubin.
TAMPERED = [
    ("serves", {"dynamic_m": {"experts": 10**12, "group": [1024, 512], "max_m": None}},
     ".serves.dynamic_m.experts must be at most 1024 (the groups a set may have), but got "
     "1000000000000"),
    ("cubin", "cubins/a\0b", ".cubin must be a path of printable characters (no NUL or other "
     "control characters), but got 'cubins/a\\x00b'"),
    ("cubin", "cubins/a\nb.cubin", ".cubin must be a path of printable characters (no NUL or "
     "other control characters), but got 'cubins/a\\nb.cubin'"),
    ("symbol", "\udcff", ".symbol must be a PTX identifier ([A-Za-z_$][A-Za-z0-9_$]*), but got "
     "'\\udcff'"),
    ("symbol", "fake gemm", ".symbol must be a PTX identifier ([A-Za-z_$][A-Za-z0-9_$]*), but "
     "got 'fake gemm'"),
]


@pytest.mark.parametrize("field,value,problem", TAMPERED,
                         ids=["experts", "cubin_nul", "cubin_newline", "symbol_surrogate",
                              "symbol_space"])
def test_a_tampered_field_is_named_by_load_verify_list_and_the_next_build(
        fake: Fake, art: Path, field: str, value: Any, problem: str) -> None:
    _edit(art, DENSE, **{field: value})
    at = "sets[1]" if field in SET_FIELDS else "kernels[0]"  # dense; the one shared kernel
    message = f"{art / MANIFEST_NAME}.{at}{problem}"
    _refused_by_load_verify_and_list(fake, art, message)
    report = run(fake, art, SPEC)
    assert any(problem in n for n in report.notes), report.notes
    assert verify_dir(art) == []
