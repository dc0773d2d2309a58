"""Per-device runtime state and the launch path.

One DeviceRuntime per CUDA device holds everything bound to that device: kernels loaded in its
primary context with their TMA templates encoded, plans (per kernel and shapes) with their
device tables, and the pointer-table cache. Nothing here is shared between devices, and
nothing a kernel writes (the tensormap workspace) is shared between launches: it is allocated
per launch on the current stream, so launches on different streams or threads never overlap
in it, and a captured launch gets it from the graph's private pool.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from cuda.bindings import driver

from . import cuda, device_tables, launch, tma
from .dispatch import arch_for_capability
from .loader import ArtifactStore, LoadedKernel
from .manifest import KernelEntry
from .params import PackedParams, pack_params
from .plan import Plan, make_plan, pointer_table_bytes

PLAN_CACHE = 1024  # plans per device (dynamic-m calls make one per distinct m vector)
POINTER_CACHE = 256  # pointer tables per device
_serial = itertools.count()


def _raw_stream_getter() -> Callable[[int], int]:
    # torch._C._cuda_getCurrentRawStream is what Triton's launcher uses: ~10x cheaper than
    # building a torch.cuda.Stream object per call. Fall back to the public API.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda ordinal: torch.cuda.current_stream(ordinal).cuda_stream


@dataclass
class PreparedKernel:
    """A kernel bound to a device, with the parameter values fixed per (kernel, device)."""

    loaded: LoadedKernel
    templates: dict[str, bytes]  # TMA template param name -> encoded CUtensorMap


class DevicePlan:
    """A Plan bound to a device: its tables (uploaded on first eager launch) and, per thread,
    a packed parameter buffer and launch config rewritten in place by each launch."""

    def __init__(self, plan: Plan, prepared: PreparedKernel) -> None:
        self.plan = plan
        self.prepared = prepared
        self.serial = next(_serial)  # pointer-table cache key part; never reused, unlike id()
        self.tables: device_tables.DeviceTable | None = None
        self._lock = threading.Lock()
        self._local = threading.local()

    def slot(self) -> tuple[PackedParams, Any]:
        """This thread's (params, config): one launch at a time per thread, so no races."""
        s = getattr(self._local, "slot", None)
        if s is None:
            entry = self.plan.entry
            values: dict[str, Any] = dict(self.prepared.templates)
            values.update(num_groups=self.plan.num_groups, pointers=0, problem_sizes=0,
                          cta_prefix=0, tensormap_workspace=0)
            params = pack_params(entry.params, values)
            config = launch.make_config(self.plan.grid, entry.block, entry.dynamic_smem,
                                        entry.cluster)
            s = self._local.slot = (params, config)
        return s

    def eager_tables(self, device: torch.device, stream: int) -> device_tables.DeviceTable:
        t = self.tables
        if t is None:
            with self._lock:
                t = self.tables
                if t is None:
                    t = self.tables = device_tables.upload(self.plan.plan_tables, device, stream)
        t.ready_on(stream, device)
        return t


