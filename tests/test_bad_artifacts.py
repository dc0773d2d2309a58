"""Bad artifacts at load: each a ManifestError or ArtifactError with an exact message (issue 6).

Most cases use REAL cubins, so the ELF checks (arch, the parameter list ptxas records in
.nv.info) run on what the driver would load: two kernels (one sm_90a, one sm_100a) copied from
$NVFP4_ARTIFACTS (default <repo>/artifacts) when it has them, else compiled here with the DSL
from the fake family's trivial kernel (tests/fakefam.py; a few seconds). The arch-against-device
check runs without a GPU by passing the device's compute capability; the GPU tests at the end
load tampered copies for real (skipped without a GPU).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import dsl_available
from fakefam import write_fake_package

import runtime
from builder.verify import verify_dir
from runtime.errors import ArtifactError, ManifestError, Nvfp4Error
from runtime.loader import (
    ArtifactStore,
    check_cubin_for_device,
    check_device,
    check_param_layout,
    cubin_frame_size,
    cubin_param_layout,
    device_offsets,
)
from runtime.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    load_manifest,
    make_manifest,
    pack_offsets,
    parse_kernel,
    parse_manifest,
)

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(REPO / "artifacts")
H200 = "cuda:0 (NVIDIA H200, compute capability 9.0)"
B200 = "cuda:0 (NVIDIA B200, compute capability 10.0)"


# --------------------------------------------------------------------------------------------
# A directory with one real sm_90a and one real sm_100a kernel
# --------------------------------------------------------------------------------------------


def _from_artifacts(dst: Path) -> bool:
    import os

    src = Path(os.environ.get("NVFP4_ARTIFACTS", ARTIFACTS))
    try:
        m = load_manifest(src)
    except ManifestError:
        return False
    picked = []
    for arch in ("sm_90a", "sm_100a"):
        ok = [e for e in m.sets if e.arch == arch and (src / e.cubin).is_file()]
        if not ok:
            return False
        picked.append(min(ok, key=lambda e: e.cubin_bytes))
    (dst / "cubins").mkdir(parents=True)
    for e in picked:
        shutil.copyfile(src / e.cubin, dst / e.cubin)
    out = make_manifest(picked, m.builder_version, m.dsl_version)
    (dst / MANIFEST_NAME).write_text(out.to_json())
    return True


def _from_dsl(dst: Path, scratch: Path) -> bool:
    if not dsl_available():
        return False
    from builder.build import build
    from builder.families import load_families
    from builder.plan import expand
    from builder.spec import parse_spec_text

    scratch.mkdir(parents=True)
    pkg = write_fake_package(scratch)
    sys.path.insert(0, str(scratch))
    try:
        fams = load_families(f"{pkg}.dsl_families")
        spec = ("schema_version: 1\ndefaults:\n  archs: [sm_90a, sm_100a]\n"
                "  acc_stages: {sm_100a: [1], sm_90a: [1]}\n"
                "sets:\n  - name: tiny\n    groups: [[96, 1024, 512]]\n")
        build(expand(parse_spec_text(spec, "shapes.yaml", fams), fams), dst, fams, jobs=2)
    finally:
        sys.path.remove(str(scratch))
    return True


@pytest.fixture(scope="module")
def real_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("real")
    if _from_artifacts(base / "art") or _from_dsl(base / "art", base / "fake"):
        return base / "art"
    pytest.skip("no artifacts and no nvidia-cutlass-dsl to compile a real cubin")


@pytest.fixture
def art(real_dir: Path, tmp_path: Path) -> Path:
    """A fresh copy to break."""
    shutil.copytree(real_dir, tmp_path / "art")
    return tmp_path / "art"


def kernel(directory: Path, arch: str = "sm_90a"):
    """The first set entry for `arch` (what the runtime loads first)."""
    return next(e for e in load_manifest(directory).sets if e.arch == arch)


def _kernel_record(obj: dict, name: str) -> dict:
    """The JSON kernel record serving set entry `name` (manifest schema 2)."""
    key = next(s["kernel"] for s in obj["sets"] if s["name"] == name)
    return next(k for k in obj["kernels"] if k["key"] == key)


def edit(directory: Path, name: str, **changes: Any) -> dict:
    """Change fields of the kernel record that serves set entry `name`; returns the record."""
    path = directory / MANIFEST_NAME
    obj = json.loads(path.read_text())
    k = _kernel_record(obj, name)
    k.update(changes)
    path.write_text(json.dumps(obj, indent=1))
    return k


def recorded_params(directory: Path, name: str) -> list[dict]:
    """The parameter records of set entry `name`'s kernel as the manifest JSON holds them."""
    return _kernel_record(json.loads((directory / MANIFEST_NAME).read_text()), name)["params"]


