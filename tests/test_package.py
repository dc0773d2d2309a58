"""`build_kernels.py package`: artifact directory -> wheel -> installed package the runtime finds.

Artifacts come from the fake family build (real worker subprocesses, synthetic cubins), so the
wheel holds a directory that passes `verify`. The last test installs the project wheel and the
artifact wheel with pip into a fresh venv that has no system site packages (so no
nvidia-cutlass-dsl) and loads the kernels there with no path configuration.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata as md
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, Fake

from builder.build import build
from builder.families import load_families
from builder.package import PackageError, PackageUsageError, build_wheel
from builder.plan import expand
from builder.spec import parse_spec_text
from runtime.errors import ManifestError
from runtime.manifest import SCHEMA_VERSION, load_manifest
from runtime.packages import ENTRY_POINT_GROUP, find_artifact_dirs, installed, resolve

SPEC = """\
schema_version: 1
defaults:
  archs: [sm_90a, sm_100a]
  acc_stages: {sm_100a: [1], sm_90a: [1]}
  out_dtypes: [float16]
sets:
  - name: tiny
    groups: [[40, 128, 256], [72, 256, 512]]
  - name: dense
    groups: [[192, 3072, 4096]]
"""
KERNELS = ["dense.sm_100a.acc1.f16", "dense.sm_90a.acc1.f16", "tiny.sm_100a.acc1.f16", "tiny.sm_90a.acc1.f16"]


def fake_artifacts(fake: Fake, out: Path, text: str = SPEC) -> Path:
    """Build `text` with the fake family into `out` (a directory that verifies)."""
    fams = load_families(fake.module)
    build(expand(parse_spec_text(text, "shapes.yaml", fams), fams), out, fams, jobs=2)
    return out


def unpack(wheel: Path, site: Path) -> Path:
    """What pip does with a purelib wheel: unzip into site-packages."""
    site.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


@pytest.fixture
def art(fake: Fake, tmp_path: Path) -> Path:
    return fake_artifacts(fake, tmp_path / "artifacts")


# --------------------------------------------------------------------------------------------
# The wheel
# --------------------------------------------------------------------------------------------


def test_wheel_layout_metadata_and_record(art: Path, tmp_path: Path) -> None:
    r = build_wheel(art, tmp_path / "dist", name="Tiny-MoE", version="1.2.3")
    assert r.wheel.name == "nvfp4_artifacts_tiny_moe-1.2.3-py3-none-any.whl"
    assert (r.name, r.distribution, r.module) == ("tiny_moe", "nvfp4-artifacts-tiny-moe",
                                                  "nvfp4_artifacts_tiny_moe")
    assert list(r.kernels) == KERNELS
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == [r.wheel.name]  # no temp
    with zipfile.ZipFile(r.wheel) as zf:
        names = zf.namelist()
        files = {n: zf.read(n) for n in names}
    info = "nvfp4_artifacts_tiny_moe-1.2.3.dist-info"
    mod = "nvfp4_artifacts_tiny_moe"
    manifest = load_manifest(art)
    assert len(manifest.kernels) == 2  # one sm_90a and one sm_100a kernel serve both sets
    expected = {f"{mod}/__init__.py", f"{mod}/package.json", f"{mod}/artifacts/manifest.json",
                *(f"{mod}/artifacts/{e.cubin}" for e in manifest.kernels),
                *(f"{info}/{f}" for f in ("METADATA", "WHEEL", "entry_points.txt",
                                          "top_level.txt", "RECORD"))}
    assert set(names) == expected
    assert names[-1] == f"{info}/RECORD"
    # artifacts are copied byte for byte
    assert files[f"{mod}/artifacts/manifest.json"] == (art / "manifest.json").read_bytes()
    for e in manifest.kernels:
        assert files[f"{mod}/artifacts/{e.cubin}"] == (art / e.cubin).read_bytes()
    # RECORD: every other file with its urlsafe-base64 sha256 and size (PEP 376 / PEP 427)
    rows = list(csv.reader(io.StringIO(files[f"{info}/RECORD"].decode())))
    assert [r[0] for r in rows] == sorted(n for n in names if not n.endswith("RECORD")) + [
        f"{info}/RECORD"]
    for path, digest, size in rows[:-1]:
        want = base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b"=")
        assert digest == "sha256=" + want.decode() and int(size) == len(files[path]), path
    assert rows[-1][1:] == ["", ""]
    wheel_meta = files[f"{info}/WHEEL"].decode()
    assert "Root-Is-Purelib: true" in wheel_meta and "Tag: py3-none-any" in wheel_meta
    meta = files[f"{info}/METADATA"].decode()
    assert meta.startswith("Metadata-Version: 2.1\nName: nvfp4-artifacts-tiny-moe\n"
                           "Version: 1.2.3\n")
    assert all(f"`{k}`" in meta for k in KERNELS)
    assert files[f"{info}/entry_points.txt"].decode() == (
        f"[{ENTRY_POINT_GROUP}]\ntiny_moe = nvfp4_artifacts_tiny_moe\n")
    pkg = json.loads(files[f"{mod}/package.json"])
    assert pkg == {
        "format": 1, "name": "tiny_moe", "distribution": "nvfp4-artifacts-tiny-moe",
        "version": "1.2.3", "schema_version": SCHEMA_VERSION,
        "builder_version": manifest.builder_version, "dsl_version": manifest.dsl_version,
        "runtime_version": pkg["runtime_version"],
        "manifest_sha256": hashlib.sha256((art / "manifest.json").read_bytes()).hexdigest(),
        "archs": ["sm_100a", "sm_90a"], "sets": ["dense", "tiny"], "kernels": KERNELS}
    # the generated module is importable and self-describing, with no imports of ours
    init = files[f"{mod}/__init__.py"].decode()
    assert f"SCHEMA_VERSION = {SCHEMA_VERSION}" in init and "import runtime\n" not in init.split(
        '"""')[-1]


