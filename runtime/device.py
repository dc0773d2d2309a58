"""Per-device runtime state and the launch path.

One DeviceRuntime per CUDA device holds everything bound to that device: kernels loaded in its
primary context with their TMA templates encoded, plans (per kernel and shapes) with their
device tables, the pointer-table cache and the per-stream tensormap workspaces. Nothing here is
shared between devices.

Per-launch device state must never be shared by launches that can overlap:
- tables (problem sizes, CTA prefix, pointers) are immutable once uploaded, so any number of
  launches may read them at once;
- the tensormap workspace is written by the kernel. Eager launches use one workspace per
  (device, stream): launches on one stream run in stream order, so they never overlap in it,
  and launches on other streams use their own. A launch holds a reference to the workspace it
  uses until it has been enqueued, so a concurrent regrow (another thread, same stream) frees
  the old one only after that launch is in the stream, where the caching allocator's
  stream-ordered reuse keeps it safe. A launch made under CUDA-graph capture allocates its
  workspace (and its tables) per launch from the graph's private pool instead: a graph may
  replay on any stream, overlapping eager work.
"""

from __future__ import annotations

import itertools
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from cuda.bindings import driver

from . import cuda, device_tables, launch, tma
from .dispatch import arch_for_capability
from .loader import ArtifactStore, LoadedKernel
from .manifest import KernelEntry, Quantizer
from .params import PackedParams, pack_params
from .plan import Plan, make_plan, ones_image, pack_aligned, pointer_table_bytes

PLAN_CACHE = 1024  # plans per device (dynamic-m calls make one per distinct m vector)
POINTER_CACHE = 256  # pointer tables per device
WORKSPACE_STREAMS = 64  # per-stream workspaces kept per device before the map starts over
WORKSPACE_MIN = 4096  # bytes: first allocation per stream, so small plans never regrow it
# Argument order of a call's flattened data pointers: all a, all b, all sfa, all sfb, all c.
ARG_ORDER = ("a", "b", "sfa", "sfb", "c")
_SUCCESS = driver.CUresult.CUDA_SUCCESS
_NOT_CAPTURING = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
_serial = itertools.count()


def _raw_stream_getter() -> Callable[[int], int]:
    # torch._C._cuda_getCurrentRawStream is what Triton's launcher uses: ~10x cheaper than
    # building a torch.cuda.Stream object per call. Fall back to the public API.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda ordinal: torch.cuda.current_stream(ordinal).cuda_stream


class PreparedKernel:
    """A kernel bound to a device, with the parameter values fixed per (kernel, device), and
    per thread its packed parameter slots by group count (shared by that kernel's plans).
    A plain class, not a dataclass: import time is cold-start time."""

    __slots__ = ("loaded", "local", "templates")

    def __init__(self, loaded: LoadedKernel, templates: dict[str, bytes]) -> None:
        self.loaded = loaded
        self.templates = templates  # TMA template param name -> encoded CUtensorMap
        self.local = threading.local()

    def slot(self, plan: Plan) -> _Slot:
        """This thread's slot for `plan`'s kernel and group count, its grid set to the plan's.

        A thread launches one kernel at a time, so its plans with one group count (a dynamic-m
        kernel makes a plan per m vector) share one buffer: only the grid and the table
        addresses differ, and each launch writes those.
        """
        slots = getattr(self.local, "slots", None)
        if slots is None:
            slots = self.local.slots = {}
        s = slots.get(plan.num_groups)
        if s is None:
            entry = plan.entry
            values: dict[str, Any] = dict(self.templates)
            values.update(num_groups=plan.num_groups, pointers=0, problem_sizes=0,
                          cta_prefix=0, tensormap_workspace=0, grid_barrier=0, alpha=0)
            params = pack_params(entry.params, values)
            config = launch.make_config(plan.grid, entry.block, entry.dynamic_smem,
                                        entry.cluster, entry.grid.cooperative)
            s = slots[plan.num_groups] = _Slot(params, config, plan.grid)
        return s


