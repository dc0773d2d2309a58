"""The activation quantizers through the builder, with the synthetic fake family's quantizers
(`<pkg>.quant_families`, tests/fakefam.py): planned once per (arch, layout) whatever --only and
--shard select, compiled in the workers, recorded in the manifest's `quantizers`, reused by the
next build, recompiled when their cubin is damaged, merged across shards, checked by verify,
carried (or dropped with --arch) by package; and the manifest parser's refusals. The real
kernels' build is checked in tests/test_shipped_kernels.py."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from conftest import Fake, tree_hash

from builder.build import build, merge
from builder.errors import BuildError
from builder.families import load_families
from builder.package import build_wheel
from builder.plan import expand, expand_quantizers, shard
from builder.selection import Selection, spec_fingerprint
from builder.spec import parse_spec_text
from builder.verify import verify_dir
from runtime.errors import ManifestError
from runtime.manifest import (
    MANIFEST_NAME,
    QUANT_OPTIONAL_ROLES,
    QUANT_ROLES,
    load_manifest,
    parse_manifest,
)

SPEC = """\
schema_version: 1
defaults: {archs: [sm_90a, sm_100a], acc_stages: {sm_100a: [1]}, out_dtypes: [float16]}
sets:
  - {name: moe, groups: [[80, 4096, 7168]]}
  - {name: dense, groups: [[192, 3072, 4096]], archs: [sm_100a]}
