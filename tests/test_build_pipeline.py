"""The build pipeline end to end with a fake family: plan, workers (real subprocesses), manifest,
incremental reuse, atomic install, locking, shard + merge, verify and the CLI.

Most tests use the synthetic fake compilers (no DSL, fast); tests marked `dsl` push a trivial
`@cute.kernel` through the same path and check real cubins.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, Fake, default_sigint, requires_dsl, tree_hash

from builder import atomic
from builder.build import BuildFailed, build, merge
from builder.errors import BuildError
from builder.families import load_families
from builder.plan import (
    BUILDER_VERSION,
    BuildItem,
    compile_list,
    dsl_version,
    expand,
    parse_shard,
    shard,
)
from builder.runner import split_jobs
from builder.selection import Selection, spec_fingerprint
from builder.spec import parse_spec_text
from builder.verify import verify_dir
from runtime.manifest import MANIFEST_NAME, kernel_record_name, load_manifest

SPEC = """\
schema_version: 1
defaults:
  archs: [sm_90a, sm_100a]
  acc_stages: {sm_100a: [1, 2], sm_90a: [1]}
  out_dtypes: [float16]
sets:
  - name: moe
    groups: [[80, 4096, 7168], [176, 4096, 7168]]
    options: {sm_90a: {tile_m: 64}}
  - name: dense
    groups: [[192, 3072, 4096]]
  - name: mixed
    groups: [[96, 1024, 512], [40, 2048, 768]]
