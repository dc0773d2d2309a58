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

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from kernels.abi import KernelArgs
from kernels.device_offsets import DeviceOffsets
from runtime.formats import POINTER_ROW_BYTES, PROBLEM_ROW_BYTES, offsets_tables_bytes

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
        if cutlass.const_expr(self.config.masked):
            args.operand("masked_m", offs, "masked_m")
        else:
            args.operand("offs", offs, "offs")
        for name, ptr in (("a", a), ("b", b), ("sfa", sfa), ("sfb", sfb), ("c", c)):
            args.operand(name, ptr, name)
        self._record_state(args, workspace, grid_barrier, alpha, num_groups)
        if cutlass.const_expr(self.config.masked):
            args.scalar("max_m", rows, "max_m")
        else:
            args.scalar("rows", rows, "rows")
        args.scalar("n", n, "n")
        args.scalar("k", k, "k")
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
        slot = (self._descriptors_end(workspace.toint(), grid)
                + Int64(bidx) * Int64(offsets_tables_bytes(num_groups)))
        sizes_at = slot + Int64(POINTER_ROW_BYTES) * Int64(num_groups)
        prefix_at = sizes_at + Int64(PROBLEM_ROW_BYTES) * Int64(num_groups)
        if warp_idx == 0:
            self._derive_tables(offs, (a, b, sfa, sfb, c), slot, sizes_at, prefix_at,
                                num_groups, rows, n, k, tidx)
        # The tables (plain global stores of warp 0) are read by every role from here on.
        cute.arch.barrier()
        gmem = cute.AddressSpace.gmem
        self._run((tma_b, tma_a, tma_sfb, tma_sfa),
                  cute.make_ptr(Int32, sizes_at, gmem, assumed_align=8),
                  cute.make_ptr(Int64, slot, gmem, assumed_align=16),
                  cute.make_ptr(Int32, prefix_at, gmem, assumed_align=8),
                  workspace, grid_barrier, alpha, num_groups, tidx, warp_idx, bidx, grid)
