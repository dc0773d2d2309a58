"""Immutable device tables: upload, caching, cross-stream readiness and CUDA-graph capture.

A table (problem sizes + CTA prefix, or pointers) is a host byte image copied to the device
once and never written again, so any number of launches may read it at once. Rules:
- Eager upload: pinned host tensor -> device tensor with a non_blocking copy on the current
  stream, then an event. The pinned tensor stays alive with the device tensor.
- A table used on a stream other than the one that uploaded it first makes that stream wait
  for the upload event (otherwise a launch on stream B may read it before stream A's copy
  ran) and `record_stream`s it (otherwise eviction could recycle it under B's kernel). Both
  happen once per (table, stream).
- During stream capture, cached tables are not used: their upload event lives outside the
  graph. A captured launch uploads its own tables inside the capture from pinned memory that
  is never freed (each replay re-reads it) and never rewritten.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import torch

from . import cuda


class DeviceTable:
    """A device copy of a host byte image; `address` is what kernel parameters carry."""

    __slots__ = ("tensor", "host", "address", "event", "streams")

    def __init__(self, tensor: torch.Tensor, host: torch.Tensor, event: Any, stream: int) -> None:
        self.tensor = tensor
        self.host = host  # keeps the copy's source alive as long as the table
        self.address = tensor.data_ptr()
        self.event = event
        self.streams = {stream}

    def ready_on(self, stream: int, device: torch.device) -> None:
        """Order `stream` (the current stream of `device`) after the upload, once."""
        if stream in self.streams:
            return
        s = torch.cuda.current_stream(device)
        s.wait_event(self.event)
        self.tensor.record_stream(s)
        self.streams.add(stream)


def upload(image: bytes, device: torch.device, stream: int) -> DeviceTable:
    """Eager upload of `image` on the current stream of `device` (whose handle is `stream`)."""
    n = len(image)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    ctypes.memmove(host.data_ptr(), image, n)
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return DeviceTable(dev, host, event, stream)


def view(table: DeviceTable, offset: int, nbytes: int, stream: int) -> DeviceTable:
    """Bytes [offset, offset + nbytes) of an uploaded table as a table of their own (one
    upload for two tables: they share the device memory, the pinned source and the event)."""
    return DeviceTable(table.tensor[offset:offset + nbytes], table.host, table.event, stream)


class LruCache:
    """A bounded, thread-safe LRU map. Evicted tables are freed through torch's stream-ordered
    allocators (record_stream covers the other streams that used them)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> Any:
        """Insert unless present; returns the cached value (first writer wins)."""
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                self._items.move_to_end(key)
                return old
            self._items[key] = value
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
            return value

    def __len__(self) -> int:
        return len(self._items)


class CaptureArena:
    """Pinned host memory for tables uploaded inside CUDA-graph capture; never freed.

    A captured memcpy node re-reads its source at every replay and nothing tells us when the
    graph dies, so the source must live (unchanged) for the process. Bump-allocated in 64 KiB
    chunks of portable pinned memory: a few hundred bytes per captured launch.
    """

    CHUNK = 1 << 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chunks: list[int] = []
        self._base = 0
        self._used = self.CHUNK

    def store(self, image: bytes) -> int:
        from cuda.bindings import driver

        n = -(-len(image) // 128) * 128
        with self._lock:
            if self._used + n > self.CHUNK:
                size = max(self.CHUNK, n)
                # cuMemHostAlloc is a "potentially unsafe" call under global-mode capture.
                with cuda.relaxed_capture_mode():
                    ptr = cuda.check(driver.cuMemHostAlloc(size, driver.CU_MEMHOSTALLOC_PORTABLE),
                                     "cuMemHostAlloc")
                self._chunks.append(int(ptr))
                self._base, self._used = int(ptr), 0
            address = self._base + self._used
            self._used += n
        ctypes.memmove(address, image, len(image))
        return address


def upload_captured(image: bytes, device: torch.device, stream: int, arena: CaptureArena,
                    dev: cuda.Device, nbytes: int | None = None) -> torch.Tensor:
    """Upload inside stream capture: the copy becomes a graph node reading `arena` memory.
    The allocation has `nbytes` (default: the image's size); the image fills its start."""
    from cuda.bindings import driver

    size = len(image) if nbytes is None else nbytes
    if size < len(image):
        raise ValueError(f"nbytes {size} is smaller than the {len(image)}-byte image")
    tensor = torch.empty(size, dtype=torch.uint8, device=device)  # graph's private pool
    with cuda.current(dev):
        src = arena.store(image)
        cuda.check(driver.cuMemcpyHtoDAsync(tensor.data_ptr(), src, len(image), stream),
                   "cuMemcpyHtoDAsync")
    return tensor
