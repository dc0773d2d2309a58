"""Which kernel family builds each arch, and the family's config type (no DSL import here)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any

from kernels.sm90 import config as sm90_config
from kernels.sm100 import config as sm100_config


@dataclass(frozen=True)
class Family:
    name: str  # "sm90", "sm100"
    config: ModuleType  # has Config (frozen dataclass), ACC_STAGES, K_TILE, check()
    compile_module: str  # imported in the build worker only: it imports cutlass

    def option_names(self) -> tuple[str, ...]:
        """Tile options a shapes.yaml set may override (acc_stages has its own key)."""
        return tuple(f.name for f in fields(self.config.Config) if f.name != "acc_stages")

    def make_config(self, acc_stages: int, options: dict[str, Any]) -> Any:
        return self.config.Config(acc_stages=acc_stages, **options)

    def compiler(self) -> ModuleType:
        return importlib.import_module(self.compile_module)


FAMILIES: dict[str, Family] = {
    "sm_90a": Family("sm90", sm90_config, "kernels.sm90.grouped_gemm"),
    "sm_100a": Family("sm100", sm100_config, "kernels.sm100.grouped_gemm"),
}


def family_for(arch: str) -> Family:
    try:
        return FAMILIES[arch]
    except KeyError:
        raise ValueError(f"arch must be one of {sorted(FAMILIES)}, but got {arch!r}") from None
