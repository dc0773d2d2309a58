"""Package an artifact directory as an installable wheel, with the standard library only.

    python build_kernels.py package artifacts --out dist --name moe --version 1.0.0
    pip install --no-index --no-deps dist/nvfp4_artifacts_moe-1.0.0-py3-none-any.whl
    runtime.load("pkg:moe")      # or runtime.load() when it is the only one installed

Why a wheel written by hand: the GPU hosts have no network and CI installs only what
pyproject.toml lists, so the packager cannot count on `build`, `wheel` or a build backend. A
data-only pure-Python wheel is a zip file with three metadata files (PEP 427, PEP 376 RECORD,
core metadata 2.1); writing them is less code than driving setuptools from a temp project.

The wheel holds, for a package name NAME:

    nvfp4_artifacts_NAME/__init__.py          ARTIFACTS path + version constants, no imports
    nvfp4_artifacts_NAME/package.json         format, name, version, manifest schema, builder,
                                              DSL and runtime versions, manifest sha256, kernels
    nvfp4_artifacts_NAME/artifacts/...        manifest.json + cubins/, exactly as verified
    nvfp4_artifacts_NAME-V.dist-info/         METADATA, WHEEL, entry_points.txt, top_level.txt,
                                              RECORD

The entry point `[nvfp4_grouped_gemm.artifacts] NAME = nvfp4_artifacts_NAME` is how
runtime.packages finds it. Contents are driven by the artifacts: the directory must pass
builder.verify first, every cubin its manifest names goes in (optionally only some archs), and
the finished wheel is unpacked and verified again. Builds are reproducible: sorted entries,
fixed timestamps (SOURCE_DATE_EPOCH if set), so the same artifacts give a byte-identical wheel.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import json
import os
import re
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.manifest import (
    ARCHS,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    load_manifest,
    make_manifest,
)
from runtime.packages import (
    ARTIFACTS_SUBDIR,
    ENTRY_POINT_GROUP,
    PACKAGE_FORMAT,
    PACKAGE_INFO,
    installed,
)

from .errors import BuilderError
from .verify import verify_dir

PROJECT = "nvfp4-grouped-gemm"
REPO_ROOT = Path(__file__).resolve().parents[1]
DIST_PREFIX = "nvfp4-artifacts-"
MODULE_PREFIX = "nvfp4_artifacts_"
# Both matched with fullmatch: `$` also matches before a trailing newline ('1.0.0\n').
_NAME_RE = re.compile(r"[a-z0-9]+(_[a-z0-9]+)*")
# PEP 440 public versions (plus an optional local label), the forms pip accepts unchanged.
_VERSION_RE = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?"
                         r"(\+[a-z0-9]+(\.[a-z0-9]+)*)?")
_EPOCH_1980 = 315532800  # the earliest time a zip entry can carry
_EPOCH_2107 = 4354819199  # the latest: 2107-12-31 23:59:59 UTC (7 bits of years from 1980)


class PackageError(BuilderError):
    """The artifact directory cannot be packaged (it fails verification, or writing failed)."""


class PackageUsageError(BuilderError):
    """An invalid --name, --version or --arch (exit code 2)."""


@dataclass(frozen=True)
class PackageResult:
    wheel: Path
    name: str  # entry point name: runtime.load("pkg:<name>")
    distribution: str
    module: str
    version: str
    kernels: tuple[str, ...]
    bytes: int


def normalize_name(name: str) -> str:
    """'My-Set.v2' -> 'my_set_v2'; the entry point name and the module suffix."""
    norm = re.sub(r"[-_.]+", "_", name.strip().lower())
    if not _NAME_RE.fullmatch(norm):
        raise PackageUsageError(
            f"--name must be letters, digits, '-', '_' or '.', starting and ending with a letter "
            f"or digit (e.g. moe_llama), but got {name!r}")
    return norm


def check_version(version: str) -> str:
    if not _VERSION_RE.fullmatch(version):
        raise PackageUsageError(
            f"--version must be a PEP 440 version such as 1.0.0, 2.1rc1 or 0.1.0+cu13, but got "
            f"{version!r}")
    return version


def project_version() -> str:
    """The runtime's version: pyproject.toml in a checkout, else the installed distribution."""
    pyproject = REPO_ROOT / "pyproject.toml"
    if pyproject.is_file():
        m = re.search(r'(?m)^version\s*=\s*"([^"]+)"', pyproject.read_text())
        if m:
            return m.group(1)
    try:
        return importlib.metadata.version(PROJECT)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def source_date_epoch() -> int:
    """The wheel's timestamp: SOURCE_DATE_EPOCH (seconds since 1970, raised to 1980, the first
    a zip entry can carry), 1980 when unset; PackageUsageError unless it is a whole number a
    zip entry can carry (int() took ' 1_0 ' and raised ValueError on 'abc'; past 2107
    zipfile raised struct.error)."""
    text = os.environ.get("SOURCE_DATE_EPOCH")
    if text is None:
        return _EPOCH_1980
    if not re.fullmatch(r"[0-9]{1,10}", text) or int(text) > _EPOCH_2107:
        raise PackageUsageError(
            f"SOURCE_DATE_EPOCH must be a whole number of seconds since 1970 from 0 to "
            f"{_EPOCH_2107} (2107-12-31 23:59:59 UTC, the last time a zip entry can carry), "
            f"but got {text!r}")
    return max(int(text), _EPOCH_1980)


