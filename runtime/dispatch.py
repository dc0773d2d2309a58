"""Kernel selection: (device arch, output dtype, per-group problem shapes) -> manifest entry.

Indexed once at load, so a call is one dict lookup. The most specialized variant wins
(style.md item 9): an exact-shape kernel first, then a dynamic-m kernel if the manifest has one.
When nothing serves the call the error lists every built kernel, so the caller sees what to add
to shapes.yaml.

The candidates are the manifest's set entries (schema 2: one per (set, arch, acc stages, out
dtype), each pointing at the kernel that serves it). What an entry serves is its `serves`:
- exact shapes: exactly that (m, n, k) list;
- dynamic m (a shapes.yaml set with `m: dynamic`): an (n, k) list and max_m: every call with that
  (n, k) list, in that order, and any m >= 0 per group (m = 0 included), up to max_m when it is
  not null. The kernels themselves need no bound on m except m * n < 2^31 (32-bit C offsets),
  which is checked here for every dynamic-m call.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import InputError, ManifestError, NoKernelError
from .formats import MN_LIMIT
from .manifest import ARCH_CAPABILITY, OUT_DTYPES, KernelEntry

Shape = tuple[int, int, int]


def arch_for_capability(capability: tuple[int, int]) -> str | None:
    """The arch whose cubins run on a device of this compute capability ('a' targets are exact)."""
    for arch, cap in ARCH_CAPABILITY.items():
        if cap == tuple(capability):
            return arch
    return None


def exact_groups(entry: KernelEntry) -> tuple[Shape, ...]:
    """The (m, n, k) list an exact-shape entry serves."""
    if entry.serves.dynamic_m:
        raise ManifestError(f"kernel {entry.name!r} serves dynamic m, not exact shapes")
    return entry.serves.groups  # type: ignore[return-value]


def dynamic_groups(entry: KernelEntry) -> tuple[tuple[tuple[int, int], ...], int | None] | None:
    """((n, k) per group, max_m) of a dynamic-m entry; None for an exact-shape entry."""
    s = entry.serves
    return (s.groups, s.max_m) if s.dynamic_m else None  # type: ignore[return-value]


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
            if e.takes_offsets:
                continue  # scaled_grouped_mm's kernels (runtime/serving.py): no host tables
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
        # The output types some kernel would serve these shapes in (max_m aside).
        others = [d for d in OUT_DTYPES if d != out_dtype and
                  ((arch, d, shapes) in self._exact or (arch, d, nk) in self._dynamic)]
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
    dyn = dynamic_groups(e)
    if dyn is not None and e.takes_offsets:
        return (f"scaled_grouped_mm only: {len(dyn[0])} experts of (n, k) = {dyn[0][0]}, "
                "offsets on the device")
    if dyn is not None:
        nk, bound = dyn
        return f"any m{f' <= {bound}' if bound is not None else ''}, (n, k) = {list(nk)}"
    return f"(m, n, k) = {list(e.serves.groups)}"
