"""Which module provides the kernel families: `kernels.families` unless overridden.

The override (`NVFP4_BUILD_FAMILIES=<module>`, or a parameter) exists so tests can push a tiny
fake family through the real pipeline, worker subprocesses included: the variable is inherited
by every worker, so parent and workers always agree on the families.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BuildError

ENV_FAMILIES = "NVFP4_BUILD_FAMILIES"
DEFAULT_MODULE = "kernels.families"


@dataclass(frozen=True)
class Families:
    module: str  # importable name of the module that defines FAMILIES
    by_arch: dict[str, Any]  # arch -> kernels.families.Family (or a duck-typed stand-in)

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(sorted(self.by_arch))

    def family_for(self, arch: str) -> Any:
        try:
            return self.by_arch[arch]
        except KeyError:
            raise BuildError(f"arch must be one of {list(self.archs)}, but got {arch!r}") from None

    def module_file(self) -> Path:
        return Path(importlib.import_module(self.module).__file__).resolve()


def load_families(module: str | None = None) -> Families:
    """Import the families module (no DSL import: families only name their compile modules)."""
    name = module or os.environ.get(ENV_FAMILIES) or DEFAULT_MODULE
    try:
        mod = importlib.import_module(name)
    except ImportError as exc:
        raise BuildError(f"cannot import the kernel families module {name!r} "
                         f"(set by {ENV_FAMILIES} or the default): {exc}") from exc
    fams = getattr(mod, "FAMILIES", None)
    if not isinstance(fams, dict) or not fams:
        raise BuildError(f"module {name!r} must define FAMILIES as a non-empty dict of arch -> "
                         f"Family, but got {type(fams).__name__}")
    return Families(module=name, by_arch=dict(fams))