_ROW_INDEX: dict[tuple[tuple[str, ...], int], tuple[int, ...]] = {}


def _row_index(columns: tuple[str, ...], groups: int) -> tuple[int, ...]:
    """ptrs (argument order, see ARG_ORDER) -> pointer-table cells in the manifest's order."""
    key = (columns, groups)
    idx = _ROW_INDEX.get(key)
    if idx is None:
        idx = _ROW_INDEX[key] = tuple(ARG_ORDER.index(c) * groups + i for i in range(groups)
                                      for c in columns)
    return idx


class _Slot:
    """A thread's packed parameters and launch config for one plan, and the table addresses
    and stream last written into them (a repeated launch rewrites nothing)."""

    __slots__ = ("alpha", "barrier", "config", "grid", "params", "pointers", "stream", "tables",
                 "workspace")

    def __init__(self, params: PackedParams, config: Any, grid: int) -> None:
        self.params, self.config, self.grid = params, config, grid
        self.pointers = self.tables = self.workspace = self.barrier = self.stream = None
        self.alpha = None

    def set(self, pointers: int, tables: int, cta_prefix_offset: int, workspace: int,
            barrier: int, alpha: int) -> None:
        if (pointers != self.pointers or tables != self.tables or workspace != self.workspace
                or barrier != self.barrier or alpha != self.alpha):
            self.params.set_tables(pointers, tables, tables + cta_prefix_offset, workspace,
                                   barrier, alpha)
            self.pointers, self.tables, self.workspace = pointers, tables, workspace
            self.barrier, self.alpha = barrier, alpha


class DevicePlan:
    """A Plan bound to a device: its tables (uploaded on first eager launch) and, per thread,
    a packed parameter buffer and launch config rewritten in place by each launch."""

    def __init__(self, plan: Plan, prepared: PreparedKernel) -> None:
        self.plan = plan
        self.prepared = prepared
        self.serial = next(_serial)  # pointer-table cache key part; never reused, unlike id()
        self.tables: device_tables.DeviceTable | None = None
        self.workspace_bytes = max(plan.workspace_bytes, 1)
        self.workspace_header = plan.workspace_header
        self.function = prepared.loaded.function
        self.uses = 0  # plan lookups that returned this plan (approximate across threads)
        # (ptrs, pointer table) of the last cached launch: a repeat skips the cache lookup.
        self.last: tuple[tuple[int, ...], device_tables.DeviceTable] | None = None
        self.row_index = _row_index(plan.pointer_columns, plan.num_groups)
        self.ones = 0  # serving plans: the device address of their alpha = None ones
        self._lock = threading.Lock()
        self._local = threading.local()

    def rows(self, ptrs: Sequence[int]) -> list[int]:
        """The pointer table's flattened rows from a call's pointers in argument order."""
        return [ptrs[i] for i in self.row_index]

    def slot(self) -> _Slot:
        """This thread's parameter buffer and launch config for this plan (one launch at a
        time per thread, so no races), with the plan's grid."""
        s = getattr(self._local, "slot", None)
        if s is None:
            s = self._local.slot = self.prepared.slot(self.plan)
        if s.grid != self.plan.grid:
            s.config.gridDimX = s.grid = self.plan.grid
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


# The per-call parameters of a device-offsets kernel, in the order OffsetsPlan.launch packs them.
OFFSETS_CALL_ROLES = ("offs", "a", "b", "sfa", "sfb", "c", "tensormap_workspace",
                      "grid_barrier", "alpha")


