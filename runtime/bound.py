"""BoundGemm: one grouped_gemm call whose tensors are fixed, validated and planned once
(GroupedGemm.bind), for serving loops that write each step's values into the same tensors.

A call through grouped_gemm's fast path still checks every tensor's type, dtype, shape and
strides (one C++ guard) and reads every data pointer: about 11 us of host time at 8 groups
(40 tensors), next to a 5 us launch. A bound call checks nothing: it launches the plan it was
bound to, with the pointer table built at its first call. What the caller promises instead:

- the bound tensors keep their storage, shapes, strides and dtypes: write new values into them
  in place (`copy_`, slicing assignment, kernels writing into them), never `resize_`, `set_`
  or assign `.data`;
- nothing else writes into `out` while a bound call is in flight (as for grouped_gemm).

The BoundGemm holds a reference to every bound tensor, so none is freed (and its memory reused)
while it lives. Under CUDA-graph capture, or when the pointer table was evicted from the
device's cache, a call takes the runtime's full launch path, with the same arguments.
"""

from __future__ import annotations

from typing import Any

import torch


class BoundGemm:
    """A bound grouped_gemm call; `bound()` launches it and returns its output tensors."""

    __slots__ = ("_alpha", "_dp", "_inputs", "_out", "_ptrs", "_rt")

    def __init__(self, inputs: tuple[torch.Tensor, ...], out: list[torch.Tensor], rt: Any,
                 dp: Any, ptrs: tuple[int, ...], alpha: int) -> None:
        # The input tensors (alpha's included) are held only so that their memory outlives the
        # bound call; the outputs are held as what every call returns. rt / dp None: every m
        # is 0. alpha: the bound alpha's device address, 0 for none.
        self._inputs, self._out, self._rt, self._dp, self._ptrs = inputs, tuple(out), rt, dp, ptrs
        self._alpha = alpha

    @property
    def out(self) -> list[torch.Tensor]:
        """The output tensors every call writes ((m, n) per group, bf16 or fp16)."""
        return list(self._out)

    @property
    def kernel(self) -> str | None:
        """The name of the kernel this call launches (None when every m is 0)."""
        return None if self._dp is None else self._dp.plan.entry.name

    def __call__(self) -> list[torch.Tensor]:
        """Launch on the current stream of the tensors' device; returns without syncing."""
        dp = self._dp
        if dp is not None and not self._rt.launch_cached(dp, self._ptrs, self._alpha):
            # The first call, an evicted pointer table, or stream capture. The overlap check
            # ran at bind time.
            self._rt.launch(dp, self._ptrs, None, self._alpha)
        return list(self._out)

    def __repr__(self) -> str:
        return f"BoundGemm(kernel={self.kernel!r}, groups={len(self._out)})"