def write_cubin(directory: Path, e, data: bytes, *, match_manifest: bool) -> None:
    """Replace a cubin; with match_manifest, also its sha256 and size, so that only the
    checks past the hash can notice."""
    (directory / e.cubin).write_bytes(data)
    if match_manifest:
        edit(directory, e.name, sha256=hashlib.sha256(data).hexdigest(), cubin_bytes=len(data))


def read_error(directory: Path, arch: str = "sm_90a") -> str:
    store = ArtifactStore(directory)
    e = next(k for k in store.kernels if k.arch == arch)
    with pytest.raises(ArtifactError) as info:
        store.read_cubin(e)
    return str(info.value)


# --------------------------------------------------------------------------------------------
# The manifest
# --------------------------------------------------------------------------------------------


def _no_manifest(path: Path) -> str:
    return (f"no manifest at {path / MANIFEST_NAME}; build one with `python build_kernels.py "
            "build` or pass the artifact directory that holds manifest.json")


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ManifestError) as info:
        runtime.load(tmp_path / "nowhere")
    assert str(info.value) == _no_manifest(tmp_path / "nowhere")


def test_directory_without_manifest(art: Path) -> None:
    (art / MANIFEST_NAME).unlink()
    with pytest.raises(ManifestError) as info:
        runtime.load(art)
    assert str(info.value) == _no_manifest(art)


def test_manifest_is_a_directory(tmp_path: Path) -> None:
    """Issue 28 (7): a directory in manifest.json's place is not reported as missing."""
    (tmp_path / MANIFEST_NAME).mkdir()
    with pytest.raises(ManifestError) as info:
        runtime.load(tmp_path)
    assert str(info.value) == (f"{tmp_path / MANIFEST_NAME} is not a file (it is a directory or "
                               "a special file); it must be the manifest.json a build wrote")