def _zip_time() -> tuple[int, int, int, int, int, int]:
    return time.gmtime(source_date_epoch())[:6]


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def _init_py(name: str, version: str, kernels: Sequence[str]) -> str:
    return f'''"""NVFP4 grouped-GEMM artifacts {name!r}: {len(kernels)} kernel(s), data only.

Built by `build_kernels.py package`. The nvfp4-grouped-gemm runtime finds this package through
its entry point ({ENTRY_POINT_GROUP}) without importing it:

    import runtime
    gg = runtime.load("pkg:{name}")
"""

from pathlib import Path

NAME = {name!r}
__version__ = {version!r}
SCHEMA_VERSION = {SCHEMA_VERSION}  # manifest schema; a runtime reading another one refuses this
ARTIFACTS = Path(__file__).resolve().parent / {ARTIFACTS_SUBDIR!r}


def artifact_dir() -> Path:
    """The directory holding manifest.json and cubins/."""
    return ARTIFACTS
'''


def _metadata(dist: str, version: str, name: str, summary: str, kernels: Sequence[str]) -> str:
    lines = "\n".join(f"- `{k}`" for k in kernels)
    return (f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\nSummary: {summary}\n"
            f"Keywords: nvfp4,cuda,cubin,grouped-gemm\n"
            f"Description-Content-Type: text/markdown\n\n"
            f"# {dist}\n\nAhead-of-time built NVFP4 grouped-GEMM kernels for the "
            f"`{PROJECT}` runtime (manifest schema {SCHEMA_VERSION}).\n\n"
            f"```python\nimport runtime\ngg = runtime.load(\"pkg:{name}\")\n```\n\n"
            f"Kernels:\n\n{lines}\n")


def _payload(directory: Path, name: str, version: str,
             archs: Sequence[str]) -> tuple[dict[str, bytes], list[str]]:
    """Files of the import package, by path inside the wheel, and the kernel names."""
    manifest = load_manifest(directory)
    manifest_bytes = (directory / MANIFEST_NAME).read_bytes()
    entries = manifest.sets
    if archs:
        entries = tuple(e for e in entries if e.arch in archs)
        missing = sorted(set(archs) - {e.arch for e in entries})
        if missing:
            built = sorted({e.arch for e in manifest.sets})
            raise PackageUsageError(f"--arch must name archs built in {directory} ({built}), "
                                    f"but {missing} has no kernel there")
        manifest = make_manifest(entries, manifest.builder_version, manifest.dsl_version,
                                 manifest.spec_fingerprint, manifest.shard,
                                 [q for q in manifest.quantizers if q.arch in archs])
        manifest_bytes = manifest.to_json().encode()
    if not entries:
        raise PackageError(f"{directory} has no kernels to package")
    kernels = entries
    module = MODULE_PREFIX + name
    root = f"{module}/{ARTIFACTS_SUBDIR}"
    names = [e.name for e in entries]
    files = {f"{root}/{MANIFEST_NAME}": manifest_bytes}
    for k in (*manifest.kernels, *manifest.quantizers):  # each distinct cubin once
        files[f"{root}/{Path(k.cubin).as_posix()}"] = (directory / k.cubin).read_bytes()
    info = {
        "format": PACKAGE_FORMAT,
        "name": name,
        "distribution": DIST_PREFIX + name.replace("_", "-"),
        "version": version,
        "schema_version": manifest.schema_version,
        "builder_version": manifest.builder_version,
        "dsl_version": manifest.dsl_version,
        "runtime_version": project_version(),
        "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
        "archs": sorted({k.arch for k in kernels}),
        "sets": sorted({k.set for k in kernels}),
        "kernels": names,
    }
    files[f"{module}/{PACKAGE_INFO}"] = (json.dumps(info, indent=1, sort_keys=True) + "\n").encode()
    files[f"{module}/__init__.py"] = _init_py(name, version, names).encode()
    return files, names


