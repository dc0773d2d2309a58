"""Serve-time runtime for ahead-of-time built NVFP4 grouped GEMM kernels.

    import runtime
    gg = runtime.load("artifacts")
    out = gg.grouped_gemm(a_list, b_list, sfa_list, sfb_list)
    step = gg.bind(a_list, b_list, sfa_list, sfb_list, out)   # serving loops: checks once
    step()                                                     # launches, no per-call checks

Importing this package is cheap: it loads neither torch nor cuda.bindings (the builder imports
`runtime.manifest` too); `load` and `GroupedGemm` import them on first access. It never
imports `cutlass` and never compiles anything.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    ArtifactError,
    CudaError,
    DeviceError,
    InputError,
    ManifestError,
    NoKernelError,
    Nvfp4Error,
)

__all__ = [
    "ArtifactError",
    "BoundGemm",
    "CudaError",
    "DeviceError",
    "GroupedGemm",
    "InputError",
    "ManifestError",
    "NoKernelError",
    "Nvfp4Error",
    "load",
]


def __getattr__(name: str) -> Any:
    # PEP 562: defer torch (about 1 s to import) until the API is actually used.
    if name in ("load", "GroupedGemm", "BoundGemm"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
