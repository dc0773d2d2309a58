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
  graph. A captured launch writes its own tables at capture time into device memory that is
  never freed (CaptureArena), so the graph needs no copy node.
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
    """Device memory for the tables of launches made under CUDA-graph capture; never freed.

    A captured launch's tables are fixed for the graph's life, and nothing tells us when the
    graph dies, so they live for the process: a few hundred bytes per captured launch,
    bump-allocated in 64 KiB chunks. They are written at capture time, outside the graph,
    through a private non-blocking stream that is synchronized at once: the graph then holds no
    copy node, which cost 2.9 us of every replay on the H200 (docs/lab_notebook.md, 2026-11-30).
    """

    CHUNK = 1 << 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base = 0
        self._used = self.CHUNK
        self._stream: Any = None

    def store(self, image: bytes, dev: cuda.Device) -> int:
        """Device address of a persistent copy of `image` (128-byte aligned), written now."""
        from cuda.bindings import driver

        n = max(1, -(-len(image) // 128)) * 128
        src = ctypes.create_string_buffer(image, len(image))
        # Allocation, stream creation and the synchronous upload are "potentially unsafe"
        # calls under global-mode capture; none of them touches the capturing stream.
        with self._lock, cuda.relaxed_capture_mode(), cuda.current(dev):
            if self._used + n > self.CHUNK:
                size = max(self.CHUNK, n)
                self._base = int(cuda.check(driver.cuMemAlloc(size), "cuMemAlloc"))
                self._used = 0
            if self._stream is None:
                self._stream = cuda.check(
                    driver.cuStreamCreate(int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)),
                    "cuStreamCreate")
            address = self._base + self._used
            self._used += n
            if image:
                cuda.check(driver.cuMemcpyHtoDAsync(address, ctypes.addressof(src), len(image),
                                                    self._stream), "cuMemcpyHtoDAsync")
                cuda.check(driver.cuStreamSynchronize(self._stream), "cuStreamSynchronize")
        return address