"""
NAMES = sorted(f"{s}.{a}" for s in ("moe", "dense", "mixed")
               for a in ("sm_90a.acc1.f16", "sm_100a.acc1.f16", "sm_100a.acc2.f16"))
# Manifest schema 2: one kernel per distinct (family, arch, config); set names and shapes are
# not in the key. SPEC's 9 set entries need 4 kernels: fake90 tile_m 64 (moe), fake90 tile_m
# 128 (dense, mixed), fake100 acc1 and fake100 acc2 (every set). The first set by name
# compiles each kernel, the others share it.
COMPILED = ["dense.sm_100a.acc1.f16", "dense.sm_100a.acc2.f16", "dense.sm_90a.acc1.f16",
            "moe.sm_90a.acc1.f16"]
STATUSES = ["compiled" if n in COMPILED else "shared" for n in NAMES]


def plan(fake: Fake, text: str = SPEC, module: str | None = None) -> list[BuildItem]:
    fams = load_families(module or fake.module)
    return expand(parse_spec_text(text, "shapes.yaml", fams), fams)


def run(fake: Fake, out: Path, text: str = SPEC, module: str | None = None, **kw):
    fams = load_families(module or fake.module)
    items = expand(parse_spec_text(text, "shapes.yaml", fams), fams)
    return build(items, out, fams, **{"jobs": 2, **kw})


def cli(fake: Fake, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(fake.root)}
    return subprocess.run([sys.executable, str(REPO / "build_kernels.py"), *args], env=env,
                          capture_output=True, text=True, cwd=cwd, timeout=300, check=False)


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != "_fake")


# --------------------------------------------------------------------------------------------
# Plan: plain data, keys, shards, job split
# --------------------------------------------------------------------------------------------


def test_plan_is_sorted_plain_data(fake: Fake) -> None:
    items = plan(fake)
    assert [it.name for it in items] == NAMES
    moe90 = next(it for it in items if it.name == "moe.sm_90a.acc1.f16")
    assert (moe90.family, moe90.options, moe90.groups) == (
        "fake90", (("fail", 0), ("tile_m", 64)), ((80, 4096, 7168), (176, 4096, 7168)))
    for it in items:  # survives the trip to a worker as JSON
        assert BuildItem.from_dict(json.loads(json.dumps(it.to_dict()))) == it
    assert [it.name for it in compile_list(items)] == COMPILED  # one per distinct kernel
    by_key = {}
    for it in items:
        by_key.setdefault(it.key, []).append(it.name)
    assert sorted(by_key.values()) == [
        ["dense.sm_100a.acc1.f16", "mixed.sm_100a.acc1.f16", "moe.sm_100a.acc1.f16"],
        ["dense.sm_100a.acc2.f16", "mixed.sm_100a.acc2.f16", "moe.sm_100a.acc2.f16"],
        ["dense.sm_90a.acc1.f16", "mixed.sm_90a.acc1.f16"], ["moe.sm_90a.acc1.f16"]]
    assert plan(fake) == items  # deterministic


def test_key_covers_config_and_sources_but_not_the_set_name_or_shapes(fake: Fake) -> None:
    base = {it.name: it.key for it in plan(fake)}
    renamed = {it.name: it.key for it in plan(fake, SPEC.replace("name: dense", "name: dense2"))}
    assert renamed["dense2.sm_90a.acc1.f16"] == base["dense.sm_90a.acc1.f16"]
    regrouped = plan(fake, SPEC.replace("[192, 3072", "[200, 3072"))
    assert {it.name: it.key for it in regrouped} == base  # shapes are what a set serves
    assert next(it for it in regrouped if it.set == "dense").groups == ((200, 3072, 4096),)
    dynamic = SPEC.replace("    groups: [[192, 3072, 4096]]\n",
                           "    m: dynamic\n    groups: [[3072, 4096]]\n    max_m: 512\n")
    dyn = {it.name: it for it in plan(fake, dynamic)}
    assert {n: it.key for n, it in dyn.items()} == base
    assert dyn["dense.sm_90a.acc1.f16"].serves().record() == {
        "dynamic_m": {"groups": [[3072, 4096]], "max_m": 512}}
    retiled = {it.name: it.key for it in plan(fake, SPEC.replace("tile_m: 64", "tile_m: 128"))}
    assert {n for n in base if retiled[n] != base[n]} == {"moe.sm_90a.acc1.f16"}
    # ... and moe's sm_90a config is now dense's: one kernel serves both.
    assert retiled["moe.sm_90a.acc1.f16"] == base["dense.sm_90a.acc1.f16"]
    recast = {it.name: it.key for it in plan(fake, SPEC.replace(
        "out_dtypes: [float16]", "out_dtypes: [float16, bfloat16]"))}
    assert len({recast[n.replace(".f16", ".bf16")] for n in NAMES} | set(base.values())) == 8
    with open(fake.family_dir("fake100") / "compile.py", "a") as f:
        f.write("# a change\n")
    touched = {it.name: it.key for it in plan(fake)}
    assert {n for n in base if touched[n] != base[n]} == {n for n in NAMES if "sm_100a" in n}
    (fake.family_dir("fake90") / "__pycache__").mkdir(exist_ok=True)
    (fake.family_dir("fake90") / "__pycache__" / "x.pyc").write_bytes(b"cache")
    (fake.family_dir("fake90") / ".compile.py.swp").write_bytes(b"editor")
    assert {it.name: it.key for it in plan(fake)} == touched  # caches do not count


@pytest.mark.parametrize("text,message", [
    ("1/2/3", "--shard must be i/n (e.g. 0/4), but got '1/2/3'"),
    ("a/2", "--shard must be i/n (e.g. 0/4), but got 'a/2'"),
    ("2/2", "--shard i/n must have 0 <= i < n (i is 0-based), but got '2/2'"),
    ("0/0", "--shard i/n must have 0 <= i < n (i is 0-based), but got '0/0'"),
    ("-1/2", "--shard i/n must have 0 <= i < n (i is 0-based), but got '-1/2'"),
    # merge would then ask for every one of n shards (it ran out of memory at 10^20)
    ("0/100000000000000000000", "--shard i/n must have n <= 4096 (merge takes every shard of "
                                "n), but got '0/100000000000000000000'"),
])
def test_parse_shard_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_shard(text)
    assert str(info.value) == message


def test_shards_partition_the_sorted_list(fake: Fake) -> None:
    items = plan(fake)
    assert parse_shard("1/3") == (1, 3)
    parts = [shard(items, i, 3) for i in range(3)]
    assert sorted(it.name for p in parts for it in p) == NAMES
    assert parts[1] == [items[1], items[4], items[7]]


def test_split_jobs_keeps_one_arch_per_worker(fake: Fake) -> None:
    items = plan(fake)
    assert [{it.arch for it in g} for g in split_jobs(items, 1)] == [{"sm_100a"}, {"sm_90a"}]
    groups = split_jobs(items, 5)
    assert len(groups) == 5 and all(len({it.arch for it in g}) == 1 for g in groups)
    assert sorted(it.name for g in groups for it in g) == NAMES
    assert [len(g) for g in split_jobs(items, 100)] == [1] * 9


# --------------------------------------------------------------------------------------------
# Build: manifest contents
# --------------------------------------------------------------------------------------------


def test_build_writes_manifest_and_content_addressed_cubins(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    report = run(fake, out)
    assert [r.status for r in report.rows] == STATUSES and report.changed
    assert [r.compile_seconds is not None for r in report.rows] == [
        n in COMPILED for n in NAMES]
    assert len(fake.compiles()) == 4
    m = load_manifest(out)
    assert (m.schema_version, m.builder_version, m.dsl_version) == (3, BUILDER_VERSION,
                                                                    dsl_version())
    assert [e.name for e in m.sets] == NAMES
    items = {it.name: it for it in plan(fake)}
    assert [k.name for k in m.kernels] == sorted(
        kernel_record_name(items[n].family, items[n].arch, items[n].acc_stages, "float16",
                           items[n].key) for n in COMPILED)
    assert {k.key for k in m.kernels} == {it.key for it in items.values()}
    for e in m.sets:
        it = items[e.name]
        assert (e.key, e.set, e.arch, e.family, e.acc_stages) == (
            it.key, it.set, it.arch, it.family, it.acc_stages)
        assert e.kernel in m.kernels  # the set points at its kernel record, by key
        assert e.kernel.name == f"{it.family}.{it.arch}.acc{it.acc_stages}.f16.{it.key[:12]}"
        assert e.cubin == f"cubins/{e.kernel.name}.cubin"
        data = (out / e.cubin).read_bytes()
        assert (e.sha256, e.cubin_bytes) == (hashlib.sha256(data).hexdigest(), len(data))
        assert e.symbol == "fake_gemm_0" and e.block == (128, 1, 1) and e.cluster == (1, 1, 1)
        assert e.options == dict(it.options)  # the full config, defaults filled in
        assert e.dynamic_smem == 1024 * e.options["tile_m"]
        assert e.serves.groups == it.groups and not e.serves.dynamic_m  # each set its own
        assert e.kernel.limits.k_multiple == 256
        assert e.constraints == {"groups": [list(g) for g in it.groups], "k_multiple": 256}
        assert [(p.name, p.kind, p.offset, p.size, p.align) for p in e.params] == [
            ("problem_sizes", "table", 0, 8, 8), ("num_groups", "scalar", 8, 4, 4)]
    text = (out / MANIFEST_NAME).read_text()
    assert text == m.to_json()
    assert "seconds" not in text  # timings would make manifests differ run to run
    assert sorted(json.loads(text)["sets"][0]) == [
        "acc_stages", "arch", "kernel", "name", "out_dtype", "serves", "set"]
    assert sorted(tree_hash(out)) == sorted(["cubins", MANIFEST_NAME]
                                            + [k.cubin for k in m.kernels])  # 4 cubins
    assert verify_dir(out) == []
    assert siblings(out) == [".artifacts.lock", "artifacts"]  # no temp dirs left
    assert oct(out.stat().st_mode & 0o777) != oct(0o700)  # not mkdtemp's private mode


# --------------------------------------------------------------------------------------------
# Incremental
# --------------------------------------------------------------------------------------------


def test_second_run_compiles_nothing_and_takes_under_2s(fake: Fake, tmp_path: Path) -> None:
    spec = tmp_path / "shapes.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "artifacts"
    first = cli(fake, "build", "--spec", str(spec), "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert len(fake.compiles()) == 4
    assert f"{out}: 9 kernel(s), 4 compiled, 5 shared, 0 reused; written" in first.stdout
    before = tree_hash(out)
    start = time.monotonic()
    second = cli(fake, "--spec", str(spec), "--out", str(out))  # `build` is the default
    elapsed = time.monotonic() - start
    assert second.returncode == 0, second.stderr
    assert len(fake.compiles()) == 4
    assert elapsed < 2.0, elapsed
    assert f"{out}: 9 kernel(s), 0 compiled, 0 shared, 9 reused; already up to date" in \
        second.stdout
    assert tree_hash(out) == before


def test_changing_one_family_source_rebuilds_only_its_kernels(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    run(fake, out)
    old = {e.name: e for e in load_manifest(out).sets}
    compile_py = fake.family_dir("fake90") / "compile.py"
    os.utime(compile_py)  # a new mtime alone changes no content: nothing to rebuild
    assert not run(fake, out).changed
    with open(compile_py, "a") as f:
        f.write("# tuned\n")
    report = run(fake, out)
    assert {r.name: r.status for r in report.rows if "sm_90a" in r.name} == {
        "dense.sm_90a.acc1.f16": "compiled", "mixed.sm_90a.acc1.f16": "shared",
        "moe.sm_90a.acc1.f16": "compiled"}
    assert {r.status for r in report.rows if "sm_100a" in r.name} == {"reused"}
    assert [line.split()[0] for line in fake.compiles()[4:]] == ["fake90"] * 2
    new = {e.name: e for e in load_manifest(out).sets}
    for name in NAMES:
        assert (new[name].key == old[name].key) == ("sm_100a" in name)
        assert (out / new[name].cubin).is_file()
        if "sm_90a" in name:
            assert not (out / old[name].cubin).exists()
    assert verify_dir(out) == []


def test_spec_change_rebuilds_only_changed_items_and_drops_removed(fake: Fake,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    run(fake, out)
    old = load_manifest(out)
    # dense: new shapes (its kernels stay) and a new sm_100a config (new kernels); moe, whose
    # sm_90a kernel no other set uses, goes.
    text = SPEC.replace("    groups: [[192, 3072, 4096]]\n",
                        "    groups: [[200, 3072, 4096]]\n    options: {sm_100a: {tile_m: 64}}\n")
    text = text.replace("  - name: moe\n    groups: [[80, 4096, 7168], [176, 4096, 7168]]\n"
                        "    options: {sm_90a: {tile_m: 64}}\n", "")
    report = run(fake, out, text)
    assert report.changed
    assert {r.name: r.status for r in report.rows} == {
        "dense.sm_100a.acc1.f16": "compiled", "dense.sm_100a.acc2.f16": "compiled",
        "dense.sm_90a.acc1.f16": "reused", "mixed.sm_100a.acc1.f16": "reused",
        "mixed.sm_100a.acc2.f16": "reused", "mixed.sm_90a.acc1.f16": "reused"}
    assert len(fake.compiles()) == 6
    m = load_manifest(out)
    assert [e.name for e in m.sets] == [n for n in NAMES if not n.startswith("moe")]
    assert m.entry("dense.sm_90a.acc1.f16").serves.groups == ((200, 3072, 4096),)
    assert m.entry("dense.sm_90a.acc1.f16").kernel == old.entry("dense.sm_90a.acc1.f16").kernel
    assert len(m.kernels) == 5
    assert not (out / old.entry("moe.sm_90a.acc1.f16").cubin).exists()
    assert verify_dir(out) == []  # the removed set's own cubin is gone, not stray


def test_altered_cubin_is_recompiled_not_reused(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    run(fake, out)
    entry = load_manifest(out).entry("dense.sm_90a.acc1.f16")
    (out / entry.cubin).write_bytes(b"garbage")
    report = run(fake, out)
    assert [r.name for r in report.rows if r.status == "compiled"] == ["dense.sm_90a.acc1.f16"]
    assert [r.name for r in report.rows if r.status == "shared"] == ["mixed.sm_90a.acc1.f16"]
    assert verify_dir(out) == []


def test_force_recompiles_everything(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    run(fake, out)
    before = tree_hash(out)
    report = run(fake, out, force=True)
    assert [r.status for r in report.rows] == STATUSES
    assert len(fake.compiles()) == 8
    assert tree_hash(out) == before  # same inputs, byte-identical output


# --------------------------------------------------------------------------------------------
# Atomic: failures leave the old directory byte-identical
# --------------------------------------------------------------------------------------------

FAILURES = [
    (1, "RuntimeError: fake compiler failure (fail=1)"),
    (2, ("BuildError: launch ABI mismatch at parameter 1 ('num_groups'): recorded size 8, "
         "align 8, but the PTX .entry fake_gemm_0 has size 4, align 4 (.param .u32 "
         "fake_gemm_0_param_1)")),
    (3, "WorkerExit: the sm_100a worker exited with code 17 before reporting this kernel"),
    (4, ("BuildError: the cubin of mixed.sm_100a.acc1.f16 is for sm_90a, but it was built for "
         "sm_100a (CUTE_DSL_ARCH must be set before `import cutlass`)")),
    (5, ("BuildError: compile_kernel must return the cubin as non-empty bytes, but got str "
         "'/tmp/dump/missing.cubin' (a str here usually means the DSL dump directory did not "
         "exist)")),
]


@pytest.mark.parametrize("fail,error", FAILURES, ids=[f"fail{f}" for f, _ in FAILURES])
def test_failed_build_leaves_old_directory_byte_identical(fake: Fake, tmp_path: Path, fail: int,
                                                          error: str) -> None:
    out = tmp_path / "artifacts"
    run(fake, out)
    before = tree_hash(out)
    # One changed set's new kernels compile fine, the other's fail on sm_100a only.
    text = SPEC.replace("    groups: [[192, 3072, 4096]]\n",
                        "    groups: [[200, 3072, 4096]]\n    options: {sm_100a: {tile_m: 64}}\n")
    text += f"    options: {{sm_100a: {{fail: {fail}}}}}\n"
    with pytest.raises(BuildFailed) as info:
        run(fake, out, text, jobs=1)
    msg = str(info.value)
    first = msg.splitlines()[0]
    assert first.startswith("build failed: 1 of 4 kernels failed")  # 4 to compile
    assert first.endswith(f"; {out} was left unchanged")
    assert (f"  mixed.sm_100a.acc1.f16 (set mixed, arch sm_100a, acc stages 1, out float16): {error}"
            in msg.splitlines())
    assert tree_hash(out) == before
    assert siblings(out) == [".artifacts.lock", "artifacts"]


def test_launch_data_the_runtime_would_reject_fails_that_kernel(fake: Fake,
                                                                tmp_path: Path) -> None:
    with pytest.raises(BuildFailed) as info:
        run(fake, tmp_path / "a", SPEC + "    options: {sm_90a: {fail: 7}}\n")
    (failure,) = info.value.failures
    assert failure.item.name == "mixed.sm_90a.acc1.f16"
    assert failure.error["message"].startswith(
        f"the recorded launch data is not a valid kernel record: {failure.item.kernel_name}"
        ".params[0].kind must be one of ['table', 'tma_template', 'scalar', 'zeros', 'operand'], but got "
        "'pointer'")


def test_keep_going_reports_every_failure(fake: Fake, tmp_path: Path) -> None:
    text = SPEC + "    options: {sm_100a: {fail: 1}}\n"
    with pytest.raises(BuildFailed) as info:
        run(fake, tmp_path / "a", text, jobs=1, keep_going=True)
    assert [r.item.name for r in info.value.failures] == ["mixed.sm_100a.acc1.f16",
                                                          "mixed.sm_100a.acc2.f16"]
    assert info.value.skipped == 0
    assert not (tmp_path / "a").exists()
    with pytest.raises(BuildFailed) as info:
        run(fake, tmp_path / "b", text, jobs=1)
    assert len(info.value.failures) == 1 and info.value.skipped >= 1


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent's wait() is missing


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_killed_build_leaves_old_directory_and_no_worker(fake: Fake, tmp_path: Path,
                                                         how: str) -> None:
    out = tmp_path / "artifacts"
    run(fake, out)
    before = tree_hash(out)
    spec = fake.log.parent / "shapes.yaml"
    spec.write_text(SPEC + "    options: {sm_90a: {fail: 6}}\n")  # this compile hangs
    env = {**os.environ, "PYTHONPATH": str(fake.root)}
    proc = subprocess.Popen([sys.executable, str(REPO / "build_kernels.py"), "--spec", str(spec),
                             "--out", str(out)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=default_sigint)
    pid_file = Path(str(fake.log) + ".pid")
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    worker = int(pid_file.read_text())
    os.kill(proc.pid, getattr(signal, how))  # SIGKILL: no cleanup code runs in the build
    proc.wait(timeout=60)
    deadline = time.monotonic() + 10
    while _alive(worker):  # SIGKILL: the kernel's parent-death signal ends it
        assert time.monotonic() < deadline, "the worker outlived the build"
        time.sleep(0.05)
    assert tree_hash(out) == before
    run(fake, out)  # the next build removes what the killed one left behind
    assert siblings(out) == [".artifacts.lock", "artifacts"]


def test_interrupted_swap_is_recovered_by_the_next_build(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    run(fake, out)
    before = tree_hash(out)
    # A build killed between its two renames (where renameat2 is unavailable) ...
    os.rename(out, tmp_path / ".artifacts.old-4242")
    (tmp_path / ".artifacts.tmp-dead").mkdir()  # ... and one killed while compiling
    report = run(fake, out)
    assert not report.changed and len(fake.compiles()) == 4
    assert tree_hash(out) == before
    assert siblings(out) == [".artifacts.lock", "artifacts"]


def test_swap_without_renameat2_and_a_failing_rename(fake: Fake, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "artifacts"
    run(fake, out)
    before = tree_hash(out)
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    real_rename = os.rename
    calls = []

    def flaky_rename(src, dst):
        calls.append(Path(src).name)
        if Path(src).name.startswith(".artifacts.tmp-"):
            raise OSError("disk on fire")
        return real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", flaky_rename)
    with pytest.raises(BuildError, match="disk on fire"):  # an error line, not a traceback
        run(fake, out, force=True)
    assert tree_hash(out) == before  # the old directory was renamed back
    monkeypatch.setattr(atomic.os, "rename", real_rename)
    run(fake, out, SPEC.replace("[192, 3072", "[200, 3072"))  # the two-rename path works
    assert verify_dir(out) == [] and tree_hash(out) != before


def test_refuses_to_replace_a_directory_it_did_not_write(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.txt").write_text("mine")
    with pytest.raises(BuildError, match="holds no manifest.json, so it is not an artifact "
                                         "directory; refusing to replace it"):
        run(fake, out)
    assert (out / "todo.txt").read_text() == "mine"


# --------------------------------------------------------------------------------------------
# Locking
# --------------------------------------------------------------------------------------------


def test_lock_held_by_another_build_times_out_with_a_clear_message(fake: Fake,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    with atomic.DirLock(out.resolve(), timeout=1), pytest.raises(BuildError) as info:
        run(fake, out, lock_timeout=0.2)
    assert str(info.value) == (
        f"another build is writing {out} (lock {tmp_path / '.artifacts.lock'} held by pid "
        f"{os.getpid()}); waited 0.2 s. Wait for it to finish, or raise --lock-timeout")
    assert not out.exists()
    # The lock is an flock: released on exit, so the next build proceeds.
    fd = os.open(tmp_path / ".artifacts.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


def test_concurrent_builds_serialize_and_the_second_reuses(fake: Fake, tmp_path: Path) -> None:
    spec = tmp_path / "shapes.yaml"
    spec.write_text(SPEC)
    env = {**os.environ, "PYTHONPATH": str(fake.root)}
    args = [sys.executable, str(REPO / "build_kernels.py"), "build", "--spec", str(spec),
            "--out", str(tmp_path / "artifacts")]
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    assert len(fake.compiles()) == 4  # whoever came second found everything built
    assert verify_dir(tmp_path / "artifacts") == []


# --------------------------------------------------------------------------------------------
# Shard + merge
# --------------------------------------------------------------------------------------------


def test_shards_merged_equal_a_full_build(fake: Fake, tmp_path: Path) -> None:
    fams = load_families(fake.module)
    items = plan(fake)
    build(items, tmp_path / "full", fams, jobs=2)
    shard_dirs = []
    for i in range(3):
        shard_dirs.append(tmp_path / f"shard{i}")
        build(shard(items, i, 3), shard_dirs[-1], fams, jobs=1,
              selection=Selection(spec_fingerprint(items), (i, 3)))
    merge(tmp_path / "merged", shard_dirs)
    full, merged = tmp_path / "full" / MANIFEST_NAME, tmp_path / "merged" / MANIFEST_NAME
    assert merged.read_text() == full.read_text()
    assert tree_hash(tmp_path / "merged") == tree_hash(tmp_path / "full")
    # Overlapping shards with equal keys merge; the result is the same.
    merge(tmp_path / "merged", [tmp_path / "full", *shard_dirs])
    assert merged.read_text() == full.read_text()


def test_merge_refuses_different_keys_and_versions(fake: Fake, tmp_path: Path) -> None:
    run(fake, tmp_path / "a")
    # Same kernels (keys do not cover shapes), other shapes: a set record of another spec.
    run(fake, tmp_path / "c", SPEC.replace("[192, 3072", "[200, 3072"))
    with pytest.raises(BuildError) as info:
        merge(tmp_path / "m", [tmp_path / "a", tmp_path / "c"])
    assert str(info.value) == (
        f"kernel dense.sm_100a.acc1.f16 serves {{'groups': [[192, 3072, 4096]]}} in "
        f"{tmp_path / 'a'} but {{'groups': [[200, 3072, 4096]]}} in {tmp_path / 'c'}; were the "
        "shards built from different specs?")
    with open(fake.family_dir("fake90") / "config.py", "a") as f:
        f.write("# changed\n")
    run(fake, tmp_path / "b")
    with pytest.raises(BuildError, match=r"^kernel dense.sm_90a.acc1.f16 is in .*/a \(key \w{12}\) "
                                         r"and in .*/b \(key \w{12}\) with different keys"):
        merge(tmp_path / "m", [tmp_path / "a", tmp_path / "b"])
    manifest = tmp_path / "b" / MANIFEST_NAME
    manifest.write_text(manifest.read_text().replace(f'"builder_version": "{BUILDER_VERSION}"',
                                                     '"builder_version": "0"'))
    with pytest.raises(BuildError) as info:
        merge(tmp_path / "m", [tmp_path / "a", tmp_path / "b"])
    assert str(info.value) == (
        f"shards must share one builder version, but {tmp_path / 'a'} has '{BUILDER_VERSION}', "
        f"{tmp_path / 'b'} has '0'; rebuild them with the same builder and DSL")
    assert not (tmp_path / "m").exists()


# --------------------------------------------------------------------------------------------
# Verify and the CLI
# --------------------------------------------------------------------------------------------


def test_verify_catches_altered_missing_wrong_arch_and_stray(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    run(fake, out)
    ok = cli(fake, "verify", str(out))
    assert ok.stdout == (f"{out}: ok (9 kernel(s) served by 4 cubin(s); every cubin matches "
                         "its sha256, arch and symbol)\n")
    m = load_manifest(out)
    # Problems are reported per kernel record (one cubin each), whichever sets it serves.
    e = {s.name: s.kernel for s in m.sets}
    # A valid cubin for the wrong arch, with the manifest's sha256 and size made to match it,
    # so that only the ELF check can notice.
    wrong = (out / e["mixed.sm_100a.acc1.f16"].cubin).read_bytes()
    altered = out / e["dense.sm_100a.acc1.f16"].cubin
    altered.write_bytes(altered.read_bytes()[:-1] + b"X")
    (out / e["moe.sm_100a.acc2.f16"].cubin).unlink()
    target = e["mixed.sm_90a.acc1.f16"]
    (out / target.cubin).write_bytes(wrong)
    text = (out / MANIFEST_NAME).read_text()
    text = text.replace(target.sha256, hashlib.sha256(wrong).hexdigest())
    text = text.replace(f'"cubin_bytes": {target.cubin_bytes},', f'"cubin_bytes": {len(wrong)},')
    (out / MANIFEST_NAME).write_text(text)
    (out / "cubins" / "leftover.cubin").write_bytes(b"x")
    bad = cli(fake, "verify", str(out))
    assert bad.returncode == 1
    lines = bad.stderr.splitlines()
    assert lines[0] == f"{out}: 4 problem(s):"
    assert sorted(lines[1:]) == sorted([
        (f"  {e['dense.sm_100a.acc1.f16'].name}: cubin {altered.relative_to(out)} has sha256 "
         f"{hashlib.sha256(altered.read_bytes()).hexdigest()[:16]}..., manifest says "
         f"{e['dense.sm_100a.acc1.f16'].sha256[:16]}... (altered or corrupt: rebuild it)"),
        (f"  {e['moe.sm_100a.acc2.f16'].name}: cubin {e['moe.sm_100a.acc2.f16'].cubin} is "
         "missing"),
        f"  {target.name}: cubin {target.cubin} is for sm_100a, manifest says sm_90a",
        "  stray file cubins/leftover.cubin (not in the manifest)",
    ])
    # A build repairs it all: bad cubins are recompiled, the stray file is dropped.
    report = run(fake, out)
    assert {r.name for r in report.rows if r.status == "compiled"} == {
        "dense.sm_100a.acc1.f16", "dense.sm_100a.acc2.f16", "dense.sm_90a.acc1.f16"}
    assert verify_dir(out) == []


def test_verify_reports_an_invalid_manifest(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME).write_text('{"schema_version": 9}')
    assert verify_dir(tmp_path) == [
        (f"{tmp_path / MANIFEST_NAME}: schema_version must be 3, but got 9; rebuild the "
         "artifacts with this version of build_kernels.py")]


def test_cli_spec_error_exits_2_and_writes_nothing(fake: Fake, tmp_path: Path) -> None:
    spec = tmp_path / "shapes.yaml"
    spec.write_text(SPEC.replace("[192, 3072, 4096]", "[192, 3072, 4000]"))
    proc = cli(fake, "build", "--spec", str(spec), "--out", str(tmp_path / "artifacts"))
    assert proc.returncode == 2
    assert proc.stderr == (f"error: {spec}: sets[dense].groups[0][2]: k must be a multiple of "
                           "256 (the sm_90a kernel's K granule), but got 4000\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_fake", "shapes.yaml"]
    assert fake.compiles() == []


@pytest.mark.parametrize("args,message", [
    (["--shard", "3/3"], "error: --shard i/n must have 0 <= i < n (i is 0-based), but got '3/3'"),
    (["--only", "nope"], ("error: --only must name sets of {spec}, but got ['nope']; sets: "
                          "moe, dense, mixed")),
    (["--jobs", "0"], "error: --jobs must be >= 1, but got 0"),
])
def test_cli_bad_arguments_exit_2(fake: Fake, tmp_path: Path, args: list[str],
                                  message: str) -> None:
    spec = tmp_path / "shapes.yaml"
    spec.write_text(SPEC)
    proc = cli(fake, "build", "--spec", str(spec), "--out", str(tmp_path / "out"), *args)
    assert proc.returncode == 2
    assert proc.stderr.strip() == message.format(spec=spec)
    assert not (tmp_path / "out").exists()


def test_cli_build_failure_exits_1_naming_the_spec(fake: Fake, tmp_path: Path) -> None:
    spec = tmp_path / "shapes.yaml"
    spec.write_text(SPEC + "    options: {sm_90a: {fail: 1}}\n")
    proc = cli(fake, "build", "--spec", str(spec), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert ("  mixed.sm_90a.acc1.f16 (set mixed, arch sm_90a, acc stages 1, out float16): RuntimeError: fake "
            "compiler failure (fail=1)") in proc.stderr
    assert "Traceback" in proc.stderr  # not one of our errors: the traceback helps fix it
    assert not (tmp_path / "out").exists()


def test_cli_only_shard_summary_and_list(fake: Fake, tmp_path: Path) -> None:
    spec = tmp_path / "shapes.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    proc = cli(fake, "build", "--spec", str(spec), "--out", str(out), "--only", "mixed",
               "--only", "moe", "--shard", "0/2", "-j", "3")
    assert proc.returncode == 0, proc.stderr
    names = ["mixed.sm_100a.acc1.f16", "mixed.sm_90a.acc1.f16", "moe.sm_100a.acc2.f16"]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["kernel", "arch", "acc", "cubin", "KiB", "smem", "KiB",
                                "compile", "s", "status"]
    assert [ln.split()[0] for ln in lines[2:5]] == names
    assert all(ln.split()[-1] == "compiled" for ln in lines[2:5])
    assert "[3/3] " in proc.stderr  # one progress line per kernel when not a terminal
    listed = cli(fake, "list", str(out), "--json")
    assert listed.returncode == 0
    rows = json.loads(listed.stdout)
    assert [r["kernel"] for r in rows] == names
    assert rows[0] == {"kernel": "mixed.sm_100a.acc1.f16", "arch": "sm_100a", "acc": 1,
                       "symbol": "fake_gemm_0", "cubin_kib": rows[0]["cubin_kib"],
                       "smem": 131072, "groups": "2: 96x1024x512, 40x2048x768"}
    table = cli(fake, "list", str(out))
    assert "2: m 80..176, n 4096, k 7168" in table.stdout


def test_cli_merge_and_help(fake: Fake, tmp_path: Path) -> None:
    spec = tmp_path / "shapes.yaml"
    spec.write_text(SPEC)
    for i in range(2):
        proc = cli(fake, "build", "--spec", str(spec), "--out", str(tmp_path / f"s{i}"),
                   "--shard", f"{i}/2")
        assert proc.returncode == 0, proc.stderr
    proc = cli(fake, "merge", str(tmp_path / "m"), str(tmp_path / "s0"), str(tmp_path / "s1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{tmp_path / 'm'}: merged 9 kernel(s) from 2 directories"
    assert verify_dir(tmp_path / "m") == []
    helptext = cli(fake, "--help").stdout
    assert "merge artifacts shard0 shard1" in helptext and "--shard 0/2" in helptext


# --------------------------------------------------------------------------------------------
# With the real DSL: trivial kernels through the real worker path
# --------------------------------------------------------------------------------------------


@pytest.mark.dsl
@requires_dsl
def test_dsl_build_verify_and_reuse(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "artifacts"
    report = run(fake, out, module=fake.dsl_module)
    assert [r.status for r in report.rows] == STATUSES
    assert verify_dir(out) == []  # includes the ELF arch of every real cubin
    m = load_manifest(out)
    assert len(m.kernels) == 4 and {e.family for e in m.kernels} == {"dsl90", "dsl100"}
    assert all(e.symbol == "fake_gemm_0" for e in m.kernels)
    assert all(e.cubin_bytes > 1000 for e in m.kernels)
    assert not run(fake, out, module=fake.dsl_module).changed


@pytest.mark.dsl
@requires_dsl
def test_dsl_build_with_wrong_abi_fails_naming_the_parameter(fake: Fake, tmp_path: Path) -> None:
    text = SPEC + "    options: {sm_90a: {fail: 2}}\n"
    with pytest.raises(BuildFailed) as info:
        run(fake, tmp_path / "artifacts", text, module=fake.dsl_module)
    assert ("  mixed.sm_90a.acc1.f16 (set mixed, arch sm_90a, acc stages 1, out float16): BuildError: launch ABI "
            "mismatch at parameter 1 ('num_groups'): recorded size 8, align 8, but the PTX "
            ".entry fake_gemm_0 has size 4, align 4 (.param .u32 fake_gemm_0_param_1)"
            in str(info.value).splitlines())
