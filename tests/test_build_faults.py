"""Issue 28, the builder's side: a selective build never deletes kernels, every filesystem
fault is an `error:` line with the exit-code contract (0 ok, 1 failed, 2 invalid spec or
arguments), merge checks the spec and the shards, and a build that waits for the lock says so.

Fake family (tests/fakefam.py): real worker subprocesses, synthetic cubins.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import Fake, tree_hash
from test_build_pipeline import SPEC, cli, plan, run

from builder import artifacts
from builder.build import build, merge
from builder.errors import BuildError
from builder.families import load_families
from builder.plan import shard
from builder.selection import Selection, SelectionError, spec_fingerprint
from builder.verify import verify_dir
from runtime.errors import ManifestError
from runtime.manifest import MANIFEST_NAME, load_manifest


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "shapes.yaml"
    path.write_text(SPEC)
    return path


def _no_traceback(r: subprocess.CompletedProcess, code: int) -> str:
    assert r.returncode == code, (r.stdout, r.stderr)
    assert r.stderr.splitlines()[-1].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r.stderr


# ------------------------------------------------------------------ case 1: selective builds


@pytest.mark.parametrize("selective,kept", [(["--only", "dense"], 6), (["--shard", "0/2"], 4)])
def test_a_selective_build_never_deletes_kernels_of_an_existing_directory(
        fake: Fake, tmp_path: Path, spec: Path, selective: list[str], kept: int) -> None:
    out = tmp_path / "artifacts"
    assert cli(fake, "build", "--spec", str(spec), "--out", str(out)).returncode == 0
    before = tree_hash(out)
    r = cli(fake, "build", "--spec", str(spec), "--out", str(out), "--force", *selective)
    err = _no_traceback(r, 2)
    assert f"--out {out} holds {kept} kernel(s) that {' '.join(selective)} does not build" in err
    assert "A selective build never deletes kernels" in err
    assert tree_hash(out) == before


def test_a_selective_build_into_its_own_directory_still_works(fake: Fake, tmp_path: Path) -> None:
    fams = load_families(fake.module)
    items = plan(fake)
    sel = Selection(spec_fingerprint(items), (1, 2))
    out = tmp_path / "shard1"
    build(shard(items, 1, 2), out, fams, jobs=2, selection=sel)
    report = build(shard(items, 1, 2), out, fams, jobs=2, selection=sel)  # the same shard again
    assert not report.changed
    m = load_manifest(out)
    assert (m.spec_fingerprint, m.shard) == (spec_fingerprint(items), (1, 2))
    with pytest.raises(SelectionError, match="does not build"):  # another shard: refused
        build(shard(items, 0, 2), out, fams, selection=Selection(sel.spec_fingerprint, (0, 2)))


# ------------------------------------------------------------------ case 4: filesystem faults


def test_a_directory_where_the_lock_file_goes_is_an_error_line(
        fake: Fake, tmp_path: Path, spec: Path) -> None:
    (tmp_path / ".artifacts.lock").mkdir()
    err = _no_traceback(cli(fake, "build", "--spec", str(spec), "--out",
                            str(tmp_path / "artifacts")), 1)
    assert "is a directory (the build puts its lock file there): remove it" in err


def test_out_below_a_file_is_an_error_line(fake: Fake, tmp_path: Path, spec: Path) -> None:
    (tmp_path / "file").write_text("x")
    err = _no_traceback(cli(fake, "build", "--spec", str(spec), "--out",
                            str(tmp_path / "file" / "artifacts")), 1)
    assert f"--out must be a directory path, but {tmp_path / 'file' / 'artifacts'} lies below a " \
        f"file ({tmp_path / 'file'}" in err


def _read_only(directory: Path) -> None:
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return
    # root ignores permission bits; the immutable attribute stops it too (ext4, xfs, btrfs)
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode:
        pytest.skip("running as root on a filesystem without chattr +i")


def _writable(directory: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(directory)], capture_output=True)
    directory.chmod(0o755)


def test_a_read_only_or_immutable_target_is_an_error_line_even_for_a_no_op_build(
        fake: Fake, tmp_path: Path, spec: Path) -> None:
    parent = tmp_path / "ro"
    out = parent / "artifacts"
    assert cli(fake, "build", "--spec", str(spec), "--out", str(out)).returncode == 0
    (parent / ".artifacts.lock").unlink()  # the lock must be created again
    before = tree_hash(out)
    _read_only(parent)
    try:
        err = _no_traceback(cli(fake, "build", "--spec", str(spec), "--out", str(out)), 1)
    finally:
        _writable(parent)
    assert f"cannot write {parent / '.artifacts.lock'}" in err
    assert "a read-only or immutable directory cannot be built into" in err
    assert tree_hash(out) == before


def test_a_full_disk_in_the_builder_says_no_space_left(
        fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "artifacts"
    run(fake, out)
    before = tree_hash(out)

    def full(directory: Path, manifest: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "manifest.json"))

    monkeypatch.setattr(artifacts, "write_manifest", full)
    with pytest.raises(BuildError, match="^no space left on device while writing .*manifest"):
        run(fake, out, force=True)
    assert tree_hash(out) == before


def test_a_full_disk_in_a_worker_says_no_space_left(fake: Fake, tmp_path: Path) -> None:
    spec = tmp_path / "full.yaml"
    spec.write_text(SPEC.replace("{sm_90a: {tile_m: 64}}", "{sm_90a: {tile_m: 64, fail: 8}}"))
    r = cli(fake, "build", "--spec", str(spec), "--out", str(tmp_path / "artifacts"))
    assert r.returncode == 1
    assert "no space left on device" in r.stderr and "worker exited" not in r.stderr, r.stderr


# ------------------------------------------------------------------ case 6: merge


def test_merge_refuses_shards_of_two_specs(fake: Fake, tmp_path: Path, spec: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(SPEC.replace("[192, 3072, 4096]", "[200, 3072, 4096]"))
    for i, s in enumerate((spec, other)):
        r = cli(fake, "build", "--spec", str(s), "--out", str(tmp_path / f"s{i}"), "--shard",
                f"{i}/2")
        assert r.returncode == 0, r.stderr
    err = _no_traceback(cli(fake, "merge", str(tmp_path / "m"), str(tmp_path / "s0"),
                            str(tmp_path / "s1")), 1)
    assert "shards must come from one spec" in err and "spec fingerprints differ" in err
    assert not (tmp_path / "m").exists()


def test_merge_refuses_a_missing_shard(fake: Fake, tmp_path: Path) -> None:
    fams = load_families(fake.module)
    items = plan(fake)
    for i in (0, 2):
        build(shard(items, i, 3), tmp_path / f"s{i}", fams,
              selection=Selection(spec_fingerprint(items), (i, 3)))
    with pytest.raises(BuildError) as info:
        merge(tmp_path / "m", [tmp_path / "s0", tmp_path / "s2"])
    assert str(info.value) == ("shards must be all 3 of --shard I/3, but 1/3 is missing; pass "
                               "every shard directory")
    build(shard(items, 1, 3), tmp_path / "s1", fams,
          selection=Selection(spec_fingerprint(items), (1, 3)))
    merged = merge(tmp_path / "m", [tmp_path / f"s{i}" for i in range(3)])
    assert (merged.shard, len(merged.sets), len(merged.kernels)) == (None, 9, 4)
    assert verify_dir(tmp_path / "m") == []


@pytest.mark.parametrize("count", [10**20, 4097])
def test_merge_refuses_a_recorded_shard_count_past_the_limit(fake: Fake, tmp_path: Path,
                                                             count: int) -> None:
    """A manifest's shard [i, n] with a huge n made merge build set(range(n)) (MemoryError
    for 10**20); the manifest reader caps n at the CLI's --shard limit, 4096."""
    items = plan(fake)
    build(shard(items, 0, 2), tmp_path / "s0", load_families(fake.module),
          selection=Selection(spec_fingerprint(items), (0, 2)))
    path = tmp_path / "s0" / MANIFEST_NAME
    obj = json.loads(path.read_text())
    obj["shard"] = [0, count]
    path.write_text(json.dumps(obj))
    message = f"{path}.shard must be [i, n] with 0 <= i < n <= 4096, but got [0, {count}]"
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path / "s0")
    assert str(info.value) == message
    with pytest.raises(BuildError) as info:
        merge(tmp_path / "m", [tmp_path / "s0"])
    assert str(info.value) == f"cannot merge {tmp_path / 's0'}: {message}"
    assert not (tmp_path / "m").exists()


