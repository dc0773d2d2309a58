"""Plain-text tables for the CLI: the build summary, `list` and `inspect`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from runtime.manifest import KernelEntry, Param

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
    """'8: m 64..248, n 4096, k 7168' when n and k are shared, else every (m, n, k); for a
    dynamic-m kernel '8: any m <= 4096, n 4096, k 7168' or every (n, k)."""
    dyn = constraints.get("dynamic_m")
    if isinstance(dyn, dict) and dyn.get("groups"):
        nks = dyn["groups"]
        m = "any m" + (f" <= {dyn['max_m']}" if dyn.get("max_m") is not None else "")
        if len({tuple(g) for g in nks}) == 1:
            return f"{len(nks)}: {m}, n {nks[0][0]}, k {nks[0][1]}"
        return f"{len(nks)}: {m}, " + ", ".join(f"{n}x{k}" for n, k in nks)
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


def dims(v: Sequence[int]) -> str:
    return "x".join(str(int(x)) for x in v)


def list_table(kernels: Sequence[KernelEntry]) -> str:
    """One line per kernel: what it serves, its symbol and its resources."""
    return table(["kernel", "arch", "acc", "symbol", "block", "cluster", "smem KiB", "cubin KiB",
                  "sha256", "params", "served groups"],
                 [[e.name, e.arch, e.acc_stages, e.symbol, dims(e.block), dims(e.cluster),
                   kib(e.dynamic_smem), kib(e.cubin_bytes), e.sha256[:12],
                   f"{len(e.params)} ({e.param_bytes} B)", served_groups(e.constraints)]
                  for e in kernels])


# --------------------------------------------------------------------------------------------
# inspect: one kernel in full
# --------------------------------------------------------------------------------------------


def _fills(p: Param) -> str:
    """How the runtime fills a parameter, in words."""
    if p.kind == "table":
        return f"pointer to the {p.table} table"
    if p.kind == "tma_template":
        return f"CUtensorMap template for operand {p.operand} (grid constant)"
    if p.kind == "scalar":
        return f"scalar {p.value}"
    if p.kind == "operand":
        return f"device address of the call's {p.operand}"
    return f"{p.size} zero bytes" if p.kind == "zeros" else p.kind


def _limits(constraints: dict[str, Any]) -> str:
    rest = {k: v for k, v in constraints.items() if k not in ("groups", "dynamic_m")}
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(rest.items()))


def _group_list(constraints: dict[str, Any]) -> str:
    dyn = constraints.get("dynamic_m")
    if isinstance(dyn, dict):
        return ", ".join(f"(m, {n}, {k})" for n, k in dyn.get("groups") or [])
    return ", ".join(f"{m}x{n}x{k}" for m, n, k in constraints.get("groups") or [])


def inspect_dict(e: KernelEntry, artifact_dir: str) -> dict[str, Any]:
    """The manifest entry as JSON, with the directory, what it serves and its parameter bytes."""
    return {"artifacts": artifact_dir, **e.record(), "kernel": e.kernel.record(),
            "served": served_groups(e.constraints), "param_bytes": e.param_bytes}


def inspect_text(e: KernelEntry, artifact_dir: str) -> str:
    grid_text = ", ".join(f"{k} {v}" for k, v in sorted(e.grid.record().items())) or "-"
    tile = dims(e.tile.record().values()) or "-"
    options = " ".join(f"{k}={v}" for k, v in sorted(e.options.items())) or "-"
    sms = "read at run time" if e.sm_count is None else f"{e.sm_count} (baked in)"
    head = [
        ("kernel", e.name),
        ("serves", served_groups(e.constraints)
         + (f" ({_limits(e.constraints)})" if _limits(e.constraints) else "")),
        ("groups", _group_list(e.constraints) or "-"),
        ("set", f"{e.set}, arch {e.arch}, family {e.family}, acc stages {e.acc_stages}"),
        ("options", options),
        ("symbol", e.symbol),
        ("block", f"{dims(e.block)}, cluster {dims(e.cluster)}"),
        ("smem", f"{kib(e.dynamic_smem)} KiB dynamic ({e.dynamic_smem} B)"),
        ("grid", f"{grid_text}; output tile {tile}; SM count {sms}"),
        ("cubin", f"{artifact_dir}/{e.cubin}, {kib(e.cubin_bytes)} KiB ({e.cubin_bytes} B), "
                  + f"sha256 {e.sha256[:12]}"),
        ("record", f"kernel {e.kernel.name} (one cubin for every set of its key)"),
        ("key", e.key),
    ]
    width = max(len(k) for k, _ in head)
    out = [f"{k.ljust(width)}  {v}" for k, v in head]
    out += ["", f"launch ABI: {len(e.params)} parameter(s), {e.param_bytes} bytes"]
    out.append(table(["#", "name", "kind", "offset", "size", "align", "filled with"],
                     [[i, p.name, p.kind, p.offset, p.size, p.align, _fills(p)]
                      for i, p in enumerate(e.params)]))
    tma = [p for p in e.params if p.tma is not None]
    if tma:
        out += ["", ("TMA templates (cuTensorMapEncodeTiled; the kernel patches address, dims "
                     "and strides per group):")]
        out.append(table(
            ["param", "operand", "dtype", "box", "elem strides", "swizzle", "interleave", "l2",
             "oob fill", "dims", "strides"],
            [[p.name, p.operand, p.tma.dtype, dims(p.tma.box), dims(p.tma.element_strides),
              p.tma.swizzle, p.tma.interleave, p.tma.l2_promotion, p.tma.oob_fill,
              dims(p.tma.dims), dims(p.tma.strides) or "-"] for p in tma if p.tma]))
    out += ["", "device tables:"]
    out.append(table(["table", "layout"],
                     [[k, json.dumps(v, sort_keys=True)]
                      for k, v in sorted(e.tables.record().items())]))
    return "\n".join(out)