"""


def _build(fake: Fake, out: Path, text: str = SPEC, only: tuple[str, ...] = (),
           part: tuple[int, int] | None = None, **kw):
    fams = load_families(f"{fake.pkg}.quant_families")
    spec = parse_spec_text(text, "shapes.yaml", fams)
    every = expand(spec, fams)
    items = [it for it in every if not only or it.set in only]
    if part is not None:
        items = shard(items, *part)
    return build(items, out, fams, jobs=2, quantizers=expand_quantizers(spec, fams),
                 selection=Selection(spec_fingerprint(every), part, only), **kw)


def _quant_compiles(fake: Fake) -> list[str]:
    return [line for line in fake.compiles() if line.startswith("quant ")]


def test_quantizers_are_built_recorded_and_verified(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    report = _build(fake, out)
    assert [(n, s is not None) for n, s in report.quantizers] == [
        ("act_quant_experts.sm_90a", True), ("act_quant_masked.sm_90a", True)]
    assert sorted(_quant_compiles(fake)) == ["quant sm_90a experts", "quant sm_90a masked"]
    m = load_manifest(out)
    assert [(q.layout, q.arch, q.max_experts) for q in m.quantizers] == [
        ("experts", "sm_90a", 1024), ("masked", "sm_90a", 1024)]
    for q in m.quantizers:
        assert q.name == f"act_quant_{q.layout}.sm_90a.{q.key[:12]}"
        assert q.cubin == f"cubins/{q.name}.cubin" and (out / q.cubin).is_file()
        assert {p.operand or p.value for p in q.params} == QUANT_ROLES[q.layout] | (
            QUANT_OPTIONAL_ROLES[q.layout])
        assert q.fills_sfa and q.takes_mask is (q.layout == "masked")
    assert verify_dir(out) == []
    # The manifest round-trips through the runtime's parser unchanged.
    text = (out / MANIFEST_NAME).read_text()
    assert parse_manifest(json.loads(text)).to_json() == text


def test_a_second_build_reuses_them_and_a_damaged_one_is_recompiled(fake: Fake,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    _build(fake, out)
    before = tree_hash(out)
    report = _build(fake, out)
    assert not report.changed and tree_hash(out) == before
    assert report.quantizers == [("act_quant_experts.sm_90a", None),
                                 ("act_quant_masked.sm_90a", None)]
    assert len(_quant_compiles(fake)) == 2
    masked = load_manifest(out).quantizer("masked", "sm_90a")
    (out / masked.cubin).write_bytes(b"damaged")
    report = _build(fake, out)
    assert report.changed and dict(report.quantizers)["act_quant_experts.sm_90a"] is None
    assert dict(report.quantizers)["act_quant_masked.sm_90a"] is not None
    assert sorted(_quant_compiles(fake)) == ["quant sm_90a experts", "quant sm_90a masked",
                                             "quant sm_90a masked"]
    assert tree_hash(out) == before and verify_dir(out) == []


def test_a_damaged_quantizer_record_costs_only_its_own_recompile(fake: Fake,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    _build(fake, out)
    before = tree_hash(out)
    path = out / MANIFEST_NAME
    obj = json.loads(path.read_text())
    obj["quantizers"][1]["layout"] = "rows"
    path.write_text(json.dumps(obj))
    report = _build(fake, out)
    assert any(n.startswith("the existing quantizer act_quant_masked.sm_90a.") and
               "layout must be one of ['experts', 'masked'], but got 'rows'" in n and
               n.endswith("recompiling it") for n in report.notes), report.notes
    assert sorted(_quant_compiles(fake)) == ["quant sm_90a experts", "quant sm_90a masked",
                                             "quant sm_90a masked"]
    assert len([r for r in report.rows if r.status == "reused"]) == len(report.rows)
    assert tree_hash(out) == before and verify_dir(out) == []


def test_selective_builds_keep_them_and_shards_merge_to_the_full_build(fake: Fake,
                                                                      tmp_path: Path) -> None:
    full = tmp_path / "full"
    _build(fake, full)
    # --only a set with no sm_90a entry still builds the spec's quantizers, so merging it with
    # the rest or building it again never drops them.
    report = _build(fake, tmp_path / "only", only=("dense",))
    assert len(report.quantizers) == 2
    assert len(load_manifest(tmp_path / "only").quantizers) == 2
    dirs = [tmp_path / f"shard{i}" for i in range(2)]
    for i, d in enumerate(dirs):
        _build(fake, d, part=(i, 2))
        assert len(load_manifest(d).quantizers) == 2
    merge(tmp_path / "merged", dirs)
    assert (tmp_path / "merged" / MANIFEST_NAME).read_text() == \
        (full / MANIFEST_NAME).read_text()
    assert tree_hash(tmp_path / "merged") == tree_hash(full)


def test_merge_refuses_shards_whose_quantizers_differ(fake: Fake, tmp_path: Path) -> None:
    dirs = [tmp_path / f"shard{i}" for i in range(2)]
    for i, d in enumerate(dirs):
        _build(fake, d, part=(i, 2))
    path = dirs[1] / MANIFEST_NAME
    obj = json.loads(path.read_text())
    obj["quantizers"][0]["max_experts"] = 512  # still valid, but not shard 0's record
    path.write_text(json.dumps(obj))
    name = obj["quantizers"][0]["name"]
    with pytest.raises(BuildError, match=f"{name} is in {dirs[0]} and in {dirs[1]} with "
                                         "different records; were the shards built with "
                                         "different DSL or sources"):
        merge(tmp_path / "merged", dirs)
    assert not (tmp_path / "merged").exists()


def test_verify_names_a_damaged_or_missing_quantizer_cubin(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    _build(fake, out)
    experts, masked = load_manifest(out).quantizers
    (out / experts.cubin).write_bytes(b"\x7fELF" + bytes(100))
    (out / masked.cubin).unlink()
    problems = verify_dir(out)
    assert f"{masked.name}: cubin {masked.cubin} is missing" in problems
    assert any(p.startswith(f"{experts.name}: cubin {experts.cubin} has 104 bytes, manifest "
                            f"says {experts.cubin_bytes}") for p in problems)
    assert any(p.startswith(f"{experts.name}: cubin {experts.cubin} has sha256")
               for p in problems)


def test_package_carries_them_unless_their_arch_is_left_out(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    _build(fake, out)
    names = {q.cubin for q in load_manifest(out).quantizers}

    def payload(wheel: Path) -> tuple[set[str], list]:
        with zipfile.ZipFile(wheel) as z:
            files = {n.split("/artifacts/", 1)[1] for n in z.namelist() if "/artifacts/" in n}
            manifest = json.loads(z.read(next(n for n in z.namelist()
                                              if n.endswith("/artifacts/manifest.json"))))
        return files, manifest.get("quantizers", [])

    files, quantizers = payload(build_wheel(out, tmp_path / "dist", name="both").wheel)
    assert names <= files and len(quantizers) == 2
    files, quantizers = payload(build_wheel(out, tmp_path / "dist", name="b200",
                                            archs=["sm_100a"]).wheel)
    assert not names & files and quantizers == []


def test_installed_package_verify_checks_the_quantizer_cubins(fake: Fake, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from conftest import REPO

    out = tmp_path / "artifacts"
    _build(fake, out)
    site = tmp_path / "site"
    with zipfile.ZipFile(build_wheel(out, tmp_path / "dist", name="quant").wheel) as z:
        z.extractall(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}

    def verify() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "runtime.packages", "--verify"], env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    assert verify().returncode == 0
    q = load_manifest(out).quantizer("masked", "sm_90a")
    cubin = site / "nvfp4_artifacts_quant" / "artifacts" / q.cubin
    cubin.write_bytes(b"\0" + cubin.read_bytes()[1:])
    proc = verify()
    assert proc.returncode == 1 and "UNUSABLE" in proc.stdout, proc.stdout
    assert f"of kernel {q.name!r} has sha256" in proc.stdout


# --------------------------------------------------------------------------------------------
# The manifest's quantizer records
# --------------------------------------------------------------------------------------------


@pytest.fixture
def manifest_obj(fake: Fake, tmp_path: Path) -> dict:
    out = tmp_path / "artifacts"
    _build(fake, out)
    return json.loads((out / MANIFEST_NAME).read_text())


def _refused(obj: dict) -> str:
    with pytest.raises(ManifestError) as info:
        parse_manifest(obj, "m")
    return str(info.value)


def test_a_manifest_without_quantizers_reads_as_none(manifest_obj: dict) -> None:
    del manifest_obj["quantizers"]
    m = parse_manifest(manifest_obj)
    assert m.quantizers == () and m.quantizer("experts", "sm_90a") is None
    assert "quantizers" not in json.loads(m.to_json())


@pytest.mark.parametrize("field,value,message", [
    ("layout", "rows", "m.quantizers[0].layout must be one of ['experts', 'masked'], but got "
                       "'rows'"),
    ("max_experts", 0, "m.quantizers[0].max_experts must be in 1..1024 for the experts layout, "
                       "but got 0"),
    ("max_experts", 1025, "m.quantizers[0].max_experts must be in 1..1024 for the experts "
                          "layout, but got 1025"),
    ("block", [2048, 1, 1], "m.quantizers[0].block must be [threads, 1, 1] with 1 <= threads "
                            "<= 1024, but got [2048, 1, 1]"),
    ("dynamic_smem", -1, "m.quantizers[0].dynamic_smem must be in 0..232448, but got -1"),
    ("name", "act_quant_experts.sm_90a", "m.quantizers[0].name must be 'act_quant_experts."
                                         "sm_90a."),
    ("cubin", "../x.cubin", "m.quantizers[0].cubin must be a relative path inside the "
                            "artifact directory"),
    ("grid", {}, "m.quantizers[0] has unknown key(s) ['grid']"),
])
def test_bad_quantizer_fields_are_refused_by_name(manifest_obj: dict, field: str, value,
                                                  message: str) -> None:
    manifest_obj["quantizers"][0][field] = value
    assert message in _refused(manifest_obj)


def test_quantizer_parameters_take_their_own_names_only(manifest_obj: dict) -> None:
    q = manifest_obj["quantizers"][1]
    q["params"][0]["operand"] = "offs_table"
    assert ("m.quantizers[1].params[0].operand must be one of ['x', 'offs', 'scales', 'a', "
            "'sfa', 'masked_m'], but got 'offs_table'") in _refused(manifest_obj)
    q["params"][0].update(operand=None, kind="table", table="pointers")
    assert ("m.quantizers[1].params[0].kind must be one of ['operand', 'scalar'], but got "
            "'table'") in _refused(manifest_obj)


@pytest.mark.parametrize("edit,took", [
    (lambda ps: ps[1].update(operand="x", name="x"),  # offs renamed: x's pointer in two slots
     "['x', 'x', 'scales', 'a', 'sfa', 'rows', 'k', 'experts', 'blocks', 'sfa_chunks']"),
    (lambda ps: ps[5].update(value="max_m"),  # the masked layout's scalar
     "['x', 'offs', 'scales', 'a', 'sfa', 'max_m', 'k', 'experts', 'blocks', 'sfa_chunks']"),
    (lambda ps: ps[8].update(value="sfa_chunks"),  # the optional role twice
     "['x', 'offs', 'scales', 'a', 'sfa', 'rows', 'k', 'experts', 'sfa_chunks', 'sfa_chunks']"),
    (lambda ps: ps.clear(), "[]"),
])
def test_a_quantizer_must_take_its_layouts_launch_values_once_each(manifest_obj: dict, edit,
                                                                   took: str) -> None:
    edit(manifest_obj["quantizers"][0]["params"])
    assert ("m.quantizers[0].params must take each of ['a', 'blocks', 'experts', 'k', 'offs', "
            "'rows', 'scales', 'sfa', 'x'] once, and may take ['sfa_chunks'] once (the experts "
            "layout's launch values), but take " + took) in _refused(manifest_obj)


def test_the_first_masked_m_records_still_load_and_take_any_expert_count(
        manifest_obj: dict) -> None:
    """A masked record with masked_m and max_experts 0 (main between 0a8f14e and 3cf9f5c, 2026-12-07:
    the walk without a table) parses, and serves a masked_m call of any E (review of the
    valid-block walk: refusing it refused the whole artifact directory)."""
    from runtime.quantize import fits

    manifest_obj["quantizers"][1]["max_experts"] = 0
    q = parse_manifest(manifest_obj, "m").quantizers[1]
    assert (q.takes_mask, q.max_experts) == (True, 0)
    assert fits(q, (4096, 4, 64), 4096, masked=True)
    manifest_obj["quantizers"][1]["max_experts"] = 1024  # the valid-block walk's table
    q = parse_manifest(manifest_obj, "m").quantizers[1]
    assert not fits(q, (1025, 4, 64), 1025, masked=True) and fits(q, (1025, 4, 64), 1025)


@pytest.mark.parametrize("drop,took", [
    ("masked_m", "['x', 'scales', 'a', 'sfa', 'max_m', 'k', 'experts', 'blocks', 'sfa_chunks', "
                 "'quant_ctas']"),
    ("quant_ctas", "['x', 'scales', 'masked_m', 'a', 'sfa', 'max_m', 'k', 'experts', 'blocks', "
                   "'sfa_chunks']"),
])
def test_a_masked_quantizer_takes_masked_m_and_quant_ctas_together(manifest_obj: dict, drop,
                                                                  took) -> None:
    """One without the other would launch the grid-stride kernel with a wrong stride, or take
    masked_m's place with another value."""
    q = manifest_obj["quantizers"][1]
    q["params"] = [p for p in q["params"] if drop not in (p.get("operand"), p.get("value"))]
    assert ("m.quantizers[1].params must take each of ['a', 'blocks', 'experts', 'k', 'max_m', "
            "'scales', 'sfa', 'x'] once, and may take ['masked_m', 'quant_ctas', 'sfa_chunks'] "
            "once, ['masked_m', 'quant_ctas'] all or none (the masked layout's launch values), "
            "but take " + took) in _refused(manifest_obj)