def test_wheel_is_reproducible(art: Path, tmp_path: Path, monkeypatch) -> None:
    one = build_wheel(art, tmp_path / "a", name="x", version="1.0").wheel.read_bytes()
    two = build_wheel(art, tmp_path / "b", name="x", version="1.0").wheel.read_bytes()
    assert one == two
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    three = build_wheel(art, tmp_path / "c", name="x", version="1.0").wheel
    with zipfile.ZipFile(three) as zf:
        assert zf.infolist()[0].date_time[:3] == (2023, 11, 14)


def test_default_version_is_the_runtime_version(art: Path, tmp_path: Path) -> None:
    text = (REPO / "pyproject.toml").read_text()
    version = re.search(r'(?m)^version = "([^"]+)"', text).group(1)
    r = build_wheel(art, tmp_path / "dist")
    assert (r.name, r.version) == ("default", version)
    assert r.wheel.name == f"nvfp4_artifacts_default-{version}-py3-none-any.whl"


def test_arch_filter_packages_a_consistent_subset(art: Path, tmp_path: Path) -> None:
    r = build_wheel(art, tmp_path / "dist", name="hopper", archs=["sm_90a"])
    assert list(r.kernels) == ["dense.sm_90a.acc1.f16", "tiny.sm_90a.acc1.f16"]
    site = unpack(r.wheel, tmp_path / "site")
    d = site / "nvfp4_artifacts_hopper" / "artifacts"
    m = load_manifest(d)
    assert [e.name for e in m.sets] == list(r.kernels)
    # tiny and dense share one sm_90a kernel (one config): the wheel holds its cubin once,
    # and no sm_100a kernel record.
    (kernel,) = m.kernels
    assert kernel.arch == "sm_90a" and [e.kernel for e in m.sets] == [kernel, kernel]
    assert kernel == load_manifest(art).entry("tiny.sm_90a.acc1.f16").kernel
    assert sorted(p.name for p in (d / "cubins").iterdir()) == [Path(kernel.cubin).name]
    with pytest.raises(PackageUsageError, match=r"--arch must be one of"):
        build_wheel(art, tmp_path / "dist", archs=["sm_80"])


