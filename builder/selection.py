"""What a build covers of its spec, and the two rules that follow (issue 28):

- A selective build (`--only SET`, `--shard I/N`) never deletes kernels from an existing
  artifact directory: if the directory holds a kernel outside the selection, the build is
  refused (exit 2) before anything is compiled and the directory is left as it was. Before,
  `build --only moe_down` replaced artifacts/ with that one set's kernels.
- `merge` takes only shards of one spec, and all of them: every manifest records its spec's
  fingerprint and, for a shard build, its (i, n).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.manifest import Manifest

from .errors import BuilderError, BuildError
from .plan import BuildItem


class SelectionError(BuilderError):
    """A selective build would delete kernels it was not asked to build (exit 2)."""


def spec_fingerprint(items: Iterable[BuildItem]) -> str:
    """sha256 over every set entry's name, kernel key and served shapes of the whole spec
    (before --only and --shard): equal exactly when two builds planned the same set entries,
    served by the same kernels from the same sources. The shapes count on their own since
    manifest schema 2: a kernel's key no longer covers them."""
    rows = sorted((it.name, it.key, it.serves().record()) for it in items)
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Selection:
    spec_fingerprint: str
    shard: tuple[int, int] | None = None
    only: tuple[str, ...] = ()

    @property
    def selective(self) -> bool:
        return self.shard is not None or bool(self.only)

    def describe(self) -> str:
        parts = [f"--only {s}" for s in self.only]
        if self.shard is not None:
            parts.append(f"--shard {self.shard[0]}/{self.shard[1]}")
        return " ".join(parts) or "a full build"


def check_selective(selection: Selection, target: Path, existing: frozenset[str] | None,
                    has_manifest: bool, selected: Sequence[str]) -> None:
    """SelectionError when a selective build into `target` would drop kernels it holds."""
    if not selection.selective:
        return
    fix = ("A selective build never deletes kernels: build into a new --out (then `merge` it "
           "with the rest), or build every set (no --only / --shard)")
    if existing is None and has_manifest:
        raise SelectionError(f"{target} holds a manifest that cannot be read, so "
                             f"{selection.describe()} cannot tell which kernels it would delete; "
                             f"refusing. {fix}")
    extra = sorted((existing or frozenset()) - set(selected))
    if extra:
        shown = ", ".join(extra[:3]) + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
        raise SelectionError(
            f"--out {target} holds {len(extra)} kernel(s) that {selection.describe()} does not "
            f"build ({shown}); refusing, and {target} was left as it was. {fix}")


def check_shards(loaded: Sequence[tuple[Path, Manifest]]) -> tuple[str, None]:
    """(spec fingerprint, shard) of the merged manifest; BuildError unless every input comes
    from one spec and the inputs built as shards are all n shards of one --shard i/n."""
    prints = {m.spec_fingerprint for _, m in loaded}
    if "" in prints:
        old = next(d for d, m in loaded if not m.spec_fingerprint)
        raise BuildError(f"cannot merge {old}: its manifest records no spec fingerprint (built "
                         "before merge checked specs); rebuild it")
    if len(prints) > 1:
        seen = ", ".join(f"{d} has {m.spec_fingerprint[:12]}" for d, m in loaded)
        raise BuildError(f"shards must come from one spec (the same shapes.yaml, sources and DSL), "
                         f"but their spec fingerprints differ: {seen}")
    shards = [(d, m.shard) for d, m in loaded if m.shard is not None]
    counts = {n for _, (_, n) in shards}
    if len(counts) > 1:
        seen = ", ".join(f"{d} is shard {i}/{n}" for d, (i, n) in shards)
        raise BuildError(f"shards must split the spec one way (one N in --shard I/N), but {seen}")
    if counts:
        (n,) = counts
        have = {i for _, (i, _) in shards}
        if len(have) < n:
            # The first few missing, found from the shards present (n is at most MAX_SHARDS).
            missing = [i for i in range(n) if i not in have]
            shown = ", ".join(f"{i}/{n}" for i in missing[:8])
            more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            raise BuildError(f"shards must be all {n} of --shard I/{n}, but {shown}{more} "
                             f"{'is' if len(missing) == 1 else 'are'} missing; pass every shard "
                             "directory")
    return prints.pop() if prints else "", None
