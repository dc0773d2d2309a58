"""The sm_100a device-offsets kernel (Config.device_offsets): the serving contract of issue 26
(and with Config.masked the masked layout of issue 27) on the original tcgen05 kernel.

The launch takes the call's expert offsets (or masked_m), the operands' base addresses, T (or
max_m), N and K instead of host-built tables. Warp 0 of each CTA derives the list kernel's
tables into the CTA's slot of the workspace, after the CTAs' descriptor slots
(kernels/device_offsets.py, runtime.formats.offsets_tables_bytes); the CTA synchronizes and the
kernel body runs unchanged on them (its tile walk steps over experts without tokens).

**No B200 here: built, ABI- and PTX-checked only, never run.**
"""

from __future__ import annotations

import cutlass
from cutlass import Int64, cute

from kernels import abi, tables
from kernels.device_offsets import DeviceOffsets, lane_scan
from kernels.sm100 import config as sm100_config
from kernels.sm100.grouped_gemm import NUM_TENSORMAPS, SYMBOL_PREFIX, Sm100GroupedGemm


class Sm100OffsetsGemm(DeviceOffsets, Sm100GroupedGemm):
    """Sm100GroupedGemm with the call's tables derived on the device."""

    def __init__(self, config: sm100_config.Config) -> None:
        super().__init__(config)
        self.tile_m, self.tile_n = sm100_config.TILE_M, sm100_config.TILE_N

    @cute.jit
    def _lane_scan(self, count, lane) -> tuple:
        return lane_scan(count, lane)

    @cute.jit
    def __call__(
        self,
        offs: cute.Pointer,
        a: cute.Pointer,
        b: cute.Pointer,
        sfa: cute.Pointer,
        sfb: cute.Pointer,
        c: cute.Pointer,
        tensormap_workspace: cute.Pointer,
        alpha: cute.Pointer,
        num_groups: cutlass.Int32,
        rows: cutlass.Int32,
        n: cutlass.Int32,
        k: cutlass.Int32,
    ):
        args: abi.KernelArgs = self.abi
        self._record_traced(args)
        self._record_call(args, offs, (a, b, sfa, sfb, c))
        args.table("tensormap_workspace", tensormap_workspace, "tensormap_workspace")
        args.table("alpha", alpha, "alpha")
        args.scalar("num_groups", num_groups, "num_groups")
        self._record_dims(args, rows, n, k)
        self._launch(args, num_groups)

    @cute.kernel
    def kernel(
        self,
        tiled_mma: cute.TiledMma,
        tma_atom_a: cute.CopyAtom,
        mA_mkl: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB_nkl: cute.Tensor,
        tma_atom_sfa: cute.CopyAtom,
        mSFA_mkl: cute.Tensor,
        tma_atom_sfb: cute.CopyAtom,
        mSFB_nkl: cute.Tensor,
        a_smem_layout_staged: cute.ComposedLayout,
        b_smem_layout_staged: cute.ComposedLayout,
        sfa_smem_layout_staged: cute.Layout,
        sfb_smem_layout_staged: cute.Layout,
        offs: cute.Pointer,
        a: cute.Pointer,
        b: cute.Pointer,
        sfa: cute.Pointer,
        sfb: cute.Pointer,
        c: cute.Pointer,
        workspace_ptr: cute.Pointer,
        alpha_ptr: cute.Pointer,
        num_groups: cutlass.Int32,
        rows: cutlass.Int32,
        n: cutlass.Int32,
        k: cutlass.Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        descriptors_end = (workspace_ptr.toint()
                           + Int64(grid) * Int64(NUM_TENSORMAPS * tables.TENSORMAP_BYTES))
        tables_ = self._tables_in_slot(descriptors_end, bidx, offs, (a, b, sfa, sfb, c),
                                       num_groups, rows, n, k, tidx, warp_idx)
        self._body((tiled_mma, tma_atom_a, mA_mkl, tma_atom_b, mB_nkl, tma_atom_sfa, mSFA_mkl,
                    tma_atom_sfb, mSFB_nkl, a_smem_layout_staged, b_smem_layout_staged,
                    sfa_smem_layout_staged, sfb_smem_layout_staged), *tables_,
                   workspace_ptr, alpha_ptr, num_groups)

    # The base kernel's symbol rule (grouped_gemm.py: "cutlass" kept in the name on purpose).
    kernel.set_name_prefix(SYMBOL_PREFIX, remove_cutlass_symbol=False, keep_mangled_name=False)
