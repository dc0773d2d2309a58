"""Public API: `load(artifact_dir)` -> GroupedGemm, whose `grouped_gemm` runs a built kernel.

    gg = runtime.load("artifacts")
    out = gg.grouped_gemm(a_list, b_list, sfa_list, sfb_list)   # list of fp16 (m, n) tensors

Per group g: a (m, k/2) and b (n, k/2) packed NVFP4 (torch.float4_e2m1fn_x2 or uint8, K-major),
sfa / sfb e4m3 scales (torch.float8_e4m3fn or uint8) in the blocked layout of facts.md (any
shape with the right element count, contiguous), out fp16 (m, n). The call's (m, n, k) per
group and the device's compute capability select the kernel; a call no kernel serves raises
NoKernelError listing what was built, with nothing launched.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .dispatch import KernelIndex
from .loader import ArtifactStore
from .manifest import KernelEntry
from .validate import check_inputs, check_no_overlap

Shape = tuple[int, int, int]
_OPERAND = {"a": 0, "b": 1, "sfa": 2, "sfb": 3, "c": 4}  # index into check_inputs' pointers


def load(artifact_dir: str | Path) -> GroupedGemm:
    """Open an artifact directory: reads and validates the manifest only (kernels load lazily)."""
    return GroupedGemm(ArtifactStore(artifact_dir))


def _ordinal(device: Any) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device, but got {dev}")
    return torch.cuda.current_device() if dev.index is None else dev.index


class GroupedGemm:
    """Grouped NVFP4 GEMMs served by the kernels of one artifact directory.

    Safe to share between threads and streams; state is per device and created lazily.
    """

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        self.index = KernelIndex(store.kernels)
        self._runtimes: dict[int, Any] = {}
        self._lock = threading.Lock()

    @property
    def kernels(self) -> tuple[KernelEntry, ...]:
        """Every kernel entry of the manifest."""
        return self.store.kernels

    def _runtime(self, ordinal: int) -> Any:
        rt = self._runtimes.get(ordinal)
        if rt is None:
            from .device import DeviceRuntime  # imports cuda.bindings: only once a GPU is used

            with self._lock:
                rt = self._runtimes.get(ordinal)
                if rt is None:
                    rt = self._runtimes[ordinal] = DeviceRuntime(self.store, ordinal)
        return rt

    def select(self, shapes: Sequence[Sequence[int]], device: Any = None) -> KernelEntry:
        """The kernel that would serve (m, n, k) per group on `device` (default: current)."""
        rt = self._runtime(_ordinal(device))
        key = tuple((int(m), int(n), int(k)) for m, n, k in shapes)
        return self.index.select(key, rt.arch, rt.label)

    def preload(self, device: Any = None) -> list[str]:
        """Load and verify (sha256, arch, parameter ABI, shared memory) every kernel built for
        `device`'s arch, so the first call pays no load; returns their names."""
        rt = self._runtime(_ordinal(device))
        names = []
        for entry in self.kernels:
            if entry.arch == rt.arch:
                rt.prepared(entry)
                names.append(entry.name)
        return names

    def grouped_gemm(self, a_list: Sequence[torch.Tensor], b_list: Sequence[torch.Tensor],
                     sfa_list: Sequence[torch.Tensor], sfb_list: Sequence[torch.Tensor],
                     out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """C_g = (A_g * SFA_g) @ (B_g * SFB_g)^T per group, fp32 accumulate, fp16 out.

        Launches on the current stream of the inputs' device and returns without
        synchronizing. Raises InputError (nothing launched) on invalid arguments.
        """
        shapes, ordinal, ptrs = check_inputs(a_list, b_list, sfa_list, sfb_list, out)
        rt = self._runtime(ordinal)
        entry = self.index.select(shapes, rt.arch, rt.label)
        dp = rt.plan(entry, shapes)
        overlap = None
        if out is None:
            # Fresh allocations cannot alias the inputs.
            out = [torch.empty((m, n), dtype=torch.float16, device=rt.torch_device)
                   for m, n, _ in shapes]
            ptrs[4].extend(c.data_ptr() for c in out)
        else:
            out = list(out)
            # Run by the launch path only when it builds a new pointer table: the verdict
            # depends only on (pointers, shapes), which that table's cache key covers.
            overlap = functools.partial(check_no_overlap, a_list, b_list, sfa_list, sfb_list,
                                        out)
        if dp.plan.total_tiles == 0:
            if overlap is not None:
                overlap()
            return out  # every m is 0: nothing to compute, nothing launched
        # One row per group in the manifest's column order, flattened.
        columns = [ptrs[_OPERAND[c]] for c in dp.plan.pointer_columns]
        rows = list(itertools.chain.from_iterable(zip(*columns, strict=True)))
        rt.launch(dp, rows, overlap)
        return out
