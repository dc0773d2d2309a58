"""The CLI's read side and packaging, end to end in subprocesses: `list`, `inspect`, `package`
and `--help` on every command (the build side is in test_build_pipeline.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, Fake
from test_package import KERNELS, fake_artifacts, unpack

from runtime.manifest import MANIFEST_NAME, load_manifest

COMMANDS = ["build", "list", "inspect", "verify", "merge", "package"]


def cli(*args: str, pythonpath: list[Path] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [*pythonpath, REPO]))}
    return subprocess.run([sys.executable, str(REPO / "build_kernels.py"), *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def art(fake: Fake, tmp_path: Path) -> Path:
    return fake_artifacts(fake, tmp_path / "artifacts")


def with_tma_param(art: Path) -> None:
    """Give every kernel a TMA template parameter in the manifest (the fake family has none);
    enough for list and inspect, which read the manifest only."""
    path = art / MANIFEST_NAME
    m = json.loads(path.read_text())
    for k in m["kernels"]:
        tma = {"name": "tma_a", "kind": "tma_template", "operand": "a", "offset": 0,
               "size": 128, "align": 64, "table": None, "value": None,
               "tma": {"dtype": "UINT8", "dims": [4096, 1024], "strides": [4096],
                       "box": [128, 128], "element_strides": [1, 1], "swizzle": "128B",
                       "interleave": "NONE", "l2_promotion": "256B", "oob_fill": "NONE"}}
        for p in k["params"]:
            p["offset"] += 128
        k["params"].insert(0, tma)
    path.write_text(json.dumps(m))


def test_help_of_every_command_has_examples() -> None:
    top = cli("--help")
    assert top.returncode == 0
    assert all(f"  {c} " in top.stdout for c in COMMANDS)
    assert "inspect moe_down.sm_90a.acc1.f16" in top.stdout and "package artifacts" in top.stdout
    for c in COMMANDS:
        proc = cli(c, "--help")
        assert proc.returncode == 0, (c, proc.stderr)
        assert "Examples:" in proc.stdout and f"build_kernels.py {c}" in proc.stdout, c


def test_list_table_shows_serving_symbol_and_resources(art: Path) -> None:
    proc = cli("list", str(art))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["kernel", "arch", "acc", "symbol", "block", "cluster", "smem",
                                "KiB", "cubin", "KiB", "sha256", "params", "served", "groups"]
    rows = {ln.split()[0]: ln for ln in lines[2:]}
    assert sorted(rows) == KERNELS
    e = load_manifest(art).entry("tiny.sm_90a.acc1.f16")
    assert rows["tiny.sm_90a.acc1.f16"].split() == [
        "tiny.sm_90a.acc1.f16", "sm_90a", "1", "fake_gemm_0", "128x1x1", "1x1x1", "128.0",
        f"{e.cubin_bytes / 1024:.1f}", e.sha256[:12], "2", "(12", "B)", "2:", "40x128x256,",
        "72x256x512"]
    assert rows["dense.sm_100a.acc1.f16"].endswith("1: m 192, n 3072, k 4096")


def test_list_json_keeps_its_fields(art: Path) -> None:
    proc = cli("list", str(art), "--json")
    rows = json.loads(proc.stdout)
    assert [r["kernel"] for r in rows] == KERNELS
    assert set(rows[0]) == {"kernel", "arch", "acc", "symbol", "cubin_kib", "smem", "groups"}


def test_inspect_prints_abi_tma_geometry_and_resources(art: Path) -> None:
    with_tma_param(art)
    e = load_manifest(art).entry("tiny.sm_90a.acc1.f16")
    proc = cli("inspect", "tiny.sm_90a.acc1.f16", "--artifacts", str(art))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    head = dict(ln.split(None, 1) for ln in out.split("\n\n")[0].splitlines())
    assert head == {
        "kernel": "tiny.sm_90a.acc1.f16",
        "serves": "2: 40x128x256, 72x256x512 (k multiple 256)",
        "groups": "40x128x256, 72x256x512",
        "set": "tiny, arch sm_90a, family fake90, acc stages 1",
        "options": "fail=0 tile_m=128",
        "symbol": "fake_gemm_0",
        "block": "128x1x1, cluster 1x1x1",
        "smem": "128.0 KiB dynamic (131072 B)",
        "grid": "ctas_per_sm 1, policy persistent; output tile 128x128x256; SM count read at "
                "run time",
        "cubin": f"{art}/{e.cubin}, {e.cubin_bytes / 1024:.1f} KiB ({e.cubin_bytes} B), "
                 f"sha256 {e.sha256[:12]}",
        "record": f"kernel {e.kernel.name} (one cubin for every set of its key)",
        "key": e.key,
    }
    assert e.kernel.name == f"fake90.sm_90a.acc1.f16.{e.key[:12]}"
    assert "launch ABI: 3 parameter(s), 140 bytes" in out
    abi = [ln.split() for ln in out.split("launch ABI")[1].split("\n\n")[0].splitlines()[3:]]
    assert [r[:6] for r in abi] == [["0", "tma_a", "tma_template", "0", "128", "64"],
                                    ["1", "problem_sizes", "table", "128", "8", "8"],
                                    ["2", "num_groups", "scalar", "136", "4", "4"]]
    assert " ".join(abi[1][6:]) == "pointer to the problem_sizes table"
    tma = out.split("TMA templates")[1].split("\n\n")[0].splitlines()
    assert tma[1].split() == ["param", "operand", "dtype", "box", "elem", "strides", "swizzle",
                              "interleave", "l2", "oob", "fill", "dims", "strides"]
    assert tma[3].split() == ["tma_a", "a", "UINT8", "128x128", "1x1", "128B", "NONE", "256B",
                              "NONE", "4096x1024", "4096"]
    tables = out.split("device tables:")[1].splitlines()
    assert tables[1].split() == ["table", "layout"]
    assert [ln.split(None, 1) for ln in tables[3:]] == [
        ["cta_prefix", '{"dtype": "int32"}'],
        ["pointers", '{"columns": ["a", "b", "sfa", "sfb", "c"], "dtype": "int64"}'],
        ["problem_sizes", '{"columns": ["m", "n", "k", "l"], "dtype": "int32"}'],
        ["tensormap_workspace", '{"align": 128, "bytes_per_cta": 512}']]


def test_inspect_json_sets_patterns_and_unknown_names(art: Path) -> None:
    proc = cli("inspect", "tiny.sm_90a.acc1.f16", "--artifacts", str(art), "--json")
    (entry,) = json.loads(proc.stdout)
    assert entry["name"] == "tiny.sm_90a.acc1.f16" and entry["artifacts"] == str(art)
    assert entry["served"] == "2: 40x128x256, 72x256x512" and entry["param_bytes"] == 12
    # The set record, then the record of the kernel that serves it (manifest schema 2).
    assert {k: entry[k] for k in ("set", "arch", "acc_stages", "out_dtype", "serves")} == {
        "set": "tiny", "arch": "sm_90a", "acc_stages": 1, "out_dtype": "float16",
        "serves": {"groups": [[40, 128, 256], [72, 256, 512]]}}
    kernel = entry["kernel"]
    assert kernel["key"] == load_manifest(art).entry("tiny.sm_90a.acc1.f16").key
    assert kernel["name"] == f"fake90.sm_90a.acc1.f16.{kernel['key'][:12]}"
    assert [p["name"] for p in kernel["params"]] == ["problem_sizes", "num_groups"]
    assert kernel["block"] == [128, 1, 1] and len(kernel["sha256"]) == 64
    assert kernel["limits"] == {"k_multiple": 256} and "constraints" not in kernel
    by_set = json.loads(cli("inspect", "tiny", "--artifacts", str(art), "--json").stdout)
    assert [e["name"] for e in by_set] == ["tiny.sm_100a.acc1.f16", "tiny.sm_90a.acc1.f16"]
    by_glob = json.loads(cli("inspect", "*.sm_90a.*", "--artifacts", str(art), "--json").stdout)
    assert [e["name"] for e in by_glob] == ["dense.sm_90a.acc1.f16", "tiny.sm_90a.acc1.f16"]
    text = cli("inspect", "tiny", "--artifacts", str(art)).stdout
    assert text.count("launch ABI:") == 2
    proc = cli("inspect", "nope", "--artifacts", str(art))
    assert proc.returncode == 2
    assert proc.stderr == (f"error: KERNEL must name a kernel, a set or a pattern matching "
                           f"kernels of {art}, but got 'nope'; kernels: {', '.join(KERNELS)}\n")
    proc = cli("inspect", "tiny", "--artifacts", str(art.parent / "missing"))
    assert proc.returncode == 1 and "no manifest at" in proc.stderr


def test_package_then_list_and_inspect_the_installed_package(art: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    proc = cli("package", str(art), "--out", str(dist), "--name", "moe", "--version", "1.0.0",
               "--arch", "sm_90a")
    assert proc.returncode == 0, proc.stderr
    wheel = dist / "nvfp4_artifacts_moe-1.0.0-py3-none-any.whl"
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"{wheel}: 2 kernel(s), ")
    assert lines[0].endswith("(distribution nvfp4-artifacts-moe 1.0.0, entry point "
                             "nvfp4_grouped_gemm.artifacts:moe)")
    assert lines[1:] == [f"  install: pip install --no-index --no-deps {wheel}",
                         '  load:    runtime.load("pkg:moe")']
    site = unpack(wheel, tmp_path / "site")
    listed = cli("list", "pkg:moe", "--json", pythonpath=[site])
    assert listed.returncode == 0, listed.stderr
    assert [r["kernel"] for r in json.loads(listed.stdout)] == ["dense.sm_90a.acc1.f16",
                                                                "tiny.sm_90a.acc1.f16"]
    shown = cli("inspect", "tiny.sm_90a.acc1.f16", "--artifacts", "pkg:moe", pythonpath=[site])
    assert shown.returncode == 0 and "nvfp4_artifacts_moe/artifacts/cubins/" in shown.stdout
    missing = cli("list", "pkg:other", pythonpath=[site])
    assert missing.returncode == 1
    assert "no installed artifact package is named 'other' (installed: moe" in missing.stderr


@pytest.mark.parametrize("args,code,message", [
    (["--name", "no way"], 2, "error: --name must be letters"),
    (["--version", "one"], 2, "error: --version must be a PEP 440 version"),
    (["--arch", "sm_80"], 2, "error: --arch must be one of ['sm_90a', 'sm_100a']"),
])
def test_package_argument_errors_exit_2(art: Path, tmp_path: Path, args, code, message) -> None:
    proc = cli("package", str(art), "--out", str(tmp_path / "dist"), *args)
    assert proc.returncode == code and proc.stderr.startswith(message), proc.stderr
    assert not (tmp_path / "dist").exists()


def test_package_refuses_a_corrupt_directory_exit_1(art: Path, tmp_path: Path) -> None:
    (art / "cubins" / "stray.bin").write_bytes(b"x")
    proc = cli("package", str(art), "--out", str(tmp_path / "dist"))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: {art} does not verify, so it is not packaged")
    assert "stray file cubins/stray.bin (not in the manifest)" in proc.stderr
