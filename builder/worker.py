"""Build worker: `python -m builder.worker JOB.json` compiles the items of one arch.

The parent starts it with CUTE_DSL_ARCH=<arch> and CUDA_VISIBLE_DEVICES="" already in the
environment: the DSL reads CUTE_DSL_ARCH once, at `import cutlass`, and on a machine with no GPU
silently targets sm_100a when it is unset, so setting it here would be too late. One worker
pays the DSL import (about a second) once for all of its items.

Job file: {"arch", "families", "out_dir", "keep_going", "parent", "items": [BuildItem.to_dict(),
...]}.
Per item it writes `<out_dir>/<name>.cubin` (on success) and `<out_dir>/<name>.json` (always),
then prints the item's name as one JSON line on the protocol channel (the original stdout).
Everything else the compiler prints goes to stderr, so it cannot corrupt that channel.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .artifacts import new_entry, new_kernel, new_quantizer, validate_entry
from .elf import cubin_arch
from .errors import BuildError
from .families import load_families
from .plan import BuildItem, QuantItem, item_from_dict
from .ptx import check_abi

TRACEBACK_LINES = 20
# Exit status of a worker that could not write its results for lack of space (ENOSPC's
# number): the runner reports "no space left on device", not a crash.
EXIT_NO_SPACE = errno.ENOSPC
_PR_SET_PDEATHSIG = 1


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, path)


def check_compiled(ck: Any, item: BuildItem) -> None:
    """What a CompiledKernel must satisfy before it may enter a manifest."""
    if not isinstance(ck.ptx, str) or not ck.ptx:
        raise BuildError(f"compile_kernel must return the PTX as a non-empty str, but got "
                         f"{type(ck.ptx).__name__}")
    for what in ("block", "cluster"):
        dims = tuple(getattr(ck, what))
        if len(dims) != 3 or not all(isinstance(d, int) and d >= 1 for d in dims):
            raise BuildError(f"{what} must be 3 positive ints, but got {dims}")
    check_cubin_symbol(ck.cubin, ck.symbol, item.name, item.arch, "compile_kernel")
    check_abi(list(ck.params), ck.ptx, ck.symbol)


def check_cubin_symbol(cubin: bytes, symbol: Any, name: str, arch: str, who: str) -> None:
    """The cubin `who` (the family's function) returned is non-empty bytes for `arch` and holds
    `symbol` in its string table."""
    if not isinstance(cubin, bytes) or not cubin:
        # The DSL returns a path string, with no error, when the dump directory was missing.
        raise BuildError(f"{who} must return the cubin as non-empty bytes, but got "
                         f"{type(cubin).__name__} {str(cubin)[:80]!r} (a str here usually "
                         "means the DSL dump directory did not exist)")
    if not isinstance(symbol, str) or not symbol:
        raise BuildError(f"{who} must return the kernel symbol as a str, but got "
                         f"{symbol!r}")
    got = cubin_arch(cubin, f"the cubin of {name}")
    if got != arch:  # the DSL targeted another arch: CUTE_DSL_ARCH was set too late
        raise BuildError(f"the cubin of {name} is for {got}, but it was built for "
                         f"{arch} (CUTE_DSL_ARCH must be set before `import cutlass`)")
    if b"\0" + symbol.encode() + b"\0" not in cubin:
        raise BuildError(f"symbol {symbol!r} is not in the cubin's string table")


def check_cubin_abi(entry: Any, cubin: bytes) -> None:
    """The recorded ABI against the parameter list ptxas wrote into the cubin (.nv.info), the
    same check the runtime makes at load and against cuFuncGetParamInfo: the PTX check above
    compares with what the compiler was given, this one with what the driver will see."""
    from runtime.errors import ArtifactError
    from runtime.loader import check_param_layout, cubin_param_layout

    try:
        layout = cubin_param_layout(cubin, entry.symbol)
        if layout is not None:  # None: a synthetic cubin with no sections (fake families)
            check_param_layout(entry, layout)
    except (ValueError, ArtifactError) as exc:
        raise BuildError(f"the cubin of {entry.name} disagrees with its recorded launch ABI: "
                         f"{exc}") from exc


LIMIT_KEYS = ("k_multiple", "n_multiple")


def kernel_limits(item: BuildItem, constraints: Any) -> dict[str, Any]:
    """The kernel's per-group limits from the `constraints` its family recorded, which must
    also hold the (m, n, k) rows it was given as `groups` and nothing else."""
    given = item.compile_groups()
    if not isinstance(constraints, dict) or constraints.get("groups") != given:
        got = constraints.get("groups") if isinstance(constraints, dict) else constraints
        raise BuildError(f"{item.name}: compile_kernel must record the groups it was given as "
                         f"constraints.groups ({given}), but it recorded {got!r}")
    extra = sorted(set(constraints) - {"groups", *LIMIT_KEYS})
    if extra:
        raise BuildError(f"{item.name}: constraints may hold groups and {list(LIMIT_KEYS)} "
                         f"only, but got {extra}")
    return {k: constraints[k] for k in LIMIT_KEYS if k in constraints}


def _compile_kernel(item: BuildItem, family: Any) -> tuple[bytes, dict[str, Any], float]:
    """(cubin, the kernel record's launch facts, compile seconds), checked."""
    compiler = family.compiler()  # first call imports cutlass: not part of compile time
    config = family.make_config(item.acc_stages, item.options_dict(), item.out_dtype)
    start = time.perf_counter()
    ck = compiler.compile_kernel(config, arch=item.arch, groups=item.compile_groups())
    seconds = time.perf_counter() - start
    check_compiled(ck, item)
    # The kernel record's launch facts, as JSON (manifest schema 2). The family's
    # `constraints` hold the groups it was given (checked, then dropped: each set records
    # its own shapes) and the per-group limits.
    kernel = {"symbol": ck.symbol, "params": list(ck.params), "block": list(ck.block),
              "cluster": list(ck.cluster), "dynamic_smem": int(ck.dynamic_smem),
              "grid": ck.grid, "tile": ck.tile, "tables": ck.tables,
              "limits": kernel_limits(item, ck.constraints), "sm_count": ck.sm_count}
    sha256 = hashlib.sha256(ck.cubin).hexdigest()
    # JSON round trip first: the parent sees exactly what the manifest will hold.
    kernel = json.loads(json.dumps(kernel))
    entry = new_entry(item, new_kernel(item, kernel, sha256, len(ck.cubin)))
    validate_entry(entry)
    check_cubin_abi(entry, ck.cubin)
    return ck.cubin, kernel, seconds


def _compile_quantizer(item: QuantItem, family: Any) -> tuple[bytes, dict[str, Any], float]:
    """(cubin, the quantizer record's facts, compile seconds), checked as a kernel's are."""
    if not getattr(family, "quantize_module", None):
        raise BuildError(f"the {item.arch} family {family.name!r} has no quantizers")
    module = importlib.import_module(family.quantize_module)  # imports cutlass
    start = time.perf_counter()
    facts = module.compile_quantizer(item.layout, arch=item.arch)
    seconds = time.perf_counter() - start
    cubin, ptx = facts.pop("cubin"), facts.pop("ptx")
    check_cubin_symbol(cubin, facts.get("symbol"), item.name, item.arch, "compile_quantizer")
    check_abi(list(facts["params"]), ptx, facts["symbol"])
    facts = json.loads(json.dumps(facts))
    check_cubin_abi(new_quantizer(item, facts, hashlib.sha256(cubin).hexdigest(), len(cubin)),
                    cubin)
    return cubin, facts, seconds


def build_one(item: BuildItem | QuantItem, family: Any, out_dir: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"name": item.name, "key": item.key}
    try:
        if family.name != item.family:
            raise BuildError(f"the {item.arch} family must be {item.family!r} as planned, but "
                             f"the worker loaded {family.name!r}")
        compile_item = _compile_quantizer if isinstance(item, QuantItem) else _compile_kernel
        image, kernel, seconds = compile_item(item, family)
        cubin = out_dir / f"{item.name}.cubin"
        cubin.write_bytes(image)
        result.update(ok=True, compile_seconds=round(seconds, 3), cubin=cubin.name,
                      sha256=hashlib.sha256(image).hexdigest(), cubin_bytes=len(image),
                      kernel=kernel)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        result.update(ok=False, error={"type": "NoSpace", "message": "no space left on device "
                                       f"while writing {exc.filename or out_dir}", "traceback": ""})
    except Exception as exc:
        tail = traceback.format_exc().strip().splitlines()[-TRACEBACK_LINES:]
        result.update(ok=False, error={"type": type(exc).__name__, "message": str(exc),
                                       "traceback": "\n".join(tail)})
    return result


def run_job(job: dict[str, Any], proto: Any) -> int:
    arch = job["arch"]
    out_dir = Path(job["out_dir"])
    items = [item_from_dict(d) for d in job["items"]]
    env_arch = os.environ.get("CUTE_DSL_ARCH")
    family = None
    setup_error = None
    if env_arch != arch:
        setup_error = BuildError(f"CUTE_DSL_ARCH must be {arch!r} in the worker's environment "
                                 f"before it starts, but got {env_arch!r}")
    else:
        try:
            family = load_families(job.get("families")).family_for(arch)
        except Exception as exc:
            setup_error = exc
    failed = 0
    for item in items:
        if setup_error is not None:
            result = {"name": item.name, "key": item.key, "ok": False,
                      "error": {"type": type(setup_error).__name__,
                                "message": str(setup_error), "traceback": ""}}
        else:
            result = build_one(item, family, out_dir)
        _write_json(out_dir / f"{item.name}.json", result)
        proto.write(json.dumps({"name": item.name, "ok": result["ok"]}) + "\n")
        proto.flush()
        if not result["ok"]:
            failed += 1
            if not job.get("keep_going", False):
                break
    return 1 if failed else 0


def die_with_parent(parent: int | None) -> None:
    """Ask Linux to SIGTERM this worker when the build that started it dies, even by SIGKILL:
    an orphan would keep compiling into a staging directory the next build deletes."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the parent's cleanup still covers Ctrl-C
        return
    if parent is not None and os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m builder.worker JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    die_with_parent(job.get("parent"))
    # Keep the real stdout for the protocol and point fd 1 at stderr: the DSL and the
    # compilers it embeds may print, from Python or from C.
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    try:
        return run_job(job, proto)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        print(f"no space left on device while writing {exc.filename}", file=sys.stderr)
        return EXIT_NO_SPACE
    finally:
        try:
            proto.close()
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
