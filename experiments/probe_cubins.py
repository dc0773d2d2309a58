"""The cubin directory of a start-up probe (experiments/first_load.py, first_code.py,
smem_mma.py): one kernel per size, built on a CPU machine with the DSL, run on the GPU machine
without it.

The directory holds `<prefix>_<size>.cubin` per size and index.json mapping each size to its
cubin, kernel symbol and dynamic shared memory: the build records what the run launches with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def write_probes(out: str | Path, prefix: str, sizes: Iterable[int],
                 compile_one: Callable[[int], tuple[bytes, str, int]],
                 describe: Callable[[int], str]) -> None:
    """Compile one kernel per size into `out` (created if missing) and write its index;
    `compile_one(size)` gives (cubin, symbol, dynamic shared memory bytes). Prints one line
    per kernel: its file, symbol and `describe(size)`."""
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    index = {}
    for size in sizes:
        cubin, symbol, smem = compile_one(size)
        name = f"{prefix}_{size}.cubin"
        (dest / name).write_bytes(cubin)
        index[str(size)] = {"cubin": name, "symbol": symbol, "smem": smem}
        print(f"{name}: {symbol}, {describe(size)}")
    (dest / "index.json").write_text(json.dumps(index, indent=1))


def read_probes(src: str | Path) -> list[tuple[int, bytes, bytes, int]]:
    """(size, cubin image, kernel symbol, dynamic shared memory bytes) per kernel of a probe
    directory, in index order."""
    root = Path(src)
    index = json.loads((root / "index.json").read_text())
    return [(int(size), (root / e["cubin"]).read_bytes(), e["symbol"].encode(), e["smem"])
            for size, e in index.items()]


class ProbeRunner:
    """The GPU side of a probe (no DSL): modules loaded with the driver, synchronized launches
    of CTAS CTAs on the current stream, and the stamp record every probe kernel writes
    (`stamps` int64 per CTA, at the `out` pointer each launch passes first)."""

    def __init__(self, ctas: int, stamps: int, sink_words: int = 0) -> None:
        import torch
        from cuda.bindings import driver

        from runtime.cuda import check

        self._torch, self._driver, self._check = torch, driver, check
        torch.zeros(1, device="cuda")  # the primary context, current on this thread
        self.ctas, self.per_cta = ctas, stamps
        self.out = torch.zeros(ctas * stamps, dtype=torch.int64, device="cuda")
        # A buffer the kernels write their results into, so that no work is dead code.
        self.sink = torch.zeros(max(sink_words, 1), dtype=torch.int32, device="cuda")
        self.stream = torch.cuda.current_stream().cuda_stream
        self.device_name = torch.cuda.get_device_name()
        self._modules: list = []

    def function(self, image: bytes, symbol: bytes, smem: int = 0) -> Any:
        """Load `image` as a new module (kept until close) and return its kernel `symbol`,
        allowed `smem` bytes of dynamic shared memory."""
        driver, check = self._driver, self._check
        module = check(driver.cuModuleLoadData(image), "cuModuleLoadData")
        self._modules.append(module)
        function = check(driver.cuModuleGetFunction(module, symbol), "cuModuleGetFunction")
        if smem:
            check(driver.cuFuncSetAttribute(
                function,
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem), "cuFuncSetAttribute")
        return function

    def launch(self, function: Any, threads: int, smem: int,
               pointers: tuple[int, ...]) -> list[list[int]]:
        """Launch alone (the GPU idle before and after) with these pointer arguments; returns
        each CTA's stamps."""
        import ctypes

        self._torch.cuda.synchronize()
        params = (pointers, (ctypes.c_void_p,) * len(pointers))
        self._check(self._driver.cuLaunchKernel(function, self.ctas, 1, 1, threads, 1, 1, smem,
                                                self.stream, params, 0), "cuLaunchKernel")
        self._torch.cuda.synchronize()
        return self.out.view(self.ctas, self.per_cta).cpu().tolist()

    def close(self) -> None:
        """Unload every module this runner loaded."""
        for module in self._modules:
            self._check(self._driver.cuModuleUnload(module), "cuModuleUnload")
        self._modules.clear()