def test_a_quantizer_built_before_the_padding_fill_still_loads(manifest_obj: dict) -> None:
    """Records without sfa_chunks (built before 2026-12-07), and a masked one without masked_m
    and quant_ctas, parse: the runtime zeroes sfa for them (Quantizer.fills_sfa) and sends a
    call with masked_m to the torch path (Quantizer.takes_mask) instead of refusing the
    artifacts."""
    optional = {"sfa_chunks", "masked_m", "quant_ctas"}
    for q in manifest_obj["quantizers"]:
        q["params"] = [p for p in q["params"] if p.get("operand") not in optional
                       and p.get("value") not in optional]
    manifest_obj["quantizers"][1]["max_experts"] = 0  # no masked_m table then
    got = [(q.fills_sfa, q.takes_mask) for q in parse_manifest(manifest_obj, "m").quantizers]
    assert got == [(False, False), (False, False)]


def test_two_quantizers_for_one_layout_and_arch_are_refused(manifest_obj: dict) -> None:
    twin = dict(manifest_obj["quantizers"][0], key="f" * 64)
    twin.update(name=f"act_quant_experts.sm_90a.{'f' * 12}")
    manifest_obj["quantizers"].append(twin)
    assert ("m: quantizer (layout, arch) pairs must be unique, but ['experts sm_90a'] repeat"
            in _refused(manifest_obj))
