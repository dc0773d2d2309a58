"""Kernel selection: (device arch, output dtype, per-group problem shapes) -> manifest entry.

Indexed once at load, so a call is one dict lookup. The most specialized variant wins
(style.md item 9): an exact-shape kernel first, then a dynamic-m kernel if the manifest has one.
When nothing serves the call the error lists every built kernel, so the caller sees what to add
to shapes.yaml.

What an entry serves is its `constraints` record:
- exact shapes: {"groups": [[m, n, k], ...], ...}: exactly that (m, n, k) list;
- dynamic m (a shapes.yaml set with `m: dynamic`):
  {"dynamic_m": {"groups": [[n, k], ...], "max_m": int or null}, ...}: every call with that
  (n, k) list, in that order, and any m >= 0 per group (m = 0 included), up to max_m when it is
  not null. The kernels themselves need no bound on m except m * n < 2^31 (32-bit C offsets),
  which is checked here for every dynamic-m call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import InputError, ManifestError, NoKernelError
from .manifest import ARCH_CAPABILITY, KernelEntry

Shape = tuple[int, int, int]
MN_LIMIT = 2**31  # the kernels index C with 32-bit offsets
_DYNAMIC_FORM = '{"groups": [[n, k], ...], "max_m": int or null}'


def arch_for_capability(capability: tuple[int, int]) -> str | None:
    """The arch whose cubins run on a device of this compute capability ('a' targets are exact)."""
    for arch, cap in ARCH_CAPABILITY.items():
        if cap == tuple(capability):
            return arch
    return None


def _int_rows(entry: KernelEntry, groups: Any, width: int,
              where: str) -> tuple[tuple[int, ...], ...]:
    if not isinstance(groups, list) or not groups:
        raise ManifestError(f"kernel {entry.name!r}: {where} must be a non-empty list, "
                            f"but got {groups!r}")
    rows = []
    for i, g in enumerate(groups):
        if (not isinstance(g, list) or len(g) != width
                or any(isinstance(v, bool) or not isinstance(v, int) for v in g)):
            raise ManifestError(f"kernel {entry.name!r}: {where}[{i}] must be a list of "
                                f"{width} ints, but got {g!r}")
        rows.append(tuple(g))
    return tuple(rows)


def exact_groups(entry: KernelEntry) -> tuple[Shape, ...]:
    """The (m, n, k) list an exact-shape entry serves."""
    return _int_rows(entry, entry.constraints.get("groups"), 3,  # type: ignore[return-value]
                     "constraints.groups")


def dynamic_groups(entry: KernelEntry) -> tuple[tuple[tuple[int, int], ...], int | None] | None:
    """((n, k) per group, max_m) of a dynamic-m entry; None for an exact-shape entry."""
    c = entry.constraints
    if "dynamic_m" not in c:
        return None
    dyn = c["dynamic_m"]
    if not isinstance(dyn, dict) or "groups" not in dyn:
        raise ManifestError(f"kernel {entry.name!r}: constraints.dynamic_m must be an object "
                            f"{_DYNAMIC_FORM}, but got {dyn!r}")
    if "groups" in c:
        raise ManifestError(f"kernel {entry.name!r}: constraints must have either groups "
                            "(exact shapes) or dynamic_m, not both")
    rows = _int_rows(entry, dyn["groups"], 2, "constraints.dynamic_m.groups")
    for i, (n, k) in enumerate(rows):
        if n <= 0 or k <= 0:
            raise ManifestError(f"kernel {entry.name!r}: constraints.dynamic_m.groups[{i}] must "
                                f"have n, k > 0, but got {[n, k]}")
    max_m = dyn.get("max_m")
    if max_m is not None and (isinstance(max_m, bool) or not isinstance(max_m, int)
                              or max_m < 1):
        raise ManifestError(f"kernel {entry.name!r}: constraints.dynamic_m.max_m must be a "
                            f"positive int or null, but got {max_m!r}")
    return rows, max_m  # type: ignore[return-value]


def check_mn(shapes: tuple[Shape, ...]) -> None:
    """m * n < 2^31 per group (exact sets are checked when shapes.yaml is read)."""
    for g, (m, n, _) in enumerate(shapes):
        if m * n >= MN_LIMIT:
            raise InputError(f"a_list[{g}].shape[0] (m) must keep m * n < 2^31 (the kernels "
                             f"index C with 32-bit offsets; n = {n}), but got {m}")


class KernelIndex:
    """Built kernels indexed by (arch, shapes) for exact sets and (arch, (n, k)s) for dynamic m."""

    def __init__(self, kernels: Sequence[KernelEntry]) -> None:
        self.kernels = tuple(kernels)
        self._exact: dict[tuple[str, str, tuple[Shape, ...]], KernelEntry] = {}
        self._dynamic: dict[tuple[str, str, tuple[tuple[int, int], ...]],
                            list[tuple[KernelEntry, int | None]]] = {}
        for e in self.kernels:
            dyn = dynamic_groups(e)
            if dyn is not None:
                nk, max_m = dyn
                self._dynamic.setdefault((e.arch, e.out_dtype, nk), []).append((e, max_m))
            else:
                # First entry wins on duplicates: manifest order is deterministic.
                self._exact.setdefault((e.arch, e.out_dtype, exact_groups(e)), e)

    def select(self, shapes: tuple[Shape, ...], arch: str | None, device: str = "",
               out_dtype: str = "float16") -> KernelEntry:
        """The kernel for `shapes` ((m, n, k) per group) writing `out_dtype` (a manifest
        OUT_DTYPES name) on a device of `arch`.

        Exact-shape kernels first; then the first dynamic-m kernel (manifest order) with the
        call's (n, k) list whose max_m, if any, covers every m. Raises InputError when such a
        kernel is found but some m * n reaches 2^31, NoKernelError when none is.
        """
        entry = self._exact.get((arch, out_dtype, shapes)) if arch else None
        if entry is not None:
            return entry
        if arch and self._dynamic:
            nk = tuple((n, k) for _, n, k in shapes)
            for e, limit in self._dynamic.get((arch, out_dtype, nk), ()):
                if limit is None or all(m <= limit for m, _, _ in shapes):
                    check_mn(shapes)
                    return e
        raise NoKernelError(self.describe_miss(shapes, arch, device, out_dtype))

    def describe_miss(self, shapes: tuple[Shape, ...], arch: str | None, device: str,
                      out_dtype: str = "float16") -> str:
        where = device or "this device"
        target = arch or "an arch no kernel family targets"
        lines = [
            f"no built kernel serves {len(shapes)} group(s) with (m, n, k) = {list(shapes)} and "
            f"{out_dtype} output on {where} ({target}); nothing was launched.",
        ]
        nk = tuple((n, k) for _, n, k in shapes)
        others = sorted({e.out_dtype for e in self.kernels if e.arch == arch
                         and e.out_dtype != out_dtype
                         and (self._exact.get((arch, e.out_dtype, shapes)) is e
                              or any(d is e for d, _ in
                                     self._dynamic.get((arch, e.out_dtype, nk), ())))})
        if others:
            lines.append(f"These shapes are built for {' and '.join(others)} output only: pass "
                         f"out_dtype (or out tensors) of that type, or add {out_dtype} to the "
                         f"set's out_dtypes in shapes.yaml and rebuild.")
        for e, limit in self._dynamic.get((arch, out_dtype, nk), ()):
            over = [(g, m) for g, (m, _, _) in enumerate(shapes) if limit is not None and m > limit]
            lines.append(f"Kernel {e.name} has these (n, k) but serves m <= {limit} only; "
                         f"(group, m) over it: {over}.")
        lines.append(f"Built kernels ({len(self.kernels)}):")
        for e in self.kernels:
            lines.append(f"  - set {e.set!r} {e.arch} {e.out_dtype} ({e.name}): {served(e)}")
        if not self.kernels:
            lines.append("  (none: the manifest is empty)")
        lines.append("Add the shapes to shapes.yaml and rebuild, or call with built shapes.")
        return "\n".join(lines)


def served(e: KernelEntry) -> str:
    """What an entry serves, in words (for errors and listings)."""
    try:
        dyn = dynamic_groups(e)
    except ManifestError:
        return f"constraints {e.constraints!r}"
    if dyn is not None:
        nk, bound = dyn
        return f"any m{f' <= {bound}' if bound is not None else ''}, (n, k) = {list(nk)}"
    groups: Any = e.constraints.get("groups")
    if isinstance(groups, list):
        return f"(m, n, k) = {[tuple(g) for g in groups]}"
    return f"groups {groups!r}"
