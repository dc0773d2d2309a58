"""Plain-text tables for the CLI: the build summary and `list`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.manifest import KernelEntry

from .build import Row


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to width; numbers right-aligned, text left-aligned."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [bool(rows) and all(_is_number(r[i]) for r in rows) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(r, widths, numeric, strict=True)).rstrip()

    out = [line(cells[0]), line(["-" * w for w in widths])]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def _is_number(v: Any) -> bool:
    if isinstance(v, (int, float)):
        return True
    return isinstance(v, str) and (v == "-" or v.replace(".", "", 1).isdigit())


def kib(n: int) -> str:
    return f"{n / 1024:.1f}"


def summary_table(rows: list[Row]) -> str:
    return table(
        ["kernel", "arch", "acc", "cubin KiB", "smem KiB", "compile s", "status"],
        [[r.name, r.arch, r.acc_stages, kib(r.cubin_bytes), kib(r.dynamic_smem),
          "-" if r.compile_seconds is None else f"{r.compile_seconds:.2f}", r.status]
         for r in rows])


def served_groups(constraints: dict[str, Any]) -> str:
    """'8: m 64..248, n 4096, k 7168' when n and k are shared, else every (m, n, k)."""
    groups = constraints.get("groups")
    if not groups:
        return "-"
    ms = [g[0] for g in groups]
    nks = {(g[1], g[2]) for g in groups}
    if len(nks) == 1:
        (n, k), = nks
        m = f"{min(ms)}..{max(ms)}" if len(set(ms)) > 1 else str(ms[0])
        return f"{len(groups)}: m {m}, n {n}, k {k}"
    return f"{len(groups)}: " + ", ".join(f"{m}x{n}x{k}" for m, n, k in groups)


def list_rows(kernels: Sequence[KernelEntry]) -> list[dict[str, Any]]:
    return [{"kernel": e.name, "arch": e.arch, "acc": e.acc_stages, "symbol": e.symbol,
             "cubin_kib": round(e.cubin_bytes / 1024, 1), "smem": e.dynamic_smem,
             "groups": served_groups(e.constraints)} for e in kernels]


def list_table(kernels: Sequence[KernelEntry]) -> str:
    rows = list_rows(kernels)
    return table(["kernel", "arch", "acc", "symbol", "cubin KiB", "smem", "served groups"],
                 [[r["kernel"], r["arch"], r["acc"], r["symbol"], f"{r['cubin_kib']:.1f}",
                   r["smem"], r["groups"]] for r in rows])