def test_refuses_a_directory_that_does_not_verify(art: Path, tmp_path: Path) -> None:
    cubin = next((art / "cubins").iterdir())
    cubin.write_bytes(cubin.read_bytes() + b"tampered")
    with pytest.raises(PackageError) as info:
        build_wheel(art, tmp_path / "dist")
    assert f"{art} does not verify, so it is not packaged" in str(info.value)
    assert "sha256" in str(info.value)
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize("kw,message", [
    ({"name": "a b"}, "--name must be letters"),
    ({"name": "-x"}, "--name must be letters"),
    ({"version": "v1"}, "--version must be a PEP 440 version"),
    ({"version": "1.0-beta"}, "--version must be a PEP 440 version"),
    # `$` matched before a trailing newline: the wheel was named '...-1.0.0\n-py3-none-any.whl'.
    ({"version": "1.0.0\n"}, "--version must be a PEP 440 version such as 1.0.0, 2.1rc1 or "
                             "0.1.0+cu13, but got '1.0.0\\n'"),
])
def test_rejects_bad_names_and_versions(art: Path, tmp_path: Path, kw, message) -> None:
    with pytest.raises(PackageUsageError, match=re.escape(message)):
        build_wheel(art, tmp_path / "dist", **kw)
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize("value", ["abc", "99999999999", "4354819200", "-1", "", " 1700000000",
                                   "1_700_000_000", "9" * 5000],
                         ids=["letters", "year_5138", "past_2107", "negative", "empty", "space",
                              "underscores", "5000_digits"])