class OffsetsPlan:
    """A device-offsets kernel (runtime/serving.py) bound to a device for one (E, N, K, T):
    grid, workspace size and the alpha = None ones; per thread a parameter buffer with the
    templates and scalars written once, so a launch writes only the nine addresses of
    OFFSETS_CALL_ROLES (one struct pack when their slots are contiguous, as recorded today)."""

    __slots__ = ("_local", "_pack", "entry", "function", "grid", "header", "ones", "prepared",
                 "values", "workspace_bytes")

    def __init__(self, entry: KernelEntry, prepared: PreparedKernel, grid: int,
                 workspace_bytes: int, values: dict[str, int], ones: int) -> None:
        self.entry, self.prepared, self.grid = entry, prepared, grid
        self.function = prepared.loaded.function
        self.workspace_bytes = max(workspace_bytes, 1)
        self.header = entry.tables.tensormap_workspace.header_bytes
        self.values = values  # num_groups, rows, n, k
        self.ones = ones
        self._local = threading.local()
        at = {p.operand if p.kind == "operand" else p.table: p.offset for p in entry.params
              if p.kind in ("operand", "table")}
        if "masked_m" in at:  # a masked-layout kernel: masked_m takes offs' place
            at["offs"] = at["masked_m"]
        # The roles this kernel takes (an sm_100a kernel has no grid barrier), with slots.
        present = [(i, at[r]) for i, r in enumerate(OFFSETS_CALL_ROLES) if r in at]
        offsets = [o for _, o in present]
        if (len(present) == len(OFFSETS_CALL_ROLES)
                and offsets == list(range(offsets[0], offsets[0] + 8 * len(offsets), 8))):
            whole = struct.Struct(f"<{len(offsets)}Q")
            first = offsets[0]
            self._pack = lambda buf, vals: whole.pack_into(buf, first, *vals)
        else:
            one = struct.Struct("<Q")

            def pack(buf: Any, vals: tuple[int, ...]) -> None:
                for i, o in present:
                    one.pack_into(buf, o, vals[i])
            self._pack = pack

    def _slot(self) -> tuple[PackedParams, Any]:
        s = getattr(self._local, "slot", None)
        if s is None:
            values: dict[str, Any] = dict(self.prepared.templates)
            values.update(self.values)
            values.update({r: 0 for r in (*OFFSETS_CALL_ROLES, "masked_m")})
            params = pack_params(self.entry.params, values)
            config = launch.make_config(self.grid, self.entry.block, self.entry.dynamic_smem,
                                        self.entry.cluster, self.entry.grid.cooperative)
            s = self._local.slot = (params, config)
        return s

    def launch(self, stream: int, addresses: tuple[int, ...]) -> None:
        """Launch on `stream` (this device's context current) with the nine addresses of
        OFFSETS_CALL_ROLES, in that order."""
        params, config = self._slot()
        self._pack(params.buffer, addresses)
        launch.launch(self.function, config, stream, params.kernel_params)


