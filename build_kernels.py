#!/usr/bin/env python3
"""Build, list, inspect, verify, merge and package ahead-of-time NVFP4 grouped-GEMM artifacts.

Runs on a machine with no GPU. Only the worker subprocesses import the CuTe DSL, each with
CUTE_DSL_ARCH pinned before the import; this process stays light so that a no-op build is fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from builder.errors import BuilderError, SpecError

EPILOG = """\b
Examples:
  python build_kernels.py                       build shapes.yaml into artifacts/
  python build_kernels.py build -j 8 --force    rebuild everything, 8 workers
  python build_kernels.py build --only moe_down --out /tmp/moe
  python build_kernels.py build --shard 0/2 --out shard0    (CI machine 1)
  python build_kernels.py build --shard 1/2 --out shard1    (CI machine 2)
  python build_kernels.py merge artifacts shard0 shard1
  python build_kernels.py list artifacts
  python build_kernels.py inspect moe_down.sm_90a.acc1.f16
  python build_kernels.py verify artifacts
  python build_kernels.py package artifacts --out dist --name moe

\b
Exit codes: 0 ok; 1 build, verify or merge failed, or the output cannot be written; 2 invalid
shapes.yaml or arguments, incl. a selective build that would delete kernels.
\b
Environment:
  NVFP4_BUILD_FAMILIES  module that defines FAMILIES (default kernels.families); for tests
  CUTE_DSL_ARCH         set per worker by the builder; any value you set is overridden
  SOURCE_DATE_EPOCH     timestamp of the files in a `package` wheel (default 1980-01-01)

Run `python build_kernels.py COMMAND --help` for each command's options and examples.
"""


def _examples(*lines: str) -> str:
    """A command epilog that click prints as written (\\b stops rewrapping)."""
    return "\b\nExamples:\n" + "\n".join(f"  {ln}" for ln in lines)


class DefaultGroup(click.Group):
    """A group whose command defaults to `build`: `build_kernels.py --force` builds."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0].startswith("-") and args[0] not in ("--help", "-h")):
            args = ["build", *args]
        return super().parse_args(ctx, args)


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _say(message: str) -> None:
    click.echo(f"note: {message}", err=True)


def _check_lock_timeout(seconds: float) -> None:
    if not seconds >= 0:  # also NaN
        _fail(f"--lock-timeout must be a number of seconds >= 0, but got {seconds:g}", 2)


def _default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@click.group(cls=DefaultGroup, epilog=EPILOG, context_settings={"max_content_width": 100})
def main() -> None:
    """Ahead-of-time NVFP4 grouped-GEMM artifact builder (default command: build)."""