def _wheel_bytes(files: dict[str, bytes], dist: str, version: str, module: str,
                 name: str, summary: str, kernels: Sequence[str]) -> bytes:
    stem = f"{dist.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = _metadata(dist, version, name, summary, kernels).encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: {PROJECT} build_kernels.py "
                              f"package\nRoot-Is-Purelib: true\nTag: py3-none-any\n").encode()
    files[f"{info}/entry_points.txt"] = f"[{ENTRY_POINT_GROUP}]\n{name} = {module}\n".encode()
    files[f"{info}/top_level.txt"] = f"{module}\n".encode()
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in sorted(files.items()))
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    # Package files first, dist-info last (RECORD at the very end), as wheel writers do.
    order = sorted(files, key=lambda p: (p.startswith(info), p.endswith("/RECORD"), p))
    buf = io.BytesIO()
    stamp = _zip_time()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in order:
            zi = zipfile.ZipInfo(path, date_time=stamp)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, files[path])
    return buf.getvalue()


def _self_check(wheel: Path, name: str, module: str) -> None:
    """Unpack the wheel as an installer would and check what the runtime will see."""
    with tempfile.TemporaryDirectory(prefix="nvfp4_pkgcheck_") as tmp:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp)
        problems = verify_dir(Path(tmp) / module / ARTIFACTS_SUBDIR)
        found = [p for p in installed(path=[tmp]) if p.name == name]
        if not found:
            problems.append(f"entry point {ENTRY_POINT_GROUP}:{name} not found")
        elif not found[0].usable:
            problems.append(found[0].problem or "unusable")
    if problems:
        raise PackageError(f"{wheel} failed its own check: " + "; ".join(problems))


def build_wheel(artifact_dir: str | Path, out_dir: str | Path, *, name: str = "default",
                version: str | None = None, archs: Sequence[str] = ()) -> PackageResult:
    """Write dist wheel `nvfp4_artifacts_<name>-<version>-py3-none-any.whl` into `out_dir`.

    Refuses a directory that fails `build_kernels.py verify`. `version` defaults to the
    runtime's own version; `archs` keeps only those archs' kernels (e.g. a Hopper-only wheel).
    """
    directory = Path(artifact_dir)
    name = normalize_name(name)
    version = check_version(version or project_version())
    source_date_epoch()  # a bad SOURCE_DATE_EPOCH is refused before anything is read
    bad = [a for a in archs if a not in ARCHS]
    if bad:
        raise PackageUsageError(f"--arch must be one of {list(ARCHS)}, but got {bad}")
    problems = verify_dir(directory)
    if problems:
        raise PackageError(f"{directory} does not verify, so it is not packaged "
                           f"({len(problems)} problem(s)):\n  " + "\n  ".join(problems))
    files, kernels = _payload(directory, name, version, archs)
    dist = DIST_PREFIX + name.replace("_", "-")
    module = MODULE_PREFIX + name
    info = json.loads(files[f"{module}/{PACKAGE_INFO}"])
    summary = (f"NVFP4 grouped-GEMM cubins {name!r} for {PROJECT}: {len(kernels)} kernel(s), "
               f"archs {', '.join(info['archs'])}, manifest schema {SCHEMA_VERSION}")
    data = _wheel_bytes(files, dist, version, module, name, summary, kernels)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    tmp = out / f".{wheel.name}.{os.getpid()}.tmp"
    try:
        tmp.write_bytes(data)
        _self_check(tmp, name, module)
        os.replace(tmp, wheel)
    except OSError as exc:
        raise PackageError(f"cannot write {wheel}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return PackageResult(wheel=wheel, name=name, distribution=dist, module=module,
                         version=version, kernels=tuple(kernels), bytes=len(data))
