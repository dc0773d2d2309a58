"""Build and merge: plan -> reuse -> compile in workers -> assemble -> verify -> swap in.

Under the directory lock: read the previous manifest, reuse every item whose key has a kernel
with an intact cubin, compile each other distinct kernel once in worker subprocesses, assemble
the new directory next to the target, verify it and swap it in. If nothing needs compiling and
the manifest would be byte-identical, nothing is written and no worker (no `import cutlass`) is
started: a no-op run costs a YAML parse, a source fingerprint and a sha256 per cubin.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from runtime.manifest import MANIFEST_NAME, Kernel, KernelEntry, Manifest, Quantizer

from . import artifacts, atomic
from .errors import BuildError
from .families import Families
from .plan import BUILDER_VERSION, BuildItem, QuantItem, compile_list, dsl_version
from .runner import ItemResult, run_workers
from .selection import Selection, check_selective, spec_fingerprint
from .verify import verify_dir


@dataclass
class Row:
    """One line of the build summary."""

    name: str
    arch: str
    acc_stages: int
    cubin_bytes: int
    dynamic_smem: int
    compile_seconds: float | None  # None: not compiled for this row
    # "compiled"; "shared": its kernel was compiled in this build for another set (the first
    # by name); "reused": its kernel came from the previous build
    status: str


@dataclass
class BuildReport:
    rows: list[Row]
    changed: bool  # False when the directory was already up to date and left untouched
    notes: list[str] = field(default_factory=list)
    # (name, compile seconds or None when reused) of each activation quantizer
    quantizers: list[tuple[str, float | None]] = field(default_factory=list)


class BuildFailed(BuildError):
    """One or more kernels failed; the artifact directory was left unchanged."""

    def __init__(self, failures: list[ItemResult], skipped: int, total: int, out: Path) -> None:
        self.failures, self.skipped = failures, skipped
        lines = [f"build failed: {len(failures)} of {total} kernels failed"
                 + (f", {skipped} not attempted" if skipped else "")
                 + f"; {out} was left unchanged"]
        for r in failures:
            err = r.error or {}
            lines.append(f"  {r.item.name} ({r.item.describe()}): {err.get('type')}: "
                         f"{err.get('message')}")
            # Our own errors say everything; anything else needs the traceback to be fixed.
            if err.get("type") != "BuildError" and err.get("traceback"):
                lines += ["    " + t for t in err["traceback"].splitlines()]
        super().__init__("\n".join(lines))


class BuildInterrupted(BuildError):
    """SIGTERM or SIGHUP arrived during a build (CI timeouts, `kill`, a closed terminal)."""


@contextlib.contextmanager
def _terminate_like_ctrl_c() -> Iterator[None]:
    """Let SIGTERM and SIGHUP unwind the build like Ctrl-C does: stop the workers, delete the
    staging directory, undo a half-done two-rename swap. Python's default action for them is
    to die on the spot, which leaves the staging directory (and, on a kernel without
    renameat2, a missing target) for the next build's `recover` to clean up. Only from the main
    thread, and only where nobody installed a handler of their own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def interrupt(signum: int, frame: object) -> None:
        raise BuildInterrupted(f"build interrupted by {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _install(staging: Path, target: Path, manifest: Manifest) -> None:
    artifacts.write_manifest(staging, manifest)  # last: it marks the directory complete
    problems = verify_dir(staging)
    if problems:
        raise BuildError("the new artifact directory failed verification, so it was not "
                         "installed:\n  " + "\n  ".join(problems))
    atomic.swap_in(staging, target)


def build(items: list[BuildItem], out: Path, families: Families, *, jobs: int = 1,
          force: bool = False, keep_going: bool = False, lock_timeout: float = 60.0,
          on_result: Callable[[ItemResult], None] = lambda r: None,
          on_plan: Callable[[int, int], None] = lambda todo, reused: None,
          selection: Selection | None = None,
          on_lock_wait: Callable[[str], None] = lambda message: None,
          quantizers: list[QuantItem] = ()) -> BuildReport:
    """Build `items` into `out`, which afterwards holds exactly these kernels and
    `quantizers` (plan.expand_quantizers).

    `selection` says what part of its spec `items` are (default: all of it). A selective one
    (--only, --shard) is refused with SelectionError, before anything compiles, when `out`
    holds kernels it does not build (builder/selection.py)."""
    selection = selection or Selection(spec_fingerprint(items))
    target = out.resolve()
    with _terminate_like_ctrl_c(), atomic.fs_errors(target), \
            atomic.DirLock(target, lock_timeout, on_lock_wait):
        atomic.recover(target)
        atomic.check_replaceable(target, MANIFEST_NAME)
        existing = artifacts.read_existing(target)
        check_selective(selection, target, existing.names, (target / MANIFEST_NAME).exists(),
                        [it.name for it in items])
        old, notes = existing.manifest, list(existing.notes)
        reuse = {} if force else artifacts.reusable(old, target)
        entries: dict[str, KernelEntry] = {}
        rows: dict[str, Row] = {}
        todo = []
        for it in items:
            why = artifacts.derived_mismatch(it, reuse[it.key]) if it.key in reuse else None
            if it.key in reuse and why is None:
                entries[it.name] = e = artifacts.new_entry(it, reuse[it.key])
                rows[it.name] = Row(it.name, it.arch, it.acc_stages, e.cubin_bytes,
                                    e.dynamic_smem, None, "reused")
                continue
            if why:
                notes.append(f"the existing kernel for {it.name} cannot be reused ({why}); "
                             "recompiling it")
                reuse.pop(it.key)
            todo.append(it)
        kept: dict[str, Quantizer] = {}  # name -> a reused quantizer
        todo_q = []
        for q in quantizers:
            reused = None if force else artifacts.reusable_quantizer(q, old, target)
            if reused is not None:
                kept[q.name] = reused
            else:
                todo_q.append(q)
        compile_items = compile_list(todo)  # one per distinct kernel
        on_plan(len(compile_items) + len(todo_q),
                len({it.key for it in items}) - len(compile_items) + len(kept))
        manifest = artifacts.make_manifest(list(entries.values()), BUILDER_VERSION, dsl_version(),
                                           selection.spec_fingerprint, selection.shard,
                                           kept.values())
        q_report: list[tuple[str, float | None]] = [(name, None) for name in kept]
        if not todo and not todo_q and old is not None and not existing.notes:
            current = (target / MANIFEST_NAME).read_text()
            if artifacts.manifest_text(manifest, str(target)) == current \
                    and not verify_dir(target):
                return BuildReport([rows[it.name] for it in items], changed=False, notes=notes,
                                   quantizers=q_report)

        staging = atomic.staging_dir(target)
        try:
            for k in [*{e.key: e.kernel for e in entries.values()}.values(), *kept.values()]:
                artifacts.copy_cubin(target / k.cubin, staging, k.cubin)
            if todo or todo_q:
                work = staging / ".work"
                results = run_workers([*compile_items, *todo_q], work, families, jobs,
                                      keep_going, on_result)
                failures = [r for r in results if not r.ok and not r.skipped]
                if failures:
                    raise BuildFailed(failures, sum(r.skipped for r in results),
                                      len(compile_items) + len(todo_q), out)
                built: dict[str, tuple[Kernel, float]] = {}
                for r in results:
                    if isinstance(r.item, QuantItem):
                        q = artifacts.new_quantizer(r.item, r.kernel, r.sha256, r.cubin_bytes)
                        artifacts.copy_cubin(r.cubin, staging, q.cubin)
                        kept[r.item.name] = q
                        q_report.append((r.item.name, r.compile_seconds))
                        continue
                    k = artifacts.new_kernel(r.item, r.kernel, r.sha256, r.cubin_bytes)
                    artifacts.copy_cubin(r.cubin, staging, k.cubin)
                    built[k.key] = (k, r.compile_seconds)
                for it in todo:
                    k, seconds = built[it.key]
                    first = it.name == next(c.name for c in compile_items if c.key == it.key)
                    entries[it.name] = e = artifacts.new_entry(it, k)
                    rows[it.name] = Row(it.name, it.arch, it.acc_stages, e.cubin_bytes,
                                        e.dynamic_smem, seconds if first else None,
                                        "compiled" if first else "shared")
                shutil.rmtree(work)
            manifest = artifacts.make_manifest(list(entries.values()), BUILDER_VERSION,
                                               dsl_version(), selection.spec_fingerprint,
                                               selection.shard, kept.values())
            _install(staging, target, manifest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return BuildReport([rows[it.name] for it in items], changed=True, notes=notes,
                       quantizers=sorted(q_report))


def merge(out: Path, dirs: list[Path], lock_timeout: float = 60.0,
          on_lock_wait: Callable[[str], None] = lambda message: None) -> Manifest:
    """Combine shard directories into `out` (atomically, like a build)."""
    manifest, sources = artifacts.merge_manifests(dirs)
    target = out.resolve()
    with _terminate_like_ctrl_c(), atomic.fs_errors(target), \
            atomic.DirLock(target, lock_timeout, on_lock_wait):
        atomic.recover(target)
        atomic.check_replaceable(target, MANIFEST_NAME)
        staging = atomic.staging_dir(target)
        try:
            for d, k in sources:  # kernels and quantizers
                artifacts.copy_cubin(d / k.cubin, staging, k.cubin)
            _install(staging, target, manifest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return manifest