@pytest.mark.parametrize("data,reason", [
    (b"{not json", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    (b"", "Expecting value: line 1 column 1 (char 0)"),
    (b'{"schema_version": 1, "kernels": [', "Expecting value: line 1 column 35 (char 34)"),
    (b"\xff\xfe\x00garbage", ("'utf-8' codec can't decode byte 0xff in position 0: invalid "
                              "start byte")),
], ids=["malformed", "empty", "cut_short", "binary"])
def test_manifest_not_json(tmp_path: Path, data: bytes, reason: str) -> None:
    (tmp_path / MANIFEST_NAME).write_bytes(data)
    with pytest.raises(ManifestError) as info:
        runtime.load(tmp_path)
    assert str(info.value) == f"{tmp_path / MANIFEST_NAME} is not valid JSON: {reason}"


def test_manifest_not_an_object(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME).write_text("[1, 2]")
    with pytest.raises(ManifestError) as info:
        runtime.load(tmp_path)
    assert str(info.value) == f"{tmp_path / MANIFEST_NAME} must be an object, but got list"


@pytest.mark.parametrize("version,message", [
    (SCHEMA_VERSION + 1, ("schema_version must be 3, but got 4; rebuild the artifacts with "
                          "this version of build_kernels.py")),
    (1, ("schema_version must be 3, but got 1 (schema 1 gave every set its own cubin; schema 2 "
         "shares one per distinct kernel); rebuild the artifacts with this version of "
         "build_kernels.py")),
    (2, ("schema_version must be 3, but got 2 (schema 2 wrote an expert set's E equal (n, k) "
         "rows out; schema 3 writes one, with `experts`); rebuild the artifacts with this "
         "version of build_kernels.py")),
    (0, ("schema_version must be 3, but got 0; rebuild the artifacts with this version of "
         "build_kernels.py")),
    ("1", ".schema_version must be int, but got str"),
    (None, ".schema_version is missing"),
], ids=["newer", "schema1", "schema2", "older", "string", "missing"])
def test_unknown_schema_version(art: Path, version: Any, message: str) -> None:
    path = art / MANIFEST_NAME
    obj = json.loads(path.read_text())
    if version is None:
        del obj["schema_version"]
    else:
        obj["schema_version"] = version
    path.write_text(json.dumps(obj))
    with pytest.raises(ManifestError) as info:
        runtime.load(art)
    sep = "" if message.startswith(".") else ": "
    assert str(info.value) == f"{path}{sep}{message}"


def test_kernel_entry_missing_a_field(art: Path) -> None:
    path = art / MANIFEST_NAME
    obj = json.loads(path.read_text())
    del obj["kernels"][1]["sha256"]
    path.write_text(json.dumps(obj))
    with pytest.raises(ManifestError) as info:
        runtime.load(art)
    assert str(info.value) == f"{path}.kernels[1].sha256 is missing"


def _with_a_twin(art: Path) -> dict:
    """The manifest with a copy of kernels[0] appended under a new key and name."""
    obj = json.loads((art / MANIFEST_NAME).read_text())
    twin = json.loads(json.dumps(obj["kernels"][0]))
    twin["key"], twin["name"] = "twin" + twin["key"][4:], twin["name"] + ".twin"
    obj["kernels"].append(twin)
    return obj


def test_kernels_sharing_an_abi_share_its_parse(art: Path) -> None:
    # parse_manifest parses each distinct parameter object once (a quarter of runtime.load).
    obj = _with_a_twin(art)
    m = parse_manifest(obj, "m")
    first, twin = m.kernels[0], m.kernels[-1]
    assert twin.params == first.params == parse_kernel(obj["kernels"][-1], "k").params
    assert all(a is b for a, b in zip(twin.params, first.params, strict=True))


def test_a_bool_never_takes_the_parse_of_an_equal_int(art: Path) -> None:
    # JSON's false == 0: a memo keyed by == would accept the twin's bool offset silently.
    obj = _with_a_twin(art)
    assert obj["kernels"][0]["params"][0]["offset"] == 0
    obj["kernels"][-1]["params"][0]["offset"] = False
    with pytest.raises(ManifestError) as info:
        parse_manifest(obj, "m")
    n = len(obj["kernels"]) - 1
    assert str(info.value) == f"m.kernels[{n}].params[0].offset must be int, but got bool"


def test_repeated_set_names_are_named_once(art: Path) -> None:
    obj = json.loads((art / MANIFEST_NAME).read_text())
    first = obj["sets"][0]
    obj["sets"] += [dict(first), dict(first)]  # three entries of one name
    with pytest.raises(ManifestError) as info:
        parse_manifest(obj, "m")
    assert str(info.value) == (f"m: set entry names must be unique, but [{first['name']!r}] "
                               "repeat")


def test_cubin_path_outside_the_directory(art: Path) -> None:
    e = kernel(art)
    edit(art, e.name, cubin="../elsewhere/k.cubin")
    i = _index(art, e.name)
    with pytest.raises(ManifestError) as info:
        runtime.load(art)
    assert str(info.value) == (f"{art / MANIFEST_NAME}.kernels[{i}].cubin must be a relative "
                               "path inside the artifact directory")


def _index(directory: Path, name: str) -> int:
    """Where the kernel record serving set entry `name` is in the manifest's kernels list."""
    obj = json.loads((directory / MANIFEST_NAME).read_text())
    return obj["kernels"].index(_kernel_record(obj, name))


# --------------------------------------------------------------------------------------------
# The cubins: presence, hash, arch, ELF
# --------------------------------------------------------------------------------------------


def test_cubin_missing(art: Path) -> None:
    e = kernel(art)
    (art / e.cubin).unlink()
    assert read_error(art) == (
        f"cubin of kernel {e.name!r} is missing: {art / e.cubin}; rebuild the artifacts with "
        "`python build_kernels.py build` or restore the directory")


def test_cubin_replaced_by_a_directory(art: Path) -> None:
    e = kernel(art)
    (art / e.cubin).unlink()
    (art / e.cubin).mkdir()
    assert read_error(art).startswith(f"cubin of kernel {e.name!r} is missing: ")


@pytest.mark.parametrize("keep", [0, 64, 0.5, -1], ids=["empty", "header_only", "half",
                                                         "one_byte_short"])
def test_cubin_truncated(art: Path, keep: float) -> None:
    e = kernel(art)
    data = (art / e.cubin).read_bytes()
    cut = data[:int(len(data) * keep) if isinstance(keep, float) else keep]
    (art / e.cubin).write_bytes(cut)
    assert read_error(art) == (
        f"cubin {art / e.cubin} of kernel {e.name!r} has sha256 "
        f"{hashlib.sha256(cut).hexdigest()}, but the manifest records {e.sha256}; it has "
        f"{len(cut)} bytes, the manifest records {e.cubin_bytes} (truncated); the file is "
        "altered or truncated, rebuild it")


def test_cubin_altered_in_place(art: Path) -> None:
    e = kernel(art)
    data = bytearray((art / e.cubin).read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit in the middle of the code
    (art / e.cubin).write_bytes(bytes(data))
    assert read_error(art) == (
        f"cubin {art / e.cubin} of kernel {e.name!r} has sha256 "
        f"{hashlib.sha256(data).hexdigest()}, but the manifest records {e.sha256}; the file is "
        "altered or truncated, rebuild it")


def test_cubin_swapped_with_another_kernels(art: Path) -> None:
    e90, e100 = kernel(art), kernel(art, "sm_100a")
    other = (art / e100.cubin).read_bytes()
    (art / e90.cubin).write_bytes(other)
    assert read_error(art).startswith(
        f"cubin {art / e90.cubin} of kernel {e90.name!r} has sha256 "
        f"{hashlib.sha256(other).hexdigest()}, but the manifest records {e90.sha256}; it has ")


def test_cubin_for_another_arch_than_its_manifest_entry(art: Path) -> None:
    # A real sm_100a cubin where the manifest says sm_90a, with sha256 and size made to match:
    # only the ELF header can tell.
    e90, e100 = kernel(art), kernel(art, "sm_100a")
    write_cubin(art, e90, (art / e100.cubin).read_bytes(), match_manifest=True)
    assert read_error(art) == (
        f"cubin {art / e90.cubin} of kernel {e90.name!r} must target sm_90a (manifest), but "
        "its ELF header says sm_100a")


def test_cubin_for_another_arch_than_the_device_without_a_gpu(art: Path) -> None:
    store = ArtifactStore(art)
    e100 = kernel(art, "sm_100a")
    image = (art / e100.cubin).read_bytes()
    # The ELF header against the device alone (what a lying manifest cannot hide).
    with pytest.raises(ArtifactError) as info:
        check_cubin_for_device(image, (9, 0), H200, f"cubin {e100.cubin}")
    assert str(info.value) == (
        f"cubin {e100.cubin} targets sm_100a, which runs on compute capability 10.0, but the "
        f"device is {H200} (compute capability 9.0)")
    assert check_cubin_for_device(image, (10, 0), B200) == "sm_100a"
    # The manifest entry against the device, before any file is read.
    with pytest.raises(ArtifactError) as info:
        store.read_cubin_for_device(e100, (9, 0), H200)
    assert str(info.value) == (
        f"kernel {e100.name!r} is built for sm_100a, which needs compute capability 10.0, but it "
        f"was asked to run on {H200}")
    e90 = kernel(art)
    assert store.read_cubin_for_device(e90, (9, 0), H200)[:4] == b"\x7fELF"
    with pytest.raises(ArtifactError, match=r"is built for sm_90a, which needs compute "
                                            r"capability 9\.0, but it was asked to run on "
                                            r"cuda:0 \(NVIDIA B200"):
        check_device(e90, (10, 0), B200)
    # An entry relabelled for the device, its cubin still sm_100a: the ELF check refuses it.
    lying = e100.replace(arch="sm_90a")
    with pytest.raises(ArtifactError, match=r"must target sm_90a \(manifest\), but its ELF "
                                            r"header says sm_100a$"):
        store.read_cubin_for_device(lying, (9, 0), H200)
    with pytest.raises(ArtifactError) as info:
        check_cubin_for_device(image, (8, 9), "cuda:0 (NVIDIA L40S, compute capability 8.9)")
    assert "targets sm_100a, which runs on compute capability 10.0, but the device is" in str(
        info.value)


def test_not_a_cubin(art: Path) -> None:
    e = kernel(art)
    write_cubin(art, e, b"//\n// Generated by NVIDIA NVVM Compiler\n.version 8.8\n" * 3,
                match_manifest=True)
    assert read_error(art) == (f"cubin {art / e.cubin} of kernel {e.name!r} is not a CUDA cubin: "
                               "not an ELF file")


def test_elf_for_another_machine(art: Path) -> None:
    e = kernel(art)
    data = bytearray((art / e.cubin).read_bytes())
    data[18:20] = (62).to_bytes(2, "little")  # EM_X86_64
    write_cubin(art, e, bytes(data), match_manifest=True)
    assert read_error(art) == (f"cubin {art / e.cubin} of kernel {e.name!r} is not a CUDA cubin: "
                               "ELF machine must be 190 (NVIDIA CUDA), but got 62")


def test_truncated_cubin_with_a_matching_manifest_is_still_an_artifact_error(art: Path) -> None:
    # A build that wrote half a file AND recorded its hash: the ELF section table is cut off.
    e = kernel(art)
    data = (art / e.cubin).read_bytes()
    write_cubin(art, e, data[: len(data) // 2], match_manifest=True)
    msg = read_error(art)
    assert msg.startswith(f"cubin {art / e.cubin} of kernel {e.name!r}: ")
    assert msg.endswith("; the manifest does not describe this cubin, rebuild the artifacts")


def test_random_corruption_never_escapes_as_another_exception(art: Path) -> None:
    """Bytes flipped anywhere, the manifest's hash updated to match: every read either passes
    every check (a flip in code bytes) or raises ArtifactError; nothing else escapes."""
    e = kernel(art)
    good = (art / e.cubin).read_bytes()
    rng = random.Random(6)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(150):
        data = bytearray(good)
        for _ in range(rng.choice([1, 2, 8])):
            # Headers and the small sections at the front matter most: bias towards them.
            at = rng.randrange(min(len(data), 4096) if rng.random() < 0.7 else len(data))
            data[at] = rng.randrange(256)
        write_cubin(art, e, bytes(data), match_manifest=True)
        store = ArtifactStore(art)
        try:
            store.read_cubin(store.manifest.entry(e.name))
            outcomes["ok"] += 1
        except ArtifactError:
            outcomes["error"] += 1
    assert outcomes["error"] > 0 and sum(outcomes.values()) == 150


# --------------------------------------------------------------------------------------------
# The launch ABI against the cubin's own parameter list (.nv.info, no GPU needed)
# --------------------------------------------------------------------------------------------


def test_cubin_param_layout_is_the_manifest_abi(real_dir: Path) -> None:
    for e in load_manifest(real_dir).kernels:
        layout = cubin_param_layout((real_dir / e.cubin).read_bytes(), e.symbol)
        assert [size for _, size in layout] == [p.size for p in e.params]
        check_param_layout(e, layout)


def _frame_attribute_at(cubin: bytes, symbol: str) -> int:
    """Byte offset of the frame size value of `symbol`'s EIATTR_FRAME_SIZE record: format 4,
    attribute 0x11, length 8, then u32 symbol index and u32 bytes (found by the one record
    whose value reads back through cubin_frame_size when changed)."""
    import struct

    hits = []
    at = cubin.find(bytes([4, 0x11, 8, 0]))
    while at >= 0:
        hits.append(at + 8)
        at = cubin.find(bytes([4, 0x11, 8, 0]), at + 1)
    for value_at in hits:
        probe = bytearray(cubin)
        struct.pack_into("<I", probe, value_at, 0x1234)
        if cubin_frame_size(bytes(probe), symbol) == 0x1234:
            return value_at
    raise AssertionError(f"no EIATTR_FRAME_SIZE record of {symbol}")


def test_cubin_frame_size_is_read_per_symbol_and_guards_sm90_builds(real_dir: Path) -> None:
    import struct

    from kernels.introspect import IntrospectError, require_no_stack_frame

    e = kernel(real_dir, "sm_90a")
    cubin = (real_dir / e.cubin).read_bytes()
    assert cubin_frame_size(cubin, e.symbol) == 0  # the built sm_90a kernels never spill
    require_no_stack_frame(cubin, e.symbol, "hint")  # passes
    spilled = bytearray(cubin)
    struct.pack_into("<I", spilled, _frame_attribute_at(cubin, e.symbol), 40)
    assert cubin_frame_size(bytes(spilled), e.symbol) == 40
    with pytest.raises(IntrospectError) as info:
        require_no_stack_frame(bytes(spilled), e.symbol, "check setmaxnreg")
    assert str(info.value) == (f"ptxas gave {e.symbol} a 40-byte stack frame (local memory: "
                               "register spills or stack arrays); check setmaxnreg")
    with pytest.raises(ValueError, match="^its symbol table has no 'nope'$"):
        cubin_frame_size(cubin, "nope")
    assert cubin_frame_size(b"\x7fELF" + bytes(60), e.symbol) is None  # no section table


def _repacked(params: list[dict]) -> list[dict]:
    """Params with offsets re-derived from their sizes and alignments (a consistent manifest)."""
    offsets = pack_offsets([(p["size"], p["align"]) for p in params])
    return [{**p, "offset": o} for p, o in zip(params, offsets, strict=True)]


def test_abi_with_a_parameter_too_many(art: Path) -> None:
    e = kernel(art)
    params = recorded_params(art, e.name)
    extra = {"name": "extra", "kind": "scalar", "value": "num_groups", "offset": 0, "size": 4,
             "align": 4}
    edit(art, e.name, params=_repacked([*params, extra]))
    n = len(e.params)
    assert read_error(art) == (
        f"kernel {e.name!r}: the manifest records {n + 1} parameters but the cubin's {e.symbol} "
        f"has {n}; first missing: params[{n}] 'extra' (offset "
        f"{pack_offsets([(p.size, p.align) for p in e.params] + [(4, 4)])[-1]}, size 4). "
        "Rebuild the artifacts.")


def test_abi_with_a_parameter_missing(art: Path) -> None:
    e = kernel(art)
    params = recorded_params(art, e.name)
    edit(art, e.name, params=params[:-1])
    layout = cubin_param_layout((art / e.cubin).read_bytes(), e.symbol)
    off, size = layout[-1]
    assert read_error(art) == (
        f"kernel {e.name!r}: the cubin's {e.symbol} has {len(e.params)} parameters but the "
        f"manifest records {len(e.params) - 1}; extra (offset, size): ({off}, {size}). Rebuild "
        "the artifacts.")


def test_abi_with_a_wrong_size(art: Path) -> None:
    """A scalar recorded where the cubin has an 8-byte pointer (offsets kept consistent)."""
    e = kernel(art)
    params = recorded_params(art, e.name)
    i = next(j for j, p in enumerate(params) if p["size"] == 8)
    params[i] = {"name": params[i]["name"], "kind": "scalar", "value": "num_groups",
                 "offset": 0, "size": 4, "align": 4}
    params = _repacked(params)
    edit(art, e.name, params=params)
    layout = cubin_param_layout((art / e.cubin).read_bytes(), e.symbol)
    # The parameter base the check settles on: the residue that explains the longest prefix.
    sa = [(p["size"], p["align"]) for p in params]
    best = max(range(0, 128, 4), key=lambda r: (next(
        (j for j, (x, y) in enumerate(zip(device_offsets(sa, r), [o for o, _ in layout],
                                           strict=True))
         if x != y), len(layout)), -r))
    want = device_offsets(sa, best)
    bad = next(j for j in range(len(params))
               if (want[j], params[j]["size"]) != layout[j])
    assert bad == i
    assert read_error(art) == (
        f"kernel {e.name!r}: parameter {i} {params[i]['name']!r} must be at offset {want[i]} "
        f"with size 4 (manifest layout from a parameter base at {best} mod 128), but the cubin "
        f"has offset {layout[i][0]} and size {layout[i][1]}. The manifest's ABI does not match "
        "the cubin; rebuild.")


def test_abi_with_an_offset_the_sizes_do_not_explain(art: Path) -> None:
    e = kernel(art)
    params = recorded_params(art, e.name)
    last = params[-1]
    last["offset"] += last["align"]  # still a valid slot, no longer the packing of the sizes
    edit(art, e.name, params=params)
    assert read_error(art) == (
        f"kernel {e.name!r}: parameter {len(params) - 1} {last['name']!r} must be at offset "
        f"{last['offset'] - last['align']} (its size and alignment after the previous "
        f"parameters), but the manifest records offset {last['offset']}; the manifest is "
        "inconsistent, rebuild the artifacts")


def test_symbol_not_in_the_cubin(art: Path) -> None:
    e = kernel(art)
    edit(art, e.name, symbol=e.symbol + "_renamed")
    sym = e.symbol + "_renamed"
    assert read_error(art) == (
        f"cubin {art / e.cubin} of kernel {e.name!r}: it has no section .nv.info.{sym}, so no "
        f"kernel {sym!r}; the manifest does not describe this cubin, rebuild the artifacts")


def test_verify_reports_the_abi_mismatch(art: Path) -> None:
    e = kernel(art)
    params = recorded_params(art, e.name)
    edit(art, e.name, params=params[:-1])
    problems = verify_dir(art)
    assert len(problems) == 1
    # verify reports per kernel record (one cubin), not per set entry
    k = e.kernel.name
    assert problems[0].startswith(f"{k}: kernel {k!r}: the cubin's {e.symbol} has ")


def test_every_error_is_one_exception_family(tmp_path: Path) -> None:
    assert issubclass(ArtifactError, ManifestError) and issubclass(ManifestError, Nvfp4Error)
    assert runtime.ArtifactError is ArtifactError and runtime.ManifestError is ManifestError


# --------------------------------------------------------------------------------------------
# On a GPU: the same tampering, loaded for real
# --------------------------------------------------------------------------------------------

TAMPER = ["altered", "truncated", "missing", "other_arch", "abi_count", "abi_offset", "symbol"]


def _tamper(art: Path, how: str, arch: str) -> None:
    e = kernel(art, arch)
    other = kernel(art, "sm_100a" if arch == "sm_90a" else "sm_90a")
    data = (art / e.cubin).read_bytes()
    params = recorded_params(art, e.name)
    if how == "altered":
        (art / e.cubin).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif how == "truncated":
        (art / e.cubin).write_bytes(data[:100])
    elif how == "missing":
        (art / e.cubin).unlink()
    elif how == "other_arch":
        write_cubin(art, e, (art / other.cubin).read_bytes(), match_manifest=True)
    elif how == "abi_count":
        edit(art, e.name, params=params[:-1])
    elif how == "abi_offset":
        params[-1]["offset"] += params[-1]["align"]
        edit(art, e.name, params=params)
    elif how == "symbol":
        edit(art, e.name, symbol=e.symbol + "_x")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("how", TAMPER)
def test_tampered_artifacts_refused_by_preload_on_gpu(art: Path, how: str) -> None:
    gg = runtime.load(art)
    arch = gg.device_runtime(0).arch
    if arch not in ("sm_90a", "sm_100a"):
        pytest.skip(f"no kernel family targets this GPU ({arch})")
    _tamper(art, how, arch)
    with pytest.raises(ArtifactError):
        runtime.load(art).preload()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_intact_copy_preloads_and_other_arch_is_refused_on_gpu(art: Path) -> None:
    gg = runtime.load(art)
    rt = gg.device_runtime(0)
    if rt.arch not in ("sm_90a", "sm_100a"):
        pytest.skip(f"no kernel family targets this GPU ({rt.arch})")
    assert gg.preload() == [kernel(art, rt.arch).name]
    other = kernel(art, "sm_100a" if rt.arch == "sm_90a" else "sm_90a")
    with pytest.raises(ArtifactError) as info:
        gg.store.kernel(other, rt.device)
    assert str(info.value).startswith(f"kernel {other.name!r} is built for {other.arch}, "
                                      "which needs compute capability ")


def test_serialized_wgmma_is_recognized_in_sass() -> None:
    from kernels.introspect import wgmma_serialized

    group = ("HGMMA.64x128x16.F32 R24, R88, gdesc[UR16], R24 ;\n"
             "HGMMA.64x128x16.F32 R24, R92, gdesc[UR16], R24, gsb0 ;\n"
             "WARPGROUP.DEPBAR.LE gsb0, 0x1 ;\n")
    # What ptxas emits after "C7512 ... serialized due to insufficient register resources".
    serial = ("HGMMA.64x128x16.F32 R24, R88, gdesc[UR16], R24, gsb0 ;\n"
              "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n") * 2
    assert not wgmma_serialized(group)
    assert wgmma_serialized(serial)
    assert not wgmma_serialized(group + serial)  # one asynchronous group is enough
    assert not wgmma_serialized("IMAD R1, R2, R3, RZ ;")  # no wgmma at all


def test_built_sm90_kernels_keep_wgmma_asynchronous(real_dir: Path) -> None:
    from kernels.introspect import IntrospectError, nvdisasm_path, require_async_wgmma

    if nvdisasm_path() is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    e = kernel(real_dir, "sm_90a")
    require_async_wgmma((real_dir / e.cubin).read_bytes(), e.symbol, "hint")  # passes
    with pytest.raises(IntrospectError, match=f"^nvdisasm failed on {e.symbol}: "):
        require_async_wgmma(b"\x7fELF" + bytes(60), e.symbol, "hint")