class DeviceRuntime:
    def __init__(self, store: ArtifactStore, ordinal: int) -> None:
        self.store = store
        self.device = cuda.get_device(ordinal)
        self.torch_device = torch.device("cuda", ordinal)
        self.arch = arch_for_capability(self.device.capability)
        self.label = self.device.label
        self._prepared: dict[str, PreparedKernel] = {}
        self._quantizers: dict[str, LoadedKernel] = {}  # quantizer key -> loaded function
        self._plans = device_tables.LruCache(PLAN_CACHE)
        self._pointers = device_tables.LruCache(POINTER_CACHE)
        self._arena = device_tables.CaptureArena()
        self._lock = threading.Lock()
        self._placeholder: torch.Tensor | None = None
        self._alloc_stream: Any = None  # _long_lived's allocation stream
        self._alloc_lock = threading.Lock()
        self._stream = _raw_stream_getter()
        # (raw stream handle, header bytes) -> (workspace tensor, bytes, address); see the
        # module docstring. Kernels that keep state in a zeroed header never share a workspace
        # with kernels that would write descriptors over it.
        self._workspaces: dict[tuple[int, int], tuple[torch.Tensor, int, int]] = {}

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
                    # group), so left unfilled: no fill kernel that a capture would record.
                    self._placeholder = self._long_lived(256, owner=False)
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
        dp.uses += 1
        return dp

    def serving_plan(self, entry: KernelEntry, experts: int, n: int, k: int,
                     t: int) -> DevicePlan:
        """The DevicePlan of a scaled_grouped_mm call (runtime/serving.py), cached per
        (kernel, E, N, K, T); its ones (alpha = None) live in persistent device memory."""
        from .serving import serving_plan

        key = ("serving", entry.name, experts, n, k, t)
        dp = self._plans.get(key)
        if dp is None:
            dp = DevicePlan(serving_plan(entry, experts, n, k, t, self.device.sm_count),
                            self.prepared(entry))
            dp.ones = self._arena.store(dp.plan.plan_tables, self.device)
            dp = self._plans.put(key, dp)
        return dp

    def offsets_plan(self, entry: KernelEntry, experts: int, n: int, k: int,
                     t: int) -> OffsetsPlan:
        """The OffsetsPlan of a scaled_grouped_mm call on a device-offsets kernel, cached per
        (kernel, E, N, K, T); its ones (alpha = None) live in persistent device memory."""
        key = ("offsets", entry.name, experts, n, k, t)
        op = self._plans.get(key)
        if op is None:
            from .serving import offsets_launch_facts

            grid, workspace_bytes = offsets_launch_facts(entry, experts, k, t,
                                                         self.device.sm_count)
            ones = self._arena.store(ones_image(experts), self.device)
            # A masked-layout kernel's rows scalar is max_m (t = E * max_m rows in all).
            op = OffsetsPlan(entry, self.prepared(entry), grid, workspace_bytes,
                             {"num_groups": experts, "rows": t, "n": n, "k": k,
                              "max_m": t // experts}, ones)
            op = self._plans.put(key, op)
        return op

    def launch_offsets(self, op: OffsetsPlan, operands: tuple[int, ...], alpha: int) -> None:
        """Launch `op` on this device's current stream with the call's (offs, a, b, sfa, sfb,
        c) addresses and alpha's (0: the plan's ones). Eager launches use the stream's
        workspace, whose zeroed header is the grid barrier; a launch under capture gets a
        workspace from the graph's pool and a persistent zeroed barrier of its own."""
        stream = self._stream(self.device.ordinal)
        prev = self._enter()
        try:
            alpha = alpha or op.ones
            if self._capturing(stream):
                barrier = self._captured_barrier(op.header)
                ws = torch.empty(op.workspace_bytes, dtype=torch.uint8,
                                 device=self.torch_device)
                op.launch(stream, (*operands, ws.data_ptr(), barrier, alpha))
                del ws  # only now may the graph's pool recycle it (stream-ordered)
                return
            ws = self._workspaces.get((stream, op.header))  # held until enqueued
            if ws is None or ws[1] < op.workspace_bytes:
                ws = self._workspace(stream, op.workspace_bytes, op.header)
            op.launch(stream, (*operands, ws[2], ws[2], alpha))
        finally:
            if prev is not None:
                cuda.check(driver.cuCtxSetCurrent(prev), "cuCtxSetCurrent")

    def launch_quantizer(self, q: Quantizer, values: dict[str, int], grid: int) -> None:
        """Launch activation quantizer `q` (runtime/quantize.py) on this device's current
        stream: `grid` CTAs of q.block threads, its parameters by role from `values`. It keeps
        no state between calls, so eager and captured launches are the same."""
        loaded = self._quantizers.get(q.key)
        if loaded is None:
            # As _prepare: a first call inside a global-mode graph capture would have the
            # library load refused as "unsafe" (review of 2026-12-06).
            with cuda.relaxed_capture_mode():
                loaded = self._quantizers[q.key] = self.store.kernel(q, self.device)
        params = pack_params(q.params, values)
        config = launch.make_config(grid, q.block, q.dynamic_smem, q.cluster)
        stream = self._stream(self.device.ordinal)
        prev = self._enter()
        try:
            launch.launch(loaded.function, config, stream, params.kernel_params)
        finally:
            if prev is not None:
                cuda.check(driver.cuCtxSetCurrent(prev), "cuCtxSetCurrent")

    def _captured_barrier(self, header: int) -> int:
        """For a launch under capture: a persistent zeroed copy of the kernel's grid-barrier
        header (0 when it has none), which the graph keeps and every launch leaves zeroed."""
        return self._arena.store(bytes(header), self.device) if header else 0

    def launch_device_tables(self, dp: DevicePlan, pointers: torch.Tensor,
                             tables: torch.Tensor, prefix_offset: int, alpha: int) -> None:
        """Launch `dp` with device tables the caller computed in this stream (serving.py): the
        pointer table and the (problem sizes, CTA prefix) buffer. Eager launches use the
        stream's workspace; a launch under capture gets one from the graph's pool and a
        persistent zeroed barrier header, as _launch_captured does."""
        stream = self._stream(self.device.ordinal)
        prev = self._enter()
        try:
            alpha = alpha or dp.ones
            if self._capturing(stream):
                barrier = self._captured_barrier(dp.workspace_header)
                self._launch_in_capture(dp, stream, pointers.data_ptr(), tables.data_ptr(),
                                        prefix_offset, barrier, alpha)
                return
            ws = self._workspace(stream, dp.workspace_bytes, dp.workspace_header)
            slot = dp.slot()
            slot.set(pointers.data_ptr(), tables.data_ptr(), prefix_offset, ws[2], ws[2], alpha)
            slot.stream = stream
            launch.launch(dp.function, slot.config, stream, slot.params.kernel_params)
            # The tables were allocated on this stream: the allocator reuses them only after
            # the launch in stream order.
        finally:
            if prev is not None:
                cuda.check(driver.cuCtxSetCurrent(prev), "cuCtxSetCurrent")

    # ------------------------------------------------------------ per call

    def launch(self, dp: DevicePlan, ptrs: tuple[int, ...],
               check_inputs: Callable[[], None] | None, alpha: int = 0) -> None:
        """Launch `dp` with this call's pointers on the current stream of this device.

        `ptrs` are the data pointers in argument order (ARG_ORDER, group-minor); they key the
        pointer-table cache. `check_inputs` (the output-overlap check) runs whenever the pointer
        table is built, i.e. for every new (plan, pointers) pair, before anything is uploaded
        or launched. `alpha` is the device address of the call's (G,) float32 alpha, or 0 for
        none (the plan's ones).
        """
        stream = self._stream(self.device.ordinal)
        prev = self._enter()
        try:
            if self._capturing(stream):
                self._launch_captured(dp, stream, ptrs, check_inputs, alpha)
                return
            key = (dp.serial, ptrs)
            table = self._pointers.get(key)
            if table is None:
                if check_inputs is not None:
                    check_inputs()
                table = self._pointers.put(key, self._upload_pointers(dp, ptrs, stream))
            dp.last = (ptrs, table)
            self._launch_eager(dp, stream, table, alpha)
        finally:
            if prev is not None:
                cuda.check(driver.cuCtxSetCurrent(prev), "cuCtxSetCurrent")

    def launch_cached(self, dp: DevicePlan, ptrs: tuple[int, ...], alpha: int = 0) -> bool:
        """The hot path: launch only if (dp, ptrs) was validated and launched before (its
        pointer table is cached) and the stream is not capturing; else launch nothing and
        return False (the caller then takes the full path). Inlined: every call saved here is
        about 0.1 us per launch."""
        last = dp.last
        if last is not None and last[0] == ptrs:
            table = last[1]
        else:
            table = self._pointers.get((dp.serial, ptrs))
            if table is None:
                return False
            dp.last = (ptrs, table)
        stream = self._stream(self.device.ordinal)
        r = driver.cuCtxGetCurrent()
        if r[0] != _SUCCESS:
            cuda.check(r, "cuCtxGetCurrent")
        prev = r[1]
        switch = prev != self.device.context
        if switch:
            cuda.check(driver.cuCtxSetCurrent(self.device.context), "cuCtxSetCurrent")
        try:
            r = driver.cuStreamIsCapturing(stream)
            if r[0] != _SUCCESS:
                cuda.check(r, "cuStreamIsCapturing")
            if r[1] != _NOT_CAPTURING:
                return False
            self._launch_eager(dp, stream, table, alpha)
        finally:
            if switch:
                cuda.check(driver.cuCtxSetCurrent(prev), "cuCtxSetCurrent")
        return True

    def _enter(self) -> Any:
        """Make this device's context current; returns the one to restore, or None.

        The whole launch runs in this device's context: torch ops inside behave as under
        torch.cuda.device(ordinal), and the capture query must ask this device's stream
        (torch.cuda.is_current_stream_capturing() asks the current device's). Inlined driver
        calls rather than `with cuda.current(...)`: a generator context manager costs ~1 us.
        """
        r = driver.cuCtxGetCurrent()
        if r[0] != _SUCCESS:
            cuda.check(r, "cuCtxGetCurrent")
        prev = r[1]
        if prev == self.device.context:
            return None
        cuda.check(driver.cuCtxSetCurrent(self.device.context), "cuCtxSetCurrent")
        return prev

    @staticmethod
    def _capturing(stream: int) -> bool:
        r = driver.cuStreamIsCapturing(stream)
        if r[0] != _SUCCESS:
            cuda.check(r, "cuStreamIsCapturing")
        return r[1] != _NOT_CAPTURING

    def _upload_pointers(self, dp: DevicePlan, ptrs: tuple[int, ...],
                         stream: int) -> device_tables.DeviceTable:
        """The pointer table for (dp, ptrs); for a plan not uploaded yet (a new dynamic-m
        shape list, typically), its tables ride in the same upload."""
        image = pointer_table_bytes(dp.plan, dp.rows(ptrs))
        if dp.tables is not None:
            return device_tables.upload(image, self.torch_device, stream)
        tables = dp.plan.plan_tables
        image_both, (_, offset) = pack_aligned(tables, image)
        both = device_tables.upload(image_both, self.torch_device, stream)
        with dp._lock:
            if dp.tables is None:
                dp.tables = device_tables.view(both, 0, len(tables), stream)
        return device_tables.view(both, offset, len(image), stream)

    def _workspace(self, stream: int, nbytes: int, header: int) -> tuple[torch.Tensor, int, int]:
        """This stream's workspace, grown to at least `nbytes` (see the module docstring)."""
        key = (stream, header)
        ws = self._workspaces.get(key)
        if ws is None or ws[1] < nbytes:
            size = max(nbytes, WORKSPACE_MIN, 2 * ws[1] if ws is not None else 0)
            t = self._long_lived(size)
            if header:
                t[:header].zero_()  # on this stream, after the allocation (_long_lived)
            ws = (t, size, t.data_ptr())
            with self._lock:
                if len(self._workspaces) >= WORKSPACE_STREAMS and key not in self._workspaces:
                    self._workspaces.clear()  # in-flight launches hold their own references
                self._workspaces[key] = ws
        return ws

    def _long_lived(self, nbytes: int, owner: bool = True) -> torch.Tensor:
        """A buffer that outlives the call (a stream's workspace, the TMA placeholder), owned by
        the current stream, allocated outside any CUDA-graph pool.

        torch.compile's "reduce-overhead" mode warms its graphs up under
        `torch._C._cuda_beginAllocateCurrentThreadToPool` (torch/_inductor/cudagraph_trees.py),
        which sends every allocation of the calling thread, on any stream, to the graph's
        private pool; a workspace kept across calls there fails the capture ("tensor(s) in the
        cudagraph pool not tracked as outputs", seen on the H200 2026-12-04). So the buffer is
        allocated by a helper thread on this device's allocation stream, where no work ever
        runs, and with `owner` the current stream owns it through record_stream: the caching
        allocator reuses it, once dropped, only after the current stream's work. (The
        placeholder, never read by a kernel and never freed, needs no owner.) Rare: the first
        call per stream and each regrow. Run on the H200 since 2026-12-04: every GPU run
        allocates through it, and serving_extras' reduce-overhead compile works
        (bench/RESULTS.md)."""
        box: list[Any] = []

        def allocate() -> None:
            try:
                if self.torch_device.type == "cuda":
                    with torch.cuda.stream(self._allocation_stream()):
                        box.append(torch.empty(nbytes, dtype=torch.uint8,
                                               device=self.torch_device))
                else:  # the CPU tests' fake device
                    box.append(torch.empty(nbytes, dtype=torch.uint8, device=self.torch_device))
            except BaseException as exc:  # re-raised in the caller's thread
                box.append(exc)

        helper = threading.Thread(target=allocate, name="nvfp4-allocate", daemon=True)
        helper.start()
        helper.join()
        t = box[0]
        if isinstance(t, BaseException):
            raise t
        if owner and self.torch_device.type == "cuda":
            t.record_stream(torch.cuda.current_stream(self.torch_device))
        return t

    def _allocation_stream(self) -> Any:
        """This device's stream for _long_lived allocations. Its own lock: _prepare holds the
        runtime lock when it allocates the placeholder."""
        if self._alloc_stream is None:
            with self._alloc_lock:
                if self._alloc_stream is None:
                    self._alloc_stream = torch.cuda.Stream(self.torch_device)
        return self._alloc_stream

    def _launch_eager(self, dp: DevicePlan, stream: int,
                      table: device_tables.DeviceTable, alpha: int) -> None:
        if stream not in table.streams:
            table.ready_on(stream, self.torch_device)
        tab = dp.tables
        if tab is None or stream not in tab.streams:
            tab = dp.eager_tables(self.torch_device, stream)
        ws = self._workspaces.get((stream, dp.workspace_header))  # held until enqueued
        if ws is None or ws[1] < dp.workspace_bytes:
            ws = self._workspace(stream, dp.workspace_bytes, dp.workspace_header)
        slot = dp.slot()
        # An eager launch's grid barrier is its workspace's zeroed header.
        slot.set(table.address, tab.address, dp.plan.cta_prefix_offset, ws[2], ws[2],
                 alpha or tab.address + dp.plan.ones_offset)
        slot.stream = stream
        launch.launch(dp.function, slot.config, stream, slot.params.kernel_params)

    def _launch_captured(self, dp: DevicePlan, stream: int, ptrs: tuple[int, ...],
                         check_inputs: Callable[[], None] | None, alpha: int) -> None:
        """Under stream capture: the tables are written now into memory the graph keeps (never
        the cached tables, whose upload events live outside it), and the workspace comes from
        the graph's pool (never the per-stream workspace, which a replay on another stream
        could overlap). A kernel's grid barrier (its workspace header) gets a zeroed copy of its
        own beside the tables, which every launch leaves fit for the next (kernels/tables.py):
        the graph holds the kernel node alone (each node costs every replay microseconds)."""
        if check_inputs is not None:
            check_inputs()
        plan = dp.plan
        header = (bytes(dp.workspace_header),) if dp.workspace_header else ()
        image, starts = pack_aligned(pointer_table_bytes(plan, dp.rows(ptrs)), plan.plan_tables,
                                     *header)
        base = self._arena.store(image, self.device)
        barrier = base + starts[2] if header else 0
        self._launch_in_capture(dp, stream, base, base + starts[1], plan.cta_prefix_offset,
                                barrier, alpha or base + starts[1] + plan.ones_offset)

    def _launch_in_capture(self, dp: DevicePlan, stream: int, pointers: int, tables: int,
                           prefix_offset: int, barrier: int, alpha: int) -> None:
        """The captured launch itself, with tables the graph keeps: a workspace from the
        graph's pool, and the thread's slot left to rewrite everything at its next launch."""
        ws = torch.empty(dp.workspace_bytes, dtype=torch.uint8, device=self.torch_device)
        slot = dp.slot()
        slot.set(pointers, tables, prefix_offset, ws.data_ptr(), barrier, alpha)
        slot.stream = stream
        launch.launch(dp.function, slot.config, stream, slot.params.kernel_params)
        # Graph-owned addresses: the next eager launch must write its own again.
        slot.pointers = slot.tables = slot.workspace = slot.barrier = slot.alpha = None
        del ws  # only now may the allocator recycle it (stream-ordered)
