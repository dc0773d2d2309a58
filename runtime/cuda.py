"""Checked wrappers over `cuda.bindings.driver`: errors, lazy cuInit, devices, primary contexts.

torch owns each device's primary context (the CUDA runtime creates it). We retain it once per
device, so its handle stays valid for the life of the process, and make it current only around
our own driver calls, restoring whatever the thread had: a thread may call us with tensors on
cuda:1 while torch's current device is cuda:0, and leaving cuda:1's context current would
silently change `torch.cuda.current_device()` for the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cuda.bindings import driver

from .errors import CudaError
from .records import Record

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_lock = threading.Lock()
_initialized = False
_devices: dict[int, Device] = {}


def error_name(code: Any) -> str:
    """`cuGetErrorName` of a CUresult, or '' when the driver cannot name it."""
    try:
        err, name = driver.cuGetErrorName(code)
    except Exception:
        return ""
    return name.decode() if err == _SUCCESS and name else ""


def check(result: tuple[Any, ...], call: str) -> Any:
    """Unwrap a driver call's `(CUresult, *values)`; raise CudaError naming the call on failure.

    Returns None, the single value, or the tuple of values.
    """
    err = result[0]
    if err != _SUCCESS:
        raise CudaError(call, int(err), error_name(err))
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def init() -> None:
    """cuInit once per process (idempotent, thread-safe)."""
    global _initialized
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        try:
            result = driver.cuInit(0)
        except Exception as exc:  # cuda.pathfinder raises when libcuda.so is absent
            raise CudaError("cuInit", -1,
                            f"the CUDA driver library cannot be loaded: {exc}") from exc
        check(result, "cuInit")
        _initialized = True


def _attr(dev: driver.CUdevice, attr: driver.CUdevice_attribute) -> int:
    return int(check(driver.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({attr.name})"))


class Device(Record):
    """What the runtime reads from a device once: never baked into a cubin (Runtime rules)."""

    ordinal: int
    handle: driver.CUdevice
    context: driver.CUcontext  # the retained primary context (shared with torch)
    capability: tuple[int, int]
    sm_count: int
    max_smem_optin: int  # max dynamic + static shared memory per block after opt-in
    name: str

    @property
    def label(self) -> str:
        major, minor = self.capability
        return f"cuda:{self.ordinal} ({self.name}, compute capability {major}.{minor})"


def get_device(ordinal: int) -> Device:
    """The Device for a CUDA ordinal (same numbering as torch: both honour CUDA_VISIBLE_DEVICES)."""
    dev = _devices.get(ordinal)
    if dev is not None:
        return dev
    init()
    with _lock:
        dev = _devices.get(ordinal)
        if dev is None:
            dev = _open_device(ordinal)
            _devices[ordinal] = dev
    return dev


def _open_device(ordinal: int) -> Device:
    count = int(check(driver.cuDeviceGetCount(), "cuDeviceGetCount"))
    if not 0 <= ordinal < count:
        raise CudaError("cuDeviceGet", int(driver.CUresult.CUDA_ERROR_INVALID_DEVICE),
                        f"device ordinal must be in 0..{count - 1}, but got {ordinal}")
    handle = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    attr = driver.CUdevice_attribute
    raw_name = check(driver.cuDeviceGetName(256, handle), "cuDeviceGetName")
    # Retained once and never released: torch keeps the same primary context alive anyway,
    # and a release racing a launch on another thread would be a use-after-free.
    ctx = check(driver.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")
    return Device(
        ordinal=ordinal,
        handle=handle,
        context=ctx,
        capability=(_attr(handle, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                    _attr(handle, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        sm_count=_attr(handle, attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        max_smem_optin=_attr(handle, attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        name=bytes(raw_name).split(b"\0", 1)[0].decode(errors="replace"),
    )


@contextmanager
def current(dev: Device) -> Iterator[None]:
    """Make `dev`'s primary context current for the block, restoring the thread's previous one.

    Costs one cuCtxGetCurrent when the context is already current (the common case).
    """
    prev = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(prev) == int(dev.context):
        yield
        return
    check(driver.cuCtxSetCurrent(dev.context), "cuCtxSetCurrent")
    try:
        yield
    finally:
        check(driver.cuCtxSetCurrent(prev), "cuCtxSetCurrent")


def is_capturing(stream: int) -> bool:
    """Whether `stream` (a raw handle, in the current context's device) is being captured."""
    status = check(driver.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
    return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


@contextmanager
def relaxed_capture_mode() -> Iterator[None]:
    """Allow calls that are illegal under global stream capture (cuMemHostAlloc) in this block.

    torch captures graphs in 'global' mode by default, which forbids "potentially unsafe" calls
    from every thread; the CUDA caching allocator itself switches to relaxed mode the same way.
    """
    mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    call = "cuThreadExchangeStreamCaptureMode"
    prev = check(driver.cuThreadExchangeStreamCaptureMode(mode), call)
    try:
        yield
    finally:
        check(driver.cuThreadExchangeStreamCaptureMode(prev), call)