def test_rejects_a_source_date_epoch_a_zip_cannot_carry(art: Path, tmp_path: Path, monkeypatch,
                                                         value: str) -> None:
    """'abc' raised ValueError and past 2107 zipfile raised struct.error, both as tracebacks."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    with pytest.raises(PackageUsageError) as info:
        build_wheel(art, tmp_path / "dist", name="x", version="1.0")
    assert str(info.value) == (
        "SOURCE_DATE_EPOCH must be a whole number of seconds since 1970 from 0 to 4354819199 "
        f"(2107-12-31 23:59:59 UTC, the last time a zip entry can carry), but got {value!r}")
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize("value,stamp", [("0", (1980, 1, 1, 0, 0, 0)),
                                         ("4354819199", (2107, 12, 31, 23, 59, 58))])
def test_source_date_epoch_at_the_ends_of_the_zip_range(art: Path, tmp_path: Path, monkeypatch,
                                                        value: str, stamp: tuple) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    wheel = build_wheel(art, tmp_path / "dist", name="x", version="1.0").wheel
    with zipfile.ZipFile(wheel) as zf:
        assert {i.date_time for i in zf.infolist()} == {stamp}  # zip keeps even seconds


def test_cli_reports_a_bad_source_date_epoch_as_a_usage_error(art: Path, tmp_path: Path) -> None:
    env = {**os.environ, "SOURCE_DATE_EPOCH": "abc"}
    r = subprocess.run([sys.executable, str(REPO / "build_kernels.py"), "package", str(art),
                        "--out", str(tmp_path / "dist")], env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    assert (r.returncode, r.stderr) == (2, (
        "error: SOURCE_DATE_EPOCH must be a whole number of seconds since 1970 from 0 to "
        "4354819199 (2107-12-31 23:59:59 UTC, the last time a zip entry can carry), but got "
        "'abc'\n"))


# --------------------------------------------------------------------------------------------
# Discovery and the version lock (runtime/packages.py)
# --------------------------------------------------------------------------------------------


def test_discovery_resolve_and_errors(art: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    path = [str(site)]
    with pytest.raises(ManifestError, match="no usable artifact package is installed"):
        resolve(None, path=path)
    unpack(build_wheel(art, tmp_path / "dist", name="moe", version="2.0").wheel, site)
    (pkg,) = installed(path)
    assert (pkg.name, pkg.distribution, pkg.version, pkg.module, pkg.usable) == (
        "moe", "nvfp4-artifacts-moe", "2.0", "nvfp4_artifacts_moe", True)
    d = site / "nvfp4_artifacts_moe" / "artifacts"
    assert pkg.artifact_dir == d
    assert find_artifact_dirs(path) == {"moe": d}
    assert resolve(None, path=path) == d
    assert resolve("pkg:moe", path=path) == d
    assert resolve("some/dir", path=path) == Path("some/dir")  # a path is not looked up
    assert resolve(tmp_path, path=path) == tmp_path
    with pytest.raises(ManifestError, match=r"no installed artifact package is named 'nope' "
                                            r"\(installed: moe \(nvfp4-artifacts-moe 2.0\)\)"):
        resolve("pkg:nope", path=path)
    # a second package makes the default ambiguous
    unpack(build_wheel(art, tmp_path / "dist", name="dense", archs=["sm_90a"]).wheel, site)
    assert sorted(find_artifact_dirs(path)) == ["dense", "moe"]
    with pytest.raises(ManifestError, match=r"2 artifact packages are installed: dense .*, moe "
                                            r".*; choose one, e.g. runtime.load\('pkg:dense'\)"):
        resolve(None, path=path)
    assert load_manifest(resolve("pkg:dense", path=path)).kernels[0].arch == "sm_90a"


@pytest.mark.parametrize("other", [SCHEMA_VERSION + 1, 1], ids=["newer", "schema1"])
def test_schema_lock_refuses_a_package_for_another_schema(art: Path, tmp_path: Path,
                                                          other: int) -> None:
    site = unpack(build_wheel(art, tmp_path / "dist", name="old").wheel, tmp_path / "site")
    unpack(build_wheel(art, tmp_path / "dist", name="new").wheel, site)
    info = site / "nvfp4_artifacts_old" / "package.json"
    data = json.loads(info.read_text())
    info.write_text(json.dumps({**data, "schema_version": other}))
    path = [str(site)]
    old = next(p for p in installed(path) if p.name == "old")
    assert not old.usable
    with pytest.raises(ManifestError) as exc:
        resolve("pkg:old", path=path)
    assert str(exc.value) == (
        f"artifact package old (nvfp4-artifacts-old {data['version']}) cannot be used: it was "
        f"built for manifest schema {other}, but this runtime reads schema "
        f"{SCHEMA_VERSION}; install an artifact package built by this version of "
        "nvfp4-grouped-gemm (rebuild and repackage: `python build_kernels.py build` then "
        "`python build_kernels.py package artifacts --name old`)")
    # the default skips the unusable package and takes the only usable one
    assert resolve(None, path=path) == site / "nvfp4_artifacts_new" / "artifacts"
    assert find_artifact_dirs(path) == {"new": site / "nvfp4_artifacts_new" / "artifacts"}
    # a package whose package.json is gone is reported, not a crash
    (site / "nvfp4_artifacts_new" / "package.json").unlink()
    new = next(p for p in installed(path) if p.name == "new")
    assert new.problem and "cannot read" in new.problem


def test_python_m_runtime_packages_lists_and_verifies(art: Path, tmp_path: Path) -> None:
    site = unpack(build_wheel(art, tmp_path / "dist", name="moe").wheel, tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "runtime.packages", "--verify"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "pkg:moe  nvfp4-artifacts-moe" in proc.stdout and "4 kernel(s) (verified)" in proc.stdout
    assert all(k in proc.stdout for k in KERNELS)
    cubin = next((site / "nvfp4_artifacts_moe" / "artifacts" / "cubins").iterdir())
    cubin.write_bytes(b"\0" + cubin.read_bytes()[1:])
    proc = subprocess.run([sys.executable, "-m", "runtime.packages", "--verify"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1 and "UNUSABLE" in proc.stdout and "sha256" in proc.stdout


# --------------------------------------------------------------------------------------------
# A clean venv: pip install both wheels, load with no path configuration
# --------------------------------------------------------------------------------------------


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def torch_farm(dest: Path) -> Path:
    """A directory of symlinks to torch and its declared requirements (recursively), and nothing
    else: the venv gets torch through a .pth on this directory without seeing the rest of this
    interpreter's site-packages (where nvidia-cutlass-dsl is). Installing torch itself would
    need the network or a multi-hundred-MB wheel."""
    dest.mkdir()
    todo, seen = ["torch"], set()
    while todo:
        name = todo.pop()
        if _norm(name) in seen:
            continue
        seen.add(_norm(name))
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional or platform-only requirement that is not installed
        for req in dist.requires or []:
            if "extra ==" not in req:
                todo.append(re.match(r"[A-Za-z0-9_.-]+", req).group(0))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (dest / top).exists():
                (dest / top).symlink_to(src)
    assert not any(p.name.startswith(("cutlass", "nvidia_cutlass")) for p in dest.iterdir())
    return dest


def test_clean_venv_installs_both_wheels_and_loads_with_no_path(art: Path,
                                                                tmp_path: Path) -> None:
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("building the project wheel offline needs setuptools installed")
    if importlib.util.find_spec("ensurepip") is None:
        pytest.skip("python -m venv needs ensurepip")
    dist = tmp_path / "dist"
    # 1. the artifact wheel, through the CLI
    proc = subprocess.run([sys.executable, str(REPO / "build_kernels.py"), "package", str(art),
                           "--out", str(dist), "--name", "demo", "--version", "0.3.0"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    # 2. the project wheel, from a copy of the sources (setuptools writes build/ next to them)
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("runtime", "builder", "kernels"):
        shutil.copytree(REPO / d, src / d, ignore=ignore)
    for f in ("pyproject.toml", "README.md", "build_kernels.py"):
        shutil.copy(REPO / f, src / f)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "-w", str(dist), str(src)],
                   check=True, timeout=300, capture_output=True)
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    assert wheels == ["nvfp4_artifacts_demo-0.3.0-py3-none-any.whl",
                      "nvfp4_grouped_gemm-0.1.0-py3-none-any.whl"]
    # 3. a venv with no system site packages; pip installs both wheels offline, no deps
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    *(str(dist / w) for w in wheels)], check=True, timeout=300)
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(py), "-c", code], capture_output=True, text=True,
                               check=True).stdout.strip())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    work = tmp_path / "elsewhere"  # not the checkout: runtime must come from the venv
    work.mkdir()

    def run(code: str) -> str:
        proc = subprocess.run([str(py), "-c", code], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    # 4. no torch, no DSL: discovery and the manifest alone
    out = run("import importlib.util, sys, runtime, runtime.packages as p\n"
              "assert importlib.util.find_spec('cutlass') is None\n"
              "assert importlib.util.find_spec('torch') is None\n"
              "assert runtime.__file__.startswith(sys.prefix), runtime.__file__\n"
              "from runtime.loader import ArtifactStore\n"
              "s = ArtifactStore(p.resolve())\n"
              "[s.read_cubin(e) for e in s.kernels]\n"
              "print(sorted(p.find_artifact_dirs()), [e.name for e in s.kernels])\n")
    assert out.strip() == f"['demo'] {KERNELS}"
    # 5. with torch visible (and still no DSL): the public load with no path, and the op
    (Path(site) / "torch_only.pth").write_text(str(torch_farm(tmp_path / "farm")) + "\n")
    out = run("import importlib.util, sys, torch, runtime, runtime.packages as p\n"
              "assert importlib.util.find_spec('cutlass') is None\n"
              "assert runtime.__file__.startswith(sys.prefix)\n"
              "gg = runtime.load()\n"
              "print([e.name for e in gg.kernels])\n"
              "import runtime.torch_op as op\n"
              "assert op.lookup() is not None  # 'default': the only installed package\n"
              "a = [torch.empty(40, 128, dtype=torch.uint8, device='meta')]\n"
              "b = [torch.empty(128, 128, dtype=torch.uint8, device='meta')]\n"
              "s = [torch.empty(1024, dtype=torch.uint8, device='meta')]\n"
              "print(tuple(torch.ops.nvfp4.grouped_gemm(a, b, s, s)[0].shape))\n")
    assert out.splitlines() == [str(KERNELS), "(40, 128)"]
