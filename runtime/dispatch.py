"""Kernel selection: (device arch, per-group problem shapes) -> manifest entry.

Indexed once at load, so a call is one dict lookup. The most specialized variant wins
(style.md item 9): an exact-shape kernel first, then a dynamic-m kernel (groups declared as
(n, k) with m left to run time) if the manifest has one. When nothing serves the call the error
lists every built kernel, so the caller sees what to add to shapes.yaml.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import ManifestError, NoKernelError
from .manifest import ARCH_CAPABILITY, KernelEntry

Shape = tuple[int, int, int]


def arch_for_capability(capability: tuple[int, int]) -> str | None:
    """The arch whose cubins run on a device of this compute capability ('a' targets are exact)."""
    for arch, cap in ARCH_CAPABILITY.items():
        if cap == tuple(capability):
            return arch
    return None


def _int_rows(entry: KernelEntry, width: int) -> tuple[tuple[int, ...], ...]:
    groups = entry.constraints.get("groups")
    if not isinstance(groups, list) or not groups:
        raise ManifestError(f"kernel {entry.name!r}: constraints.groups must be a non-empty list, "
                            f"but got {groups!r}")
    rows = []
    for i, g in enumerate(groups):
        if (not isinstance(g, list) or len(g) != width
                or any(isinstance(v, bool) or not isinstance(v, int) for v in g)):
            raise ManifestError(f"kernel {entry.name!r}: constraints.groups[{i}] must be a list of "
                                f"{width} ints, but got {g!r}")
        rows.append(tuple(g))
    return tuple(rows)


def _max_m(entry: KernelEntry) -> int | None:
    value = entry.constraints.get("max_m")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ManifestError(f"kernel {entry.name!r}: constraints.max_m must be an int, "
                            f"but got {value!r}")
    return value


class KernelIndex:
    """Built kernels indexed by (arch, shapes) for exact sets and (arch, (n, k)s) for dynamic m."""

    def __init__(self, kernels: Sequence[KernelEntry]) -> None:
        self.kernels = tuple(kernels)
        self._exact: dict[tuple[str, tuple[Shape, ...]], KernelEntry] = {}
        self._dynamic: dict[tuple[str, tuple[tuple[int, int], ...]], list[KernelEntry]] = {}
        for e in self.kernels:
            if e.constraints.get("dynamic_m"):
                nk = _int_rows(e, 2)
                _max_m(e)
                self._dynamic.setdefault((e.arch, nk), []).append(e)
            else:
                # First entry wins on duplicates: manifest order is deterministic.
                self._exact.setdefault((e.arch, _int_rows(e, 3)), e)  # type: ignore[arg-type]

    def select(self, shapes: tuple[Shape, ...], arch: str | None, device: str = "") -> KernelEntry:
        """The kernel for `shapes` ((m, n, k) per group) on a device of `arch`."""
        entry = self._exact.get((arch, shapes)) if arch else None
        if entry is not None:
            return entry
        if arch:
            for e in self._dynamic.get((arch, tuple((n, k) for _, n, k in shapes)), ()):
                limit = _max_m(e)
                if limit is None or all(m <= limit for m, _, _ in shapes):
                    return e
        raise NoKernelError(self.describe_miss(shapes, arch, device))

    def describe_miss(self, shapes: tuple[Shape, ...], arch: str | None, device: str) -> str:
        where = device or "this device"
        target = arch or "an arch no kernel family targets"
        lines = [
            f"no built kernel serves {len(shapes)} group(s) with (m, n, k) = {list(shapes)} on "
            f"{where} ({target}); nothing was launched.",
            f"Built kernels ({len(self.kernels)}):",
        ]
        for e in self.kernels:
            lines.append(f"  - set {e.set!r} {e.arch} ({e.name}): {_served(e)}")
        if not self.kernels:
            lines.append("  (none: the manifest is empty)")
        lines.append("Add the shapes to shapes.yaml and rebuild, or call with built shapes.")
        return "\n".join(lines)


def _served(e: KernelEntry) -> str:
    groups: Any = e.constraints.get("groups")
    if e.constraints.get("dynamic_m"):
        bound = e.constraints.get("max_m")
        pairs = [tuple(g) for g in groups] if isinstance(groups, list) else groups
        return f"any m{f' <= {bound}' if bound is not None else ''}, (n, k) = {pairs}"
    if isinstance(groups, list):
        return f"(m, n, k) = {[tuple(g) for g in groups]}"
    return f"groups {groups!r}"
