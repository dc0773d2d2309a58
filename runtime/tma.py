"""TMA descriptor templates: cuTensorMapEncodeTiled from the manifest's recorded geometry.

A template describes a placeholder tensor; the kernel copies it into its tensormap workspace
and patches address, dims and strides per group. So a template is encoded once per
(kernel, device) against a small per-device placeholder allocation, whose address only has to
be a valid, 16-byte aligned device address (the driver checks alignment, not extent).
"""

from __future__ import annotations

import ctypes
from typing import Any

from .errors import ManifestError
from .formats import TENSORMAP_BYTES
from .manifest import TmaGeometry


def _enum(enum_type: Any, prefix: str, name: str, what: str) -> Any:
    member = getattr(enum_type, prefix + name, None)
    if member is None:
        raise ManifestError(
            f"TMA {what} {name!r} is not supported by this cuda.bindings "
            f"({enum_type.__name__} has no {prefix + name}); upgrade cuda-bindings"
        )
    return member


def encode_args(geo: TmaGeometry, address: int) -> tuple[Any, ...]:
    """Positional arguments of cuTensorMapEncodeTiled for `geo` at `address` (no driver call)."""
    from cuda.bindings import driver

    if address % 16:
        raise ValueError(f"a tensor map's global address must be 16-byte aligned, "
                         f"but got {address:#x}")
    rank = len(geo.dims)
    return (
        _enum(driver.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_", geo.dtype, "dtype"),
        rank,
        address,
        [driver.cuuint64_t(d) for d in geo.dims],
        [driver.cuuint64_t(s) for s in geo.strides],
        [driver.cuuint32_t(b) for b in geo.box],
        [driver.cuuint32_t(e) for e in geo.element_strides],
        _enum(driver.CUtensorMapInterleave, "CU_TENSOR_MAP_INTERLEAVE_", geo.interleave,
              "interleave"),
        _enum(driver.CUtensorMapSwizzle, "CU_TENSOR_MAP_SWIZZLE_", geo.swizzle, "swizzle"),
        _enum(driver.CUtensorMapL2promotion, "CU_TENSOR_MAP_L2_PROMOTION_",
              geo.l2_promotion if geo.l2_promotion == "NONE" else "L2_" + geo.l2_promotion,
              "L2 promotion"),
        _enum(driver.CUtensorMapFloatOOBfill, "CU_TENSOR_MAP_FLOAT_OOB_FILL_", geo.oob_fill,
              "OOB fill"),
    )


def encode(geo: TmaGeometry, address: int, what: str) -> bytes:
    """The 128 bytes of the CUtensorMap for `geo` (needs the device's context current)."""
    from cuda.bindings import driver

    from .cuda import check
    from .errors import CudaError

    try:
        tmap = check(driver.cuTensorMapEncodeTiled(*encode_args(geo, address)),
                     "cuTensorMapEncodeTiled")
    except CudaError as exc:
        raise ManifestError(f"{what}: the recorded TMA geometry {geo} cannot be encoded "
                            f"({exc})") from exc
    return ctypes.string_at(tmap.getPtr(), TENSORMAP_BYTES)