# ------------------------------------------------------------------ case 7: the lock


def test_a_build_that_waits_for_the_lock_says_who_holds_it(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    fd = os.open(tmp_path / ".artifacts.lock", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"4242\n")
    fcntl.flock(fd, fcntl.LOCK_EX)
    said: list[str] = []
    try:
        with pytest.raises(BuildError, match="another build is writing"):
            fams = load_families(fake.module)
            build(plan(fake), out, fams, lock_timeout=0.3, on_lock_wait=said.append)
    finally:
        os.close(fd)
    assert said == [f"waiting for the lock {tmp_path / '.artifacts.lock'}, held by pid 4242 "
                    f"(another build writing {out}), for up to 0.3 s"]


@pytest.mark.parametrize("command", ["build", "merge"])
@pytest.mark.parametrize("value", ["-5", "nan"])
def test_a_negative_lock_timeout_is_an_argument_error(
        fake: Fake, tmp_path: Path, spec: Path, command: str, value: str) -> None:
    args = (["build", "--spec", str(spec), "--out", str(tmp_path / "a")] if command == "build"
            else ["merge", str(tmp_path / "m"), str(tmp_path)])
    err = _no_traceback(cli(fake, *args, "--lock-timeout", value), 2)
    assert f"--lock-timeout must be a number of seconds >= 0, but got {value}" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "m").exists()


def test_merge_names_the_first_missing_shards_only() -> None:
    from types import SimpleNamespace

    from builder.selection import check_shards

    loaded = [(Path("s0"), SimpleNamespace(spec_fingerprint="f", shard=(0, 4096))),
              (Path("s5"), SimpleNamespace(spec_fingerprint="f", shard=(5, 4096)))]
    with pytest.raises(BuildError) as info:
        check_shards(loaded)
    assert str(info.value) == (
        "shards must be all 4096 of --shard I/4096, but 1/4096, 2/4096, 3/4096, 4/4096, 6/4096, "
        "7/4096, 8/4096, 9/4096 and 4086 more are missing; pass every shard directory")
