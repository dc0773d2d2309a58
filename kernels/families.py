"""Which kernel family builds each arch, and the family's config type (no DSL import here)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any

from kernels.sm90 import config as sm90_config
from kernels.sm100 import config as sm100_config

# Config fields a shapes.yaml set gives through keys of their own, not through `options`.
OWN_KEYS = ("acc_stages", "out_dtype")


@dataclass(frozen=True)
class Family:
    name: str  # "sm90", "sm100"
    config: ModuleType  # has Config (frozen dataclass), ACC_STAGES, K_TILE, K_MULTIPLE, check()
    compile_module: str  # imported in the build worker only: it imports cutlass
    # The activation quantizers of this arch (runtime.manifest.QUANT_LAYOUTS): the module with
    # compile_quantizer(layout, arch=...), imported in the build worker only, and its layouts.
    quantize_module: str | None = None
    quantizer_layouts: tuple[str, ...] = ()

    def option_names(self) -> tuple[str, ...]:
        """Tile options a shapes.yaml set may override (acc_stages and out_dtype have their own
        keys, acc_stages and out_dtypes)."""
        return tuple(f.name for f in fields(self.config.Config) if f.name not in OWN_KEYS)

    def make_config(self, acc_stages: int, options: dict[str, Any],
                    out_dtype: str = "float16") -> Any:
        return self.config.Config(acc_stages=acc_stages, out_dtype=out_dtype, **options)

    def compiler(self) -> ModuleType:
        return importlib.import_module(self.compile_module)


FAMILIES: dict[str, Family] = {
    "sm_90a": Family("sm90", sm90_config, "kernels.sm90.compile", "kernels.sm90.act_quant",
                     ("experts", "masked")),
    "sm_100a": Family("sm100", sm100_config, "kernels.sm100.grouped_gemm"),
}


def family_for(arch: str) -> Family:
    try:
        return FAMILIES[arch]
    except KeyError:
        raise ValueError(f"arch must be one of {sorted(FAMILIES)}, but got {arch!r}") from None
