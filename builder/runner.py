"""Run build workers in parallel subprocesses and collect one result per item.

Each worker builds items of a single arch (CUTE_DSL_ARCH is per process). `--jobs N` runs up to
N workers at once; when N exceeds the number of archs, an arch's items are split over several
workers, so 2 archs on 8 cores still use 8 processes.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .families import ENV_FAMILIES, Families
from .plan import REPO_ROOT, BuildItem
from .worker import EXIT_NO_SPACE

STDERR_TAIL = 2000  # characters of a crashed worker's stderr quoted in its items' errors


@dataclass
class ItemResult:
    item: BuildItem
    ok: bool
    skipped: bool = False  # not attempted: the build stopped at an earlier failure
    compile_seconds: float = 0.0
    cubin: Path | None = None
    sha256: str = ""
    cubin_bytes: int = 0
    kernel: dict[str, Any] | None = None
    error: dict[str, str] | None = None


def split_jobs(items: list[BuildItem], jobs: int) -> list[list[BuildItem]]:
    """Items grouped per arch; an arch gets more workers while jobs allow, the arch with the
    most items per worker first. Deterministic for a given item list."""
    by_arch: dict[str, list[BuildItem]] = {}
    for it in items:
        by_arch.setdefault(it.arch, []).append(it)
    workers = {arch: 1 for arch in by_arch}
    while sum(workers.values()) < jobs:
        open_archs = [a for a in by_arch if workers[a] < len(by_arch[a])]
        if not open_archs:
            break
        best = max(open_archs, key=lambda a: (len(by_arch[a]) / workers[a], a))
        workers[best] += 1
    return [by_arch[a][j::workers[a]] for a in sorted(by_arch) for j in range(workers[a])]


def _import_root(families: Families) -> Path:
    """The sys.path entry a worker needs to import the families module."""
    path = families.module_file()
    depth = families.module.count(".") + (1 if path.name == "__init__.py" else 0)
    return path.parents[depth]


def worker_env(arch: str, families: Families) -> dict[str, str]:
    env = dict(os.environ)
    env["CUTE_DSL_ARCH"] = arch  # read once at `import cutlass`: must be set before start
    env["CUDA_VISIBLE_DEVICES"] = ""  # compile only: never touch a GPU that happens to exist
    env[ENV_FAMILIES] = families.module
    roots = dict.fromkeys([str(REPO_ROOT), str(_import_root(families))])
    env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [env.get("PYTHONPATH")])])
    return env


class _Worker:
    def __init__(self, index: int, items: list[BuildItem], work: Path, families: Families,
                 keep_going: bool, events: queue.Queue) -> None:
        self.index, self.items = index, items
        self.dir = work / f"w{index}"
        self.dir.mkdir(parents=True)
        self.log = work / f"w{index}.log"
        job = {"arch": items[0].arch, "families": families.module, "out_dir": str(self.dir),
               "keep_going": keep_going, "parent": os.getpid(),
               "items": [it.to_dict() for it in items]}
        job_file = work / f"w{index}.json"
        job_file.write_text(json.dumps(job))
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "builder.worker", str(job_file)],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                env=worker_env(items[0].arch, families), start_new_session=True)
        self.reported: set[str] = set()
        threading.Thread(target=self._read, args=(events,), daemon=True).start()

    def _read(self, events: queue.Queue) -> None:
        for line in self.proc.stdout:
            events.put(("line", self, line))
        events.put(("exit", self, self.proc.wait()))

    def result(self, name: str) -> ItemResult:
        item = next(it for it in self.items if it.name == name)
        data = json.loads((self.dir / f"{name}.json").read_text())
        self.reported.add(name)
        if not data["ok"]:
            return ItemResult(item, ok=False, error=data["error"])
        return ItemResult(item, ok=True, compile_seconds=data["compile_seconds"],
                          cubin=self.dir / data["cubin"], sha256=data["sha256"],
                          cubin_bytes=data["cubin_bytes"], kernel=data["kernel"])

    def stderr_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-STDERR_TAIL:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:  # the worker leads its own session: end it and anything it started
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def run_workers(items: list[BuildItem], work: Path, families: Families, jobs: int,
                keep_going: bool,
                on_result: Callable[[ItemResult], None] = lambda r: None) -> list[ItemResult]:
    """Compile `items` in worker subprocesses; one ItemResult per item, in item order."""
    events: queue.Queue = queue.Queue()
    pending = split_jobs(items, max(1, jobs))
    running: list[_Worker] = []
    results: dict[str, ItemResult] = {}
    stopping = False
    index = 0

    def stop_all() -> None:
        # Fail fast: nothing is swapped in after a failure, so the rest is wasted work.
        nonlocal stopping
        stopping = True
        for group in pending:
            for it in group:
                results[it.name] = ItemResult(it, ok=False, skipped=True)
        pending.clear()
        for w in running:
            w.stop()

    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                running.append(_Worker(index, pending.pop(0), work, families, keep_going, events))
                index += 1
            kind, w, payload = events.get()
            if kind == "line":
                res = w.result(json.loads(payload)["name"])
                results[res.item.name] = res
                on_result(res)
                if not res.ok and not keep_going and not stopping:
                    stop_all()
                continue
            running.remove(w)
            for it in w.items:
                if it.name in w.reported:
                    continue
                if stopping:
                    results[it.name] = ItemResult(it, ok=False, skipped=True)
                    continue
                # The worker died (crash, out of memory, killed) before reporting this item.
                if payload == EXIT_NO_SPACE:
                    error = {"type": "NoSpace", "traceback": "",
                             "message": f"no space left on device: the {it.arch} worker could "
                                        f"not write its results under {work}"}
                else:
                    error = {"type": "WorkerExit", "traceback": w.stderr_tail(),
                             "message": f"the {it.arch} worker exited with code {payload} "
                                        "before reporting this kernel"}
                res = ItemResult(it, ok=False, error=error)
                results[it.name] = res
                on_result(res)
                if not keep_going:
                    stop_all()
    finally:
        for w in running:  # interrupted (Ctrl-C) or failed: leave no worker behind
            w.stop()
            w.proc.wait()
    return [results[it.name] for it in items]