class _Progress:
    """A progress bar on a terminal, one line per finished kernel otherwise (CI logs)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.bar: Any = None
        self.todo = self.done = 0

    def plan(self, todo: int, reused: int) -> None:
        self.todo = todo
        if not todo:
            return
        click.echo(f"compiling {todo} kernel(s), reusing {reused}", err=True)
        if self.tty:
            self.bar = click.progressbar(length=todo, label="compiling", file=sys.stderr,
                                         show_pos=True, item_show_func=lambda s: s)
            self.bar.__enter__()

    def result(self, r: Any) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1, r.item.name)
            return
        what = (f"compiled in {r.compile_seconds:.1f} s" if r.ok
                else f"FAILED ({(r.error or {}).get('type')})")
        click.echo(f"[{self.done}/{self.todo}] {r.item.name}: {what}", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


@main.command(short_help="Compile shapes.yaml into cubins + manifest.json.",
              epilog=_examples("python build_kernels.py build",
                               "python build_kernels.py build -j 8 --force",
                               "python build_kernels.py build --only moe_down --out /tmp/moe",
                               "python build_kernels.py build --shard 0/2 --out shard0"))
@click.option("--spec", "spec_path", default="shapes.yaml", show_default=True,
              type=click.Path(dir_okay=False), help="Shape sets to build.")
@click.option("--out", default="artifacts", show_default=True, type=click.Path(file_okay=False),
              help="Artifact directory; replaced atomically. A full build leaves exactly the "
                   "spec's kernels; a selective one (--only, --shard) is refused if it holds "
                   "kernels outside the selection (exit 2), so it never deletes any.")
@click.option("--jobs", "-j", default=_default_jobs(), show_default="CPU count", type=int,
              help="Worker subprocesses at once (one arch each; an arch is split when N is "
                   "larger than the number of archs).")
@click.option("--shard", default=None, metavar="I/N",
              help="Build only shard I of N (0-based) of the sorted kernel list.")
@click.option("--force", is_flag=True, help="Recompile every kernel, reusing nothing.")
@click.option("--only", multiple=True, metavar="SET", help="Build only this set (repeatable).")
@click.option("--keep-going", is_flag=True,
              help="Compile every kernel even after one fails (default: stop at the first).")
@click.option("--lock-timeout", default=300.0, show_default=True, type=float,
              help="Seconds to wait for another build writing the same --out.")
def build(spec_path: str, out: str, jobs: int, shard: str | None, force: bool,
          only: tuple[str, ...], keep_going: bool, lock_timeout: float) -> None:
    """Compile shapes.yaml into cubins + manifest.json (incremental, atomic)."""
    from builder.build import BuildFailed
    from builder.build import build as run_build
    from builder.families import load_families
    from builder.plan import expand, expand_quantizers, parse_shard
    from builder.plan import shard as take_shard
    from builder.report import summary_table
    from builder.selection import Selection, SelectionError, spec_fingerprint
    from builder.spec import load_spec

    if jobs < 1:
        _fail(f"--jobs must be >= 1, but got {jobs}", 2)
    _check_lock_timeout(lock_timeout)
    try:
        index_count = parse_shard(shard) if shard is not None else None
    except ValueError as exc:
        _fail(str(exc), 2)
    try:
        families = load_families()
        spec = load_spec(spec_path, families)
    except SpecError as exc:
        _fail(str(exc), 2)
    except BuilderError as exc:
        _fail(str(exc), 1)
    unknown = [s for s in only if s not in spec.set_names()]
    if unknown:
        _fail(f"--only must name sets of {spec_path}, but got {unknown}; sets: "
              f"{', '.join(spec.set_names())}", 2)
    every = expand(spec, families)
    items = [it for it in every if not only or it.set in only]
    if index_count is not None:
        items = take_shard(items, *index_count)
    selection = Selection(spec_fingerprint(every), index_count, tuple(only))

    progress = _Progress()
    try:
        report = run_build(items, Path(out), families, jobs=jobs, force=force,
                           keep_going=keep_going, lock_timeout=lock_timeout,
                           on_result=progress.result, on_plan=progress.plan,
                           selection=selection, on_lock_wait=_say,
                           quantizers=expand_quantizers(spec, families))
    except SelectionError as exc:
        progress.close()
        _fail(str(exc), 2)
    except BuildFailed as exc:
        progress.close()
        _fail(str(exc), 1)
    except BuilderError as exc:
        progress.close()
        _fail(str(exc), 1)
    progress.close()
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    if report.rows:
        click.echo(summary_table(report.rows))
    compiled = sum(r.status == "compiled" for r in report.rows)
    reused = sum(r.status == "reused" for r in report.rows)
    state = "written" if report.changed else "already up to date"
    if report.quantizers:
        click.echo("activation quantizers: " + ", ".join(
            f"{name} ({'reused' if s is None else f'compiled in {s:.1f} s'})"
            for name, s in report.quantizers))
    click.echo(f"{out}: {len(report.rows)} kernel(s), {compiled} compiled, "
               f"{len(report.rows) - compiled - reused} shared, {reused} reused; {state}")


ARTIFACTS_HELP = ("Artifact directory, or pkg:NAME for an installed artifact package "
                  "(see `package`).")


def _open_manifest(directory: str) -> Any:
    from runtime.errors import ManifestError
    from runtime.manifest import load_manifest
    from runtime.packages import resolve

    try:
        path = resolve(directory)
        return path, load_manifest(path)
    except ManifestError as exc:
        _fail(str(exc), 1)


@main.command(name="list", short_help="List the kernels of an artifact directory.",
              epilog=_examples("python build_kernels.py list",
                               "python build_kernels.py list /tmp/moe --json | jq '.[].kernel'",
                               "python build_kernels.py list pkg:moe      (an installed package)"))
@click.argument("directory", default="artifacts", metavar="[DIR]")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON (one object per kernel: kernel, arch, acc, symbol, cubin_kib, "
                   "smem, groups) instead of a table.")
def list_cmd(directory: str, as_json: bool) -> None:
    """List the kernels of DIR (default: artifacts): what each serves, its symbol and its
    resources (block, cluster, shared memory, cubin size, sha256 prefix, parameters)."""
    from builder.report import list_rows, list_table

    _, manifest = _open_manifest(directory)
    if as_json:
        click.echo(json.dumps(list_rows(manifest.sets), indent=1))
    else:
        click.echo(list_table(manifest.sets))


@main.command(short_help="Show kernels in full: what they serve, launch ABI, resources.",
              epilog=_examples("python build_kernels.py inspect moe_down.sm_90a.acc1.f16",
                               "python build_kernels.py inspect moe_down      (every kernel of a "
                               "set)",
                               "python build_kernels.py inspect '*.sm_90a.*' --artifacts /tmp/moe",
                               "python build_kernels.py inspect dense_a.sm_90a.acc1.f16 --json"))
@click.argument("kernel")
@click.option("--artifacts", "directory", default="artifacts", show_default=True,
              help=ARTIFACTS_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list of the full manifest entries (plus served, param_bytes).")
def inspect(kernel: str, directory: str, as_json: bool) -> None:
    """Show KERNEL: a kernel name, a set name (all its kernels) or a glob pattern.

    Prints what it serves, its symbol, options, resources (block, cluster, dynamic shared
    memory, grid policy, cubin size and sha256) and its launch ABI: each parameter's name,
    kind, offset, size, alignment and how the runtime fills it, and for TMA templates the
    cuTensorMapEncodeTiled geometry (dtype, box, swizzle, ...).
    """
    import fnmatch

    from builder.report import inspect_dict, inspect_text

    path, manifest = _open_manifest(directory)
    found = [e for e in manifest.sets if e.name == kernel]
    found = found or [e for e in manifest.sets if e.set == kernel]
    found = found or [e for e in manifest.sets if fnmatch.fnmatchcase(e.name, kernel)]
    if not found:
        _fail(f"KERNEL must name a kernel, a set or a pattern matching kernels of {path}, but "
              f"got {kernel!r}; kernels: {', '.join(e.name for e in manifest.sets)}", 2)
    if as_json:
        click.echo(json.dumps([inspect_dict(e, str(path)) for e in found], indent=1))
    else:
        click.echo("\n\n".join(inspect_text(e, str(path)) for e in found))


@main.command(short_help="Re-check an artifact directory.",
              epilog=_examples("python build_kernels.py verify artifacts",
                               "Exit code 1 and one line per problem when anything is off."))
@click.argument("directory", type=click.Path(file_okay=False))
def verify(directory: str) -> None:
    """Re-check schema, sha256, ELF arch and symbol of every cubin, and stray files."""
    from builder.verify import verify_dir

    problems = verify_dir(Path(directory))
    if problems:
        click.echo(f"{directory}: {len(problems)} problem(s):", err=True)
        for p in problems:
            click.echo(f"  {p}", err=True)
        sys.exit(1)
    from runtime.manifest import load_manifest

    m = load_manifest(directory)
    click.echo(f"{directory}: ok ({len(m.sets)} kernel(s) served by {len(m.kernels)} cubin(s); "
               "every cubin matches its sha256, arch and symbol)")


@main.command(short_help="Combine shard artifact directories into one.",
              epilog=_examples("python build_kernels.py build --shard 0/2 --out shard0",
                               "python build_kernels.py build --shard 1/2 --out shard1",
                               "python build_kernels.py merge artifacts shard0 shard1"))
@click.argument("out", type=click.Path(file_okay=False))
@click.argument("dirs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--lock-timeout", default=300.0, show_default=True, type=float,
              help="Seconds to wait for another build or merge writing the same OUT.")
def merge(out: str, dirs: tuple[str, ...], lock_timeout: float) -> None:
    """Combine shard artifact directories DIRS into OUT."""
    from builder.build import merge as run_merge

    _check_lock_timeout(lock_timeout)
    try:
        manifest = run_merge(Path(out), [Path(d) for d in dirs], lock_timeout, on_lock_wait=_say)
    except BuilderError as exc:
        _fail(str(exc), 1)
    click.echo(f"{out}: merged {len(manifest.sets)} kernel(s) from {len(dirs)} director"
               f"{'y' if len(dirs) == 1 else 'ies'}")


@main.command(short_help="Turn an artifact directory into an installable wheel.",
              epilog=_examples(
                  "python build_kernels.py package artifacts --out dist --name moe",
                  "python build_kernels.py package artifacts --arch sm_90a --version 1.2.0",
                  "pip install --no-index --no-deps dist/nvfp4_artifacts_moe-*.whl",
                  "python -c \"import runtime; gg = runtime.load('pkg:moe')\"",
                  "python -m runtime.packages --verify        (list installed packages)"))
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.option("--out", default="dist", show_default=True, type=click.Path(file_okay=False),
              help="Directory to write the wheel into.")
@click.option("--name", default="default", show_default=True,
              help="Package name: distribution nvfp4-artifacts-NAME, import package "
                   "nvfp4_artifacts_NAME, loaded as runtime.load('pkg:NAME').")
@click.option("--version", "version", default=None, show_default="the runtime's version",
              help="Wheel version (PEP 440).")
@click.option("--arch", "archs", multiple=True, metavar="ARCH",
              help="Package only this arch's kernels (repeatable), e.g. sm_90a for a Hopper host.")
def package(directory: str, out: str, name: str, version: str | None,
            archs: tuple[str, ...]) -> None:
    """Turn artifact DIRECTORY into a wheel nvfp4_artifacts_NAME-VERSION-py3-none-any.whl.

    The directory must verify first. The wheel holds manifest.json, the cubins and a
    package.json that locks it to this runtime's manifest schema; an entry point in group
    nvfp4_grouped_gemm.artifacts lets the runtime find it once installed, with no path.
    Written with the standard library only; reproducible (same artifacts, same bytes).
    """
    from builder.package import PackageError, PackageUsageError, build_wheel
    from runtime.packages import ENTRY_POINT_GROUP

    try:
        r = build_wheel(directory, out, name=name, version=version, archs=archs)
    except PackageUsageError as exc:
        _fail(str(exc), 2)
    except (PackageError, BuilderError) as exc:
        _fail(str(exc), 1)
    click.echo(f"{r.wheel}: {len(r.kernels)} kernel(s), {r.bytes / 2**20:.2f} MiB "
               f"(distribution {r.distribution} {r.version}, entry point "
               f"{ENTRY_POINT_GROUP}:{r.name})")
    click.echo(f"  install: pip install --no-index --no-deps {r.wheel}")
    click.echo(f"  load:    runtime.load(\"pkg:{r.name}\")")


if __name__ == "__main__":
    main()
