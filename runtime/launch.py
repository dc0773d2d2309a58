"""cuLaunchKernelEx on the caller's stream; never synchronizes (Runtime rules)."""

from __future__ import annotations

import ctypes
import os
from typing import Any

from cuda.bindings import driver

from .cuda import check

_SUCCESS = driver.CUresult.CUDA_SUCCESS
ENV_NATIVE = "NVFP4_NATIVE_LAUNCH"  # "0": every launch through cuda-python's wrapper

try:  # libcuda's own entry point (absent on a machine without the driver)
    _LAUNCH_EX: Any = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    _LAUNCH_EX.argtypes = [ctypes.c_void_p] * 4
    _LAUNCH_EX.restype = ctypes.c_int
except (OSError, AttributeError):
    _LAUNCH_EX = None


class _Attr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("num_attrs", ctypes.c_uint)]


class NativeLaunch:
    """A C copy of a launch config (make_config's) and cuLaunchKernelEx called on it through
    ctypes: 1.3-1.7 us less host time per launch than cuda-python's wrapper on the H200
    (experiments/host_breakdown.py, 2026-12-04), a seventh of a serving call. One per thread
    (the stream is written into it per launch)."""

    __slots__ = ("_address", "_attrs", "config")

    def __init__(self, config: driver.CUlaunchConfig) -> None:
        attrs = (_Attr * max(1, config.numAttrs))()
        for i in range(config.numAttrs):
            a = config.attrs[i]
            attrs[i].id = int(a.id)
            if a.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
                attrs[i].value[0] = a.value.cooperative
            elif a.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
                d = a.value.clusterDim
                attrs[i].value[0], attrs[i].value[1], attrs[i].value[2] = d.x, d.y, d.z
            else:
                raise ValueError(f"no native form for launch attribute {a.id!r}")
        self._attrs = attrs
        self.config = _Config((config.gridDimX, config.gridDimY, config.gridDimZ),
                              (config.blockDimX, config.blockDimY, config.blockDimZ),
                              config.sharedMemBytes, None, attrs, config.numAttrs)
        self._address = ctypes.addressof(self.config)

    def __call__(self, function: int, stream: int, kernel_params: int) -> None:
        """Launch `function` (its address; its context current) on `stream`."""
        self.config.stream = stream
        r = _LAUNCH_EX(self._address, function, kernel_params, None)
        if r:
            check((driver.CUresult(r),), "cuLaunchKernelEx")


def native(config: driver.CUlaunchConfig) -> NativeLaunch | None:
    """config's NativeLaunch, or None where libcuda cannot be loaded or NVFP4_NATIVE_LAUNCH=0
    (then launch() is the way)."""
    if _LAUNCH_EX is None or os.environ.get(ENV_NATIVE) == "0":
        return None
    return NativeLaunch(config)


def make_config(grid: int, block: tuple[int, int, int], dynamic_smem: int,
                cluster: tuple[int, int, int], cooperative: bool = False) -> driver.CUlaunchConfig:
    """A launch config for a 1-D grid; `hStream` is set per launch.

    The DSL bakes dynamic shared memory and cluster shape at compile time; the manifest records
    both and they are passed back exactly. The cluster attribute is only attached for real
    clusters, and `attrs` is assigned as a whole list (appending in place does not stick).
    `cooperative` (a kernel with a grid-wide barrier) makes the driver refuse a grid whose CTAs
    cannot all be resident at once, instead of letting the barrier hang.
    """
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = dynamic_smem
    attrs = []
    if tuple(cluster) != (1, 1, 1):
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        attrs.append(attr)
    if cooperative:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attr.value.cooperative = 1
        attrs.append(attr)
    if attrs:
        config.attrs = attrs
    config.numAttrs = len(attrs)
    return config


def launch(function: Any, config: driver.CUlaunchConfig, stream: int, kernel_params: int) -> None:
    """Launch `function` (needs its context current) with a packed `void*[]` address. The one
    launch point of the runtime (eager, cached and captured launches all come here)."""
    config.hStream = stream
    r = driver.cuLaunchKernelEx(config, function, kernel_params, 0)
    if r[0] != _SUCCESS:
        check(r, "cuLaunchKernelEx")