class DeviceRuntime:
    def __init__(self, store: ArtifactStore, ordinal: int) -> None:
        self.store = store
        self.device = cuda.get_device(ordinal)
        self.torch_device = torch.device("cuda", ordinal)
        self.arch = arch_for_capability(self.device.capability)
        self.label = self.device.label
        self._prepared: dict[str, PreparedKernel] = {}
        self._plans = device_tables.LruCache(PLAN_CACHE)
        self._pointers = device_tables.LruCache(POINTER_CACHE)
        self._arena = device_tables.CaptureArena()
        self._lock = threading.Lock()
        self._placeholder: torch.Tensor | None = None
        self._stream = _raw_stream_getter()
        self._context = int(self.device.context)

    # ------------------------------------------------------------ load-time work

    def prepared(self, entry: KernelEntry) -> PreparedKernel:
        p = self._prepared.get(entry.name)
        if p is None:
            with self._lock:
                p = self._prepared.get(entry.name)
                if p is None:
                    p = self._prepared[entry.name] = self._prepare(entry)
        return p

    def _prepare(self, entry: KernelEntry) -> PreparedKernel:
        # Loading is no stream work, but a first call made inside a global-mode graph capture
        # would have cuLibraryLoadData & co. refused as "unsafe": allow them for this thread.
        # (Warming up before capture, as torch's graph docs ask, avoids the question.)
        with cuda.relaxed_capture_mode():
            loaded = self.store.kernel(entry, self.device)
            templates = {}
            tma_params = [p for p in entry.params if p.kind == "tma_template"]
            if tma_params:
                if self._placeholder is None:
                    # Never read through (the kernel patches address, dims and strides per
                    # group), so torch.empty: no fill kernel that a capture would record.
                    self._placeholder = torch.empty(256, dtype=torch.uint8,
                                                    device=self.torch_device)
                with cuda.current(self.device):
                    for p in tma_params:
                        templates[p.name] = tma.encode(
                            p.tma, self._placeholder.data_ptr(),
                            f"kernel {entry.name!r} parameter {p.name!r}")
        return PreparedKernel(loaded=loaded, templates=templates)

    def plan(self, entry: KernelEntry, shapes: tuple[tuple[int, int, int], ...]) -> DevicePlan:
        key = (entry.name, shapes)
        dp = self._plans.get(key)
        if dp is None:
            dp = DevicePlan(make_plan(entry, shapes, self.device.sm_count), self.prepared(entry))
            dp = self._plans.put(key, dp)
        return dp

    # ------------------------------------------------------------ per call

    def launch(self, dp: DevicePlan, pointer_rows: Sequence[int],
               check_inputs: Callable[[], None] | None) -> None:
        """Launch `dp` with this call's pointers on the current stream of this device.

        `check_inputs` (the output-overlap check) runs whenever the pointer table is built,
        i.e. for every new (plan, pointers) pair, before anything is uploaded or launched.
        """
        plan = dp.plan
        device = self.torch_device
        stream = self._stream(self.device.ordinal)
        # The whole launch runs in this device's context: torch ops inside behave as under
        # torch.cuda.device(ordinal), and the capture query must ask this device's stream
        # (torch.cuda.is_current_stream_capturing() asks the current device's). Inlined rather
        # than `with cuda.current(...)`: a generator context manager costs ~1 us per call.
        prev = cuda.check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        switch = int(prev) != self._context
        if switch:
            cuda.check(driver.cuCtxSetCurrent(self.device.context), "cuCtxSetCurrent")
        try:
            self._launch(dp, plan, device, stream, pointer_rows, check_inputs)
        finally:
            if switch:
                cuda.check(driver.cuCtxSetCurrent(prev), "cuCtxSetCurrent")

    def _launch(self, dp: DevicePlan, plan: Plan, device: torch.device, stream: int,
                pointer_rows: Sequence[int], check_inputs: Callable[[], None] | None) -> None:
        if cuda.is_capturing(stream):
            if check_inputs is not None:
                check_inputs()
            image = pointer_table_bytes(plan, pointer_rows)
            ptr_t = device_tables.upload_captured(image, device, stream, self._arena,
                                                  self.device)
            tab_t = device_tables.upload_captured(plan.plan_tables, device, stream,
                                                  self._arena, self.device)
            keep: tuple[Any, ...] = (ptr_t, tab_t)
            pointers, tables = ptr_t.data_ptr(), tab_t.data_ptr()
        else:
            key = (dp.serial, tuple(pointer_rows))
            ptr_table = self._pointers.get(key)
            if ptr_table is None:
                if check_inputs is not None:
                    check_inputs()
                ptr_table = self._pointers.put(key, device_tables.upload(
                    pointer_table_bytes(plan, pointer_rows), device, stream))
            ptr_table.ready_on(stream, device)
            tab = dp.eager_tables(device, stream)
            keep = (ptr_table, tab)
            pointers, tables = ptr_table.address, tab.address
        # Written by the kernel: one per launch, stream-ordered by the caching allocator.
        workspace = torch.empty(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=device)
        params, config = dp.slot()
        params.set_tables(pointers, tables, tables + plan.cta_prefix_offset,
                          workspace.data_ptr())
        launch.launch(dp.prepared.loaded.function, config, stream, params.kernel_params)
        del keep, workspace  # only now may the allocator recycle them (stream-ordered)
