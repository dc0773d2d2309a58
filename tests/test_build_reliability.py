"""Builds that are killed, fail or race, with real signals and real processes (issue 6).

tests/test_build_pipeline.py already covers: SIGKILL and SIGINT while a worker compiles, a
failing kernel (five kinds) leaving the old directory byte-identical, an interrupted two-rename
swap (simulated), the lock timing out in-process, and two concurrent CLI builds. Here:

- a build killed (SIGKILL, SIGTERM, SIGINT) at each named point of its life, from planning to
  after the swap, through a driver that pauses the real CLI at that point: the directory is the
  old one byte-identical (or, past the swap, the new one complete), no worker survives, and
  the next build works and leaves nothing behind;
- the same at arbitrary moments of a build whose compiles are merely slow;
- a second CLI build refused after --lock-timeout with the exact message while the first holds
  the lock, and a second build that waits for the first, then reuses its kernels;
- a CLI build failing on one spec over an existing directory, naming the spec.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, Fake, default_sigint, tree_hash
from test_build_pipeline import SPEC, _alive, run, siblings

from builder import atomic
from builder.verify import verify_dir

# SPEC with two sets changed (manifest schema 2: kernels are keyed by config, not shapes):
# dense gets new shapes and a new sm_100a config (2 kernels compile), moe's sm_90a config
# becomes dense's (moe's own kernel goes), mixed gets new shapes; 3 kernels are reused.
SPEC2 = SPEC.replace("    groups: [[192, 3072, 4096]]\n",
                     "    groups: [[200, 3072, 4096]]\n    options: {sm_100a: {tile_m: 64}}\n"
                     ).replace("tile_m: 64}}\n  - name: dense", "tile_m: 128}}\n  - name: dense"
                               ).replace("[96, 1024, 512]", "[104, 1024, 512]")
assert SPEC2.count("tile_m: 64") == 1 and SPEC2.count("tile_m: 128") == 1

HOOK = '''

def _reliability_pause(name):
    """Pause at `name` when $KILL_POINT says so: flag it, wait for $RELEASE_FILE."""
    if os.environ.get("KILL_POINT") != name:
        return
    flag = os.environ["POINT_FILE"]
    if os.path.exists(flag):
        return  # only the first process to get here pauses
    tmp = f"{flag}.{os.getpid()}.tmp"  # two workers may get here at once
    with open(tmp, "w") as f:
        f.write(name)
    os.replace(tmp, flag)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["RELEASE_FILE"]) and time.monotonic() < deadline:
        time.sleep(0.02)


def _reliability_hook():
    pids = os.environ.get("RELIABILITY_PIDS")
    if pids:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\\n")
    time.sleep(float(os.environ.get("FAKE_COMPILE_SLEEP", "0")))
    _reliability_pause("compiling")
'''

DRIVER = '''\
"""Runs build_kernels.py with pauses at named points of a build (see test_build_reliability)."""
import os
import sys
import time
from pathlib import Path

import builder.build as bb
from builder import artifacts, atomic


def pause(name):
    if os.environ.get("KILL_POINT") != name:
        return
    flag = os.environ["POINT_FILE"]
    if os.path.exists(flag):
        return
    tmp = f"{flag}.{os.getpid()}.tmp"  # two workers may get here at once
    with open(tmp, "w") as f:
        f.write(name)
    os.replace(tmp, flag)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["RELEASE_FILE"]) and time.monotonic() < deadline:
        time.sleep(0.02)


def wrap(module, name, before=None, after=None, when=lambda *a: True):
    real = getattr(module, name)

    def wrapper(*args, **kw):
        if before and when(*args):
            pause(before)
        out = real(*args, **kw)
        if after and when(*args):
            pause(after(out) if callable(after) else after)
        return out

    setattr(module, name, wrapper)


wrap(artifacts, "reusable", before="planning")
wrap(artifacts, "copy_cubin", before="copy_reused", when=lambda src, *a: ".work" not in
     Path(src).parts)
wrap(artifacts, "copy_cubin", before="copy_compiled", when=lambda src, *a: ".work" in
     Path(src).parts)
wrap(artifacts, "write_manifest", after="manifest_written")
wrap(bb, "verify_dir", before="verify", when=lambda d: Path(d).name.startswith("."))
wrap(atomic, "swap_in", before="swap")
if os.environ.get("KILL_POINT") in ("between_renames", "after_renames"):
    atomic._exchange = lambda a, b: False  # as on a kernel or filesystem without renameat2
wrap(atomic, "_exchange", after=lambda done: "after_exchange" if done else "")
real_rename = os.rename


def rename(src, dst):
    real_rename(src, dst)
    if ".old-" in Path(dst).name:
        pause("between_renames")
    elif ".tmp-" in Path(src).name:
        pause("after_renames")


atomic.os.rename = rename
sys.argv = ["build_kernels.py", *sys.argv[1:]]
import build_kernels  # noqa: E402

build_kernels.main()
'''

# Where a build can be when it dies, and what the directory must hold afterwards.
POINTS = {
    "planning": "old",  # lock held, previous manifest read, nothing written
    "compiling": "old",  # a worker compiles into the staging directory
    "copy_reused": "old",  # unchanged cubins copied into staging
    "copy_compiled": "old",  # new cubins copied into staging
    "manifest_written": "old",  # staging complete, not verified
    "verify": "old",  # staging verified
    "swap": "old",  # about to swap
    "after_exchange": "new",  # swapped by renameat2, the old directory not yet deleted
    "between_renames": "old",  # no renameat2: target moved aside, staging not yet in place
    "after_renames": "new",  # no renameat2: swapped, the old directory not yet deleted
}
# SIGKILL everywhere (no cleanup code runs); the catchable signals where cleanup matters.
MATRIX = [(p, "SIGKILL") for p in POINTS] + [
    (p, "SIGTERM") for p in ("compiling", "swap", "between_renames", "after_renames")] + [
    (p, "SIGINT") for p in ("compiling", "between_renames")]


@pytest.fixture
def hooked(fake: Fake, tmp_path: Path) -> Fake:
    """The fake family with a pause / slow-compile hook in every compile."""
    common = fake.root / fake.pkg / "common.py"
    text = common.read_text()
    text = text.replace("def fail_early(config):\n", "def fail_early(config):\n"
                        "    _reliability_hook()\n", 1)
    common.write_text(text + HOOK)
    (tmp_path / "_fake" / "driver.py").write_text(DRIVER)
    return fake


def _env(fake: Fake, tmp_path: Path, **extra: str) -> dict[str, str]:
    ctl = tmp_path / "_fake"
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(fake.root)]),
            "POINT_FILE": str(ctl / "point"), "RELEASE_FILE": str(ctl / "release"),
            "RELIABILITY_PIDS": str(ctl / "pids"), **extra}


def _start(fake: Fake, tmp_path: Path, spec: Path, out: Path, *args: str,
           **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(tmp_path / "_fake" / "driver.py"), "build", "--spec", str(spec),
         "--out", str(out), "-j", "2", *args],
        env=_env(fake, tmp_path, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=default_sigint)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the build exited ({proc.returncode}) before the point:\n"
                                 f"{out}\n{err}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def _worker_pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "_fake" / "pids"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _no_survivors(pids: list[int]) -> None:
    deadline = time.monotonic() + 10
    for pid in pids:
        while _alive(pid):  # SIGKILL: the parent-death signal ends them
            assert time.monotonic() < deadline, f"worker {pid} outlived the build"
            time.sleep(0.05)


@pytest.fixture
def states(hooked: Fake, tmp_path: Path) -> dict[str, dict[str, str]]:
    """Tree hashes of the old (SPEC) and new (SPEC2) builds, made without interruptions."""
    run(hooked, tmp_path / "_fake" / "new", SPEC2)
    run(hooked, tmp_path / "artifacts", SPEC)
    return {"old": tree_hash(tmp_path / "artifacts"),
            "new": tree_hash(tmp_path / "_fake" / "new")}


@pytest.mark.parametrize("point,how", MATRIX, ids=[f"{p}-{s}" for p, s in MATRIX])
def test_build_killed_at_each_point(hooked: Fake, tmp_path: Path, states: dict, point: str,
                                    how: str) -> None:
    out = tmp_path / "artifacts"
    spec = tmp_path / "_fake" / "shapes.yaml"
    spec.write_text(SPEC2)
    proc = _start(hooked, tmp_path, spec, out, KILL_POINT=point)
    _wait_for(tmp_path / "_fake" / "point", proc)
    os.kill(proc.pid, getattr(signal, how))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    if how == "SIGTERM":
        assert "error: build interrupted by SIGTERM" in err
    _no_survivors(_worker_pids(tmp_path))
    (tmp_path / "_fake" / "release").touch()  # (nothing waits any more)
    if point == "between_renames" and how == "SIGKILL":
        # Without renameat2 a SIGKILL here leaves the old directory moved aside, intact; the
        # next build (or any build's recover, under the lock) moves it back first.
        assert not out.exists()
        (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith(".artifacts.old-")]
        assert tree_hash(aside) == states["old"]
        with atomic.DirLock(out, 5):
            atomic.recover(out)
    want = POINTS[point]
    assert tree_hash(out) == states[want], f"{out} is not the {want} directory"
    assert verify_dir(out) == []
    # The next build works, and removes what the killed one left behind.
    report = run(hooked, out, SPEC2)
    assert report.changed == (want == "old")
    assert tree_hash(out) == states["new"]
    assert siblings(out) == [".artifacts.lock", "artifacts"]


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_build_killed_at_arbitrary_moments(hooked: Fake, tmp_path: Path, states: dict,
                                           how: str) -> None:
    """Slow compiles (0.15 s each), a signal after delays spread across the whole build."""
    out = tmp_path / "artifacts"
    spec = tmp_path / "_fake" / "shapes.yaml"
    spec.write_text(SPEC2)
    t0 = time.monotonic()
    full = _start(hooked, tmp_path, spec, tmp_path / "_fake" / "timing",
                  FAKE_COMPILE_SLEEP="0.15")
    assert full.wait(timeout=120) == 0
    duration = time.monotonic() - t0
    seen = set()
    for i in range(4):
        delay = duration * (i + 0.5) / 4
        proc = _start(hooked, tmp_path, spec, out, FAKE_COMPILE_SLEEP="0.15")
        time.sleep(delay)
        os.kill(proc.pid, getattr(signal, how))
        proc.communicate(timeout=60)
        _no_survivors(_worker_pids(tmp_path))
        with atomic.DirLock(out, 5):
            atomic.recover(out)  # what the next build does first
        state = next((k for k, v in states.items() if v == tree_hash(out)), None)
        assert state is not None, f"after {delay:.2f} s: neither the old nor the new directory"
        seen.add(state)
        assert verify_dir(out) == []
        if state == "new":  # finished before the signal: start over from the old one
            run(hooked, out, SPEC)
    assert "old" in seen
    run(hooked, out, SPEC2)
    assert tree_hash(out) == states["new"]
    assert siblings(out) == [".artifacts.lock", "artifacts"]


# --------------------------------------------------------------------------------------------
# Two builds into one directory
# --------------------------------------------------------------------------------------------


def test_second_build_refused_after_lock_timeout(hooked: Fake, tmp_path: Path,
                                                 states: dict) -> None:
    out = tmp_path / "artifacts"
    spec = tmp_path / "_fake" / "shapes.yaml"
    spec.write_text(SPEC2)
    first = _start(hooked, tmp_path, spec, out, KILL_POINT="compiling")
    _wait_for(tmp_path / "_fake" / "point", first)
    t0 = time.monotonic()
    second = subprocess.run(
        [sys.executable, str(REPO / "build_kernels.py"), "build", "--spec", str(spec), "--out",
         str(out), "--lock-timeout", "0.5"], env=_env(hooked, tmp_path), capture_output=True,
        text=True, timeout=60, check=False)
    waited = time.monotonic() - t0
    assert second.returncode == 1
    assert second.stderr == (
        f"note: waiting for the lock {tmp_path / '.artifacts.lock'}, held by pid {first.pid} "
        f"(another build writing {out}), for up to 0.5 s\n"
        f"error: another build is writing {out} (lock {tmp_path / '.artifacts.lock'} held by "
        f"pid {first.pid}); waited 0.5 s. Wait for it to finish, or raise --lock-timeout\n")
    assert waited >= 0.5
    assert tree_hash(out) == states["old"]  # the refused build touched nothing
    (tmp_path / "_fake" / "release").touch()
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert tree_hash(out) == states["new"]
    assert siblings(out) == [".artifacts.lock", "artifacts"]


def test_second_build_waits_for_the_first_then_reuses(hooked: Fake, tmp_path: Path,
                                                      states: dict) -> None:
    out = tmp_path / "artifacts"
    spec = tmp_path / "_fake" / "shapes.yaml"
    spec.write_text(SPEC2)
    first = _start(hooked, tmp_path, spec, out, KILL_POINT="compiling")
    _wait_for(tmp_path / "_fake" / "point", first)
    second = _start(hooked, tmp_path, spec, out)  # default --lock-timeout: it waits
    time.sleep(1.0)
    if second.poll() is not None:
        raise AssertionError(f"the second build did not wait for the lock: "
                             f"{second.communicate()}, first: {first.poll()}")
    assert tree_hash(out) == states["old"]
    (tmp_path / "_fake" / "release").touch()
    _, err1 = first.communicate(timeout=120)
    out2, err2 = second.communicate(timeout=120)
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    assert f"{out}: 9 kernel(s), 0 compiled, 0 shared, 9 reused; already up to date" in out2
    assert tree_hash(out) == states["new"]


# --------------------------------------------------------------------------------------------
# A failing spec over an existing directory, through the CLI
# --------------------------------------------------------------------------------------------


def test_cli_failure_on_one_spec_leaves_the_directory_and_names_it(hooked: Fake,
                                                                   tmp_path: Path,
                                                                   states: dict) -> None:
    out = tmp_path / "artifacts"
    spec = tmp_path / "_fake" / "shapes.yaml"
    spec.write_text(SPEC2 + "    options: {sm_100a: {fail: 3}}\n")  # the worker dies
    proc = subprocess.run(
        [sys.executable, str(REPO / "build_kernels.py"), "build", "--spec", str(spec), "--out",
         str(out), "-j", "1"], env=_env(hooked, tmp_path), capture_output=True, text=True,
        timeout=120, check=False)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    head = next(ln for ln in lines if ln.startswith("error: build failed: "))
    assert head.startswith("error: build failed: 1 of 4 kernels failed")  # 4 to compile
    assert head.endswith(f"; {out} was left unchanged")
    assert ("  mixed.sm_100a.acc1.f16 (set mixed, arch sm_100a, acc stages 1, out float16): WorkerExit: the "
            "sm_100a worker exited with code 17 before reporting this kernel") in lines
    assert tree_hash(out) == states["old"]
    assert siblings(out) == [".artifacts.lock", "artifacts"]
