"""The sm_90a device-offsets kernel (Config.device_offsets): the serving contract of issue 26,
and with Config.masked the masked layout of issue 27.

The call is torch's scaled_grouped_mm 2D x 3D layout (or DeepGEMM's masked layout), with
nothing computed on the host: the kernel takes the operands' base addresses, offs (or masked_m),
T (or max_m), N and K as parameters. Warp 0 of each CTA derives the list kernel's three tables
from them into the CTA's own slot of the workspace, after the descriptor sets
(kernels/device_offsets.py has the derivation, the clamping that keeps bad offsets in bounds,
and the layouts); the CTA synchronizes, and the kernel runs exactly as the list kernel does on
those tables. One launch per call and no per-call host work: a captured graph serves every
routing. Every CTA reads E offsets and writes about 60 E bytes: for E = 256, 15 KB per CTA, read
back from L1/L2 by its own roles.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32

from kernels.abi import KernelArgs
from kernels.device_offsets import DeviceOffsets

from .grouped_gemm import Sm90GroupedGemm


class Sm90OffsetsGemm(DeviceOffsets, Sm90GroupedGemm):
    """Sm90GroupedGemm with the call's tables derived on the device from its offsets."""

    # ------------------------------------------------------------------ host (trace time)
    @cute.jit
    def __call__(
        self,
        offs: cute.Pointer,
        a: cute.Pointer,
        b: cute.Pointer,
        sfa: cute.Pointer,
        sfb: cute.Pointer,
        c: cute.Pointer,
        workspace: cute.Pointer,
        grid_barrier: cute.Pointer,
        alpha: cute.Pointer,
        num_groups: Int32,
        rows: Int32,
        n: Int32,
        k: Int32,
        num_ctas: Int32,
    ) -> None:
        args = KernelArgs()
        self._record_templates(args)
        self._record_call(args, offs, (a, b, sfa, sfb, c))
        self._record_state(args, workspace, grid_barrier, alpha, num_groups)
        self._record_dims(args, rows, n, k)
        self._launch(args, num_ctas)

    # ------------------------------------------------------------------ device
    @cute.kernel
    def kernel(
        self,
        tma_b: cute.CopyAtom,
        tma_a: cute.CopyAtom,
        tma_sfb: cute.CopyAtom,
        tma_sfa: cute.CopyAtom,
        offs: cute.Pointer,
        a: cute.Pointer,
        b: cute.Pointer,
        sfa: cute.Pointer,
        sfb: cute.Pointer,
        c: cute.Pointer,
        workspace: cute.Pointer,
        grid_barrier: cute.Pointer,
        alpha: cute.Pointer,
        num_groups: Int32,
        rows: Int32,
        n: Int32,
        k: Int32,
    ) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        *tables_, first_group = self._tables_in_slot(
            self._descriptors_end(workspace.toint(), grid), bidx, offs, (a, b, sfa, sfb, c),
            num_groups, rows, n, k, tidx, warp_idx,
            lambda total: self._first_tile(bidx, grid, total))
        self._run((tma_b, tma_a, tma_sfb, tma_sfa), *tables_,
                  workspace, grid_barrier, alpha, num_groups, tidx, warp_idx, bidx, grid,
                  first_group)
