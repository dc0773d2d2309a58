"""cuLaunchKernelEx on the caller's stream; never synchronizes (Runtime rules)."""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver

from .cuda import check

_SUCCESS = driver.CUresult.CUDA_SUCCESS


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
