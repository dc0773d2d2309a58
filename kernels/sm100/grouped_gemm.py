"""NVFP4 block-scaled grouped GEMM for Blackwell (sm_100a): the original tcgen05 kernel, flat ABI.

Op, for every group g of one launch (G groups, each with its own m, n, k; l = 1):

    C_g[m, n] = alpha[g] * sum_k (A_g[m, k] * SFA_g[m, k // 16]) * (B_g[n, k] * SFB_g[n, k // 16])

    A_g  (m, k)  fp4 e2m1, K-major, two values per byte        (pointer table column "a")
    B_g  (n, k)  fp4 e2m1, K-major                              (column "b")
    SFA_g, SFB_g fp8 e4m3, one per 16 K elements, blocked layout of 512-byte atoms (128 rows x 4
                 scale columns, M-block outer, K-block inner; see shared/facts.md)
                                                                 (columns "sfa", "sfb")
    C_g  (m, n)  Config.out_dtype (fp16 or bf16), row-major       (column "c")
    alpha        fp32, one per group (table "alpha"; the runtime passes ones when the caller
                 gives none, so the multiply is unconditional)
    fp32 accumulation in tensor memory; alpha[g] scales the fp32 accumulator before the cast.

Data path (one persistent CTA per SM, 192 threads, cluster 1x1x1):
    warp 5 (TMA): walks this CTA's tiles; on a group change patches the CTA's four TMA descriptors
        (a, b, sfa, sfb) in its global workspace (address, dims, strides) and fences them; then for
        each K tile of 256 loads A, B (128x256 fp4 each, 128B swizzle) and SFA, SFB into one of
        `ab_stages` shared-memory stages (PipelineTmaUmma).
    warp 4 (MMA): copies the stage's scale factors smem -> TMEM (tcgen05.cp) and issues
        tcgen05.mma block-scaled (MmaMXF4NVF4Op, 128x128x64, sf_vec 16) four times per K tile into
        one of `acc_stages` TMEM accumulators; hands the tile's (coords, m, n, c pointer, alpha)
        to the epilogue through shared memory (PipelineUmmaAsync); alpha[g] is read from global
        memory once per group change, like the problem sizes.
    warps 0-3 (epilogue): TMEM -> registers (tcgen05.ld 32x32b, one row per thread), fp32 * alpha
        -> out_dtype, 128-bit stores when the tile is full in N, 16-bit predicated stores
        otherwise; rows >= m and columns >= n are never written.

Scheduling: tiles are numbered group by group (m-tile fastest, then n-tile) through the CTA prefix
table; CTA b owns the contiguous range [b * ceil(T / grid), ...), T = cta_prefix[G]. The group of
the first tile is found with a run-time binary search over the prefix table, later ones by walking
forward, so one cubin serves any group count and any persistent grid (the kernel reads
%nctaid; no SM count is baked in).

Launch ABI (kernel parameters, in order; recorded through kernels.abi.KernelArgs):
    tiled_mma            zeros   12-byte tcgen05 MMA state (accumulate flag, SF TMEM addresses)
    tma_a, tma_b         tma_template  CUtensorMap (128 B, align 64), fp4 16U4_ALIGN8B, 128B swizzle
    tma_sfa, tma_sfb     tma_template  CUtensorMap, UINT16 view of the blocked scale layout
    problem_sizes        table   int32 (G, 4) m, n, k, l
    pointers             table   int64 (G, 5) a, b, sfa, sfb, c
    cta_prefix           table   int32 (G + 1,) prefix sums of 128x128 output tiles
    tensormap_workspace  table   4 x 128 bytes per launched CTA, indexed by blockIdx.x
    alpha                table   float32 (G,) per-group scale of the accumulator
    num_groups           scalar  int32 G
The TMA coordinate tensors and the shared-memory layouts are kernel arguments too, but static: they
lower to no parameter (checked by KernelArgs.static).

Placeholder tensors: the four TMA atoms are built from null-pointer tensors with STATIC extents
(m, n: 2**20 rows, k: 2**16, l: 1), so their coordinate tensors are static (no parameters) and
every tile mode keeps an extent > 1 and its stride: the per-tile coordinates (k-tile * 256,
m- or n-tile * 128; SF: k-tile * 4 atoms, m- or n-tile atom) are computed from the run-time tile
index, never folded to 0 (tests/test_sm100_compile.py checks the PTX). The static l of 1 makes the
DSL drop L from the descriptors: A/B are rank 2 (k, rows), SF rank 3 (256 x 16-bit atom, k atoms,
row atoms). The extents only shape the template the runtime encodes with cuTensorMapEncodeTiled
(dims <= 2**32, byte strides < 2**40); the kernel re-points address, dims and strides per group,
and coordinates are linear in the tile index, so they do not limit the problem size.

Constraints: k % 256 == 0 (whole K tiles), n % 8 == 0 (16-byte C rows for the 128-bit stores),
n, k > 0 and l == 1 for every group (m = 0 is legal: the forward walk steps over groups
without tiles; until 2026-12-04 it stepped one group at a time, which a dynamic-m call with an
empty group would have broken);
m * n < 2**31 (C offsets are 32-bit, as in the original); A, B, SFA, SFB, C and the tables 16-byte
aligned (alpha: 4-byte); the tensormap workspace 128-byte aligned with 512 bytes per launched CTA,
never shared by launches that can overlap.

Build (needs no GPU; the arch is read once when cutlass is imported, so build in a process that
sets CUTE_DSL_ARCH first):

    python build_kernels.py build --only dense_a       # through the builder (one worker per arch)
    CUTE_DSL_ARCH=sm_100a python -c "from kernels.sm100.config import Config; \\
        from kernels.sm100.grouped_gemm import compile_kernel; \\
        print(compile_kernel(Config(), arch='sm_100a', groups=[(128, 4096, 7168)]).symbol)"
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any

import cutlass
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass import cute, pipeline
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.cute.runtime import make_ptr
from cutlass.memory import SmemAllocator, TmemAllocator
from cutlass.tensor_utils import TensorMapManager, TensorMapUpdateMode

from kernels import abi, tables
from kernels.introspect import (
    lowered_launch,
    ptx_cluster_dims,
    ptx_reqntid,
    sf_tma_geometry,
    subbyte_tma_geometry,
    tma_swizzle,
)
from kernels.sm100 import config as sm100_config

ARCH = "sm_100a"
SYMBOL_PREFIX = "nvfp4_gg_sm100"  # the DSL appends "_cutlass_<n>" (see kernel.set_name_prefix)

AB_DTYPE = cutlass.Float4E2M1FN
SF_DTYPE = cutlass.Float8E4M3FN
# The element type C is written in, by Config.out_dtype (runtime.manifest.OUT_DTYPES).
C_DTYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}
SF_VEC = 16
MMA_TILER = (sm100_config.TILE_M, sm100_config.TILE_N, sm100_config.K_TILE)  # (128, 128, 256)
MMA_INST_K = 64  # K of one tcgen05 block-scaled MMA instruction: 4 per K tile

EPILOGUE_WARPS = 4
MMA_WARP = 4
TMA_WARP = 5
THREADS = 32 * (EPILOGUE_WARPS + 2)

NUM_TENSORMAPS = 4  # a, b, sfa, sfb
TENSORMAP_I64 = tables.TENSORMAP_BYTES // 8
# Named barriers (0 is __syncthreads).
TMEM_ALLOC_BARRIER = 1  # every warp but the TMA warp waits for the TMEM allocation
TENSORMAP_INIT_BARRIER = 2  # MMA warp (writes the templates) and TMA warp (patches them)

# Static placeholder extents of the TMA atoms (see the module docstring). The recorded templates
# stay within cuTensorMapEncodeTiled's limits (dims <= 2**32, byte strides < 2**40): A/B rows
# 2**15 B apart, SF k atoms 512 B and row atoms 2**19 B apart; L (1) is dropped by the DSL.
PLACEHOLDER_MN = 1 << 20
PLACEHOLDER_K = 1 << 16
# The tcgen05 TiledMma lowers to {i1 accumulate, i1, i1, i32 sfa_tmem, i32 sfb_tmem}: 12 bytes,
# align 4 (PTX `.param .align 4 .b8 ..._param_0[12]`). The kernel sets every field before use,
# so the host passes zeros. The builder checks this against PTX.
MMA_STATE_BYTES, MMA_STATE_ALIGN = 12, 4
# L2 promotion of the templates: CuTe C++'s TMA default (CU_TENSOR_MAP_L2_PROMOTION_L2_128B). The
# DSL does not expose its choice; its packed descriptors hold the same 2-bit value (2) in every
# atom probed, which is consistent with 128B but not proof of it.
L2_PROMOTION = "128B"
# Opt-in shared memory per block on sm_100 (232448 = 227 KiB), the DSL's own bound; the stage
# arithmetic that limits ab_stages lives in config.py, where shapes.yaml validation sees it.
SM100_MAX_DYNAMIC_SMEM = sm100_config.SMEM_LIMIT


def _ceil_div(a: Any, b: Any) -> Any:
    return (a + b - 1) // b


class Sm100GroupedGemm:
    """Persistent warp-specialized NVFP4 grouped GEMM (tcgen05, TMEM accumulators).

    Build-time configuration only (`kernels.sm100.config.Config`): `acc_stages` TMEM accumulator
    buffers (1 or 2; 2 overlaps the epilogue of a tile with the MMAs of the next), `ab_stages`
    shared-memory stages of the A/B/SFA/SFB pipeline, and `out_dtype`, the element type of C.
    Everything per call (group count, shapes, pointers, alpha, grid) is read on the device.
    `abi` collects the launch ABI while `__call__` traces, so an instance is compiled once (a
    second trace fails: KernelArgs rejects repeated names).
    """

    def __init__(self, config: sm100_config.Config) -> None:
        reasons = sm100_config.check(config)
        if reasons:
            raise ValueError("invalid sm100 config: " + "; ".join(reasons))
        self.config = config
        self.acc_stages = config.acc_stages
        self.ab_stages = config.ab_stages
        self.c_dtype = C_DTYPES[config.out_dtype]  # what the epilogue rounds C to
        self.abi = abi.KernelArgs()

    # ----------------------------------------------------------------------------------------
    # Host side (traced once by cute.compile; never run: the runtime launches the cubin itself)
    # ----------------------------------------------------------------------------------------

    @cute.jit
    def __call__(
        self,
        problem_sizes: cute.Pointer,
        pointers: cute.Pointer,
        cta_prefix: cute.Pointer,
        tensormap_workspace: cute.Pointer,
        alpha: cute.Pointer,
        num_groups: cutlass.Int32,
    ):
        args = self.abi
        self._record_traced(args)
        args.table("problem_sizes", problem_sizes, "problem_sizes")
        args.table("pointers", pointers, "pointers")
        args.table("cta_prefix", cta_prefix, "cta_prefix")
        args.table("tensormap_workspace", tensormap_workspace, "tensormap_workspace")
        args.table("alpha", alpha, "alpha")
        args.scalar("num_groups", num_groups, "num_groups")
        self._launch(args, num_groups)

    def _record_traced(self, args: abi.KernelArgs) -> None:
        """The kernel's first parameters: the MMA state, the four TMA templates with their
        (static) coordinate tensors, and the (static) shared-memory layouts."""
        tiled_mma = self._make_tiled_mma()
        a_smem, b_smem, sfa_smem, sfb_smem = self._make_smem_layouts(tiled_mma, self.ab_stages)

        a_shape, a_stride = self._placeholder_ab(PLACEHOLDER_MN)
        b_shape, b_stride = self._placeholder_ab(PLACEHOLDER_MN)
        ph_a = cute.make_tensor(self._null(AB_DTYPE), cute.make_layout(a_shape, stride=a_stride))
        ph_b = cute.make_tensor(self._null(AB_DTYPE), cute.make_layout(b_shape, stride=b_stride))
        # ((Atom_MN, Rest_MN), (Atom_K, Rest_K), RestL): the blocked scale layout.
        ph_sfa = cute.make_tensor(
            self._null(SF_DTYPE), blockscaled_utils.tile_atom_to_shape_SF(a_shape, SF_VEC)
        )
        ph_sfb = cute.make_tensor(
            self._null(SF_DTYPE), blockscaled_utils.tile_atom_to_shape_SF(b_shape, SF_VEC)
        )

        g2s = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        cluster_vmnk = cute.tiled_divide(cute.make_layout((1, 1, 1)), (tiled_mma.thr_id.shape,))
        stage0 = (None, None, None, 0)
        tma_a, coords_a = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, ph_a, cute.slice_(a_smem, stage0), MMA_TILER, tiled_mma, cluster_vmnk.shape
        )
        tma_b, coords_b = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, ph_b, cute.slice_(b_smem, stage0), MMA_TILER, tiled_mma, cluster_vmnk.shape
        )
        # Scale factors move as 16-bit elements (TMA has no 8-bit float format here).
        tma_sfa, coords_sfa = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, ph_sfa, cute.slice_(sfa_smem, stage0), MMA_TILER, tiled_mma,
            cluster_vmnk.shape, internal_type=cutlass.Int16,
        )
        tma_sfb, coords_sfb = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, ph_sfb, cute.slice_(sfb_smem, stage0), MMA_TILER, tiled_mma,
            cluster_vmnk.shape, internal_type=cutlass.Int16,
        )

        args.zeros("tiled_mma", tiled_mma, MMA_STATE_BYTES, MMA_STATE_ALIGN)
        args.tma_template("tma_a", tma_a, "a", subbyte_tma_geometry(
            tma_a, a_shape, a_stride, tma_swizzle(a_smem), L2_PROMOTION))
        args.static("coords_a", coords_a)
        args.tma_template("tma_b", tma_b, "b", subbyte_tma_geometry(
            tma_b, b_shape, b_stride, tma_swizzle(b_smem), L2_PROMOTION))
        args.static("coords_b", coords_b)
        args.tma_template("tma_sfa", tma_sfa, "sfa", sf_tma_geometry(
            tma_sfa, a_shape, SF_VEC, tma_swizzle(sfa_smem), L2_PROMOTION))
        args.static("coords_sfa", coords_sfa)
        args.tma_template("tma_sfb", tma_sfb, "sfb", sf_tma_geometry(
            tma_sfb, b_shape, SF_VEC, tma_swizzle(sfb_smem), L2_PROMOTION))
        args.static("coords_sfb", coords_sfb)
        args.static("a_smem_layout", a_smem)
        args.static("b_smem_layout", b_smem)
        args.static("sfa_smem_layout", sfa_smem)
        args.static("sfb_smem_layout", sfb_smem)

    def _launch(self, args: abi.KernelArgs, num_groups: cutlass.Int32) -> None:
        """Launch `self.kernel` on the recorded arguments (trace time only)."""
        # The grid here only feeds the DSL's own launcher, which is never used. It is a run-time
        # value so that no exact grid is recorded that the compiler could fold %nctaid with.
        self.kernel(*args.values()).launch(
            grid=(num_groups, 1, 1), block=(THREADS, 1, 1), cluster=(1, 1, 1)
        )

    # ----------------------------------------------------------------------------------------
    # Device side
    # ----------------------------------------------------------------------------------------

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
        problem_sizes_ptr: cute.Pointer,
        pointers_ptr: cute.Pointer,
        cta_prefix_ptr: cute.Pointer,
        workspace_ptr: cute.Pointer,
        alpha_ptr: cute.Pointer,
        num_groups: cutlass.Int32,
    ):
        self._body((tiled_mma, tma_atom_a, mA_mkl, tma_atom_b, mB_nkl, tma_atom_sfa, mSFA_mkl,
                    tma_atom_sfb, mSFB_nkl, a_smem_layout_staged, b_smem_layout_staged,
                    sfa_smem_layout_staged, sfb_smem_layout_staged),
                   problem_sizes_ptr, pointers_ptr, cta_prefix_ptr, workspace_ptr, alpha_ptr,
                   num_groups)

    @cute.jit
    def _body(self, traced, problem_sizes_ptr, pointers_ptr, cta_prefix_ptr, workspace_ptr,
              alpha_ptr, num_groups):
        """The kernel once its tables are in device memory (`traced`: the MMA, TMA atoms,
        coordinate tensors and shared-memory layouts, in the kernel's parameter order)."""
        (tiled_mma, tma_atom_a, mA_mkl, tma_atom_b, mB_nkl, tma_atom_sfa, mSFA_mkl,
         tma_atom_sfb, mSFB_nkl, a_smem_layout_staged, b_smem_layout_staged,
         sfa_smem_layout_staged, sfb_smem_layout_staged) = traced
        acc_stages = self.acc_stages
        ab_stages = self.ab_stages
        c_dtype = self.c_dtype
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        is_epilogue_warp = warp_idx < EPILOGUE_WARPS
        is_mma_warp = warp_idx == MMA_WARP
        is_tma_warp = warp_idx == TMA_WARP

        # Device tables (layouts: kernels/tables.py).
        problem_sizes = cute.make_tensor(
            problem_sizes_ptr,
            cute.make_layout((num_groups, len(tables.PROBLEM_COLUMNS)),
                             stride=(len(tables.PROBLEM_COLUMNS), 1)),
        )
        group_ptrs = cute.make_tensor(
            pointers_ptr,
            cute.make_layout((num_groups, len(tables.POINTER_COLUMNS)),
                             stride=(len(tables.POINTER_COLUMNS), 1)),
        )
        cta_prefix = cute.make_tensor(cta_prefix_ptr, cute.make_layout((num_groups + 1,)))
        alpha = cute.make_tensor(alpha_ptr, cute.make_layout((num_groups,)))

        # Persistent schedule: this CTA owns tiles [tile_start, tile_end).
        bidx, _, _ = cute.arch.block_idx()
        grid_dim_x, _, _ = cute.arch.grid_dim()
        total_tiles = cta_prefix[num_groups]
        tiles_per_cta = _ceil_div(total_tiles, grid_dim_x)
        tile_start = bidx * tiles_per_cta
        tile_end = tile_start + tiles_per_cta
        if tile_end > total_tiles:
            tile_end = total_tiles

        # Shared memory.
        @cute.struct
        class SharedStorage:
            tensormap_buffer: cute.struct.MemRange[cutlass.Int64, NUM_TENSORMAPS * TENSORMAP_I64]
            ab_mbar_ptr: cute.struct.MemRange[cutlass.Int64, ab_stages * 2]
            acc_mbar_ptr: cute.struct.MemRange[cutlass.Int64, acc_stages * 2]
            tmem_holding_buf: cutlass.Int32

        smem = SmemAllocator()
        storage = smem.allocate(SharedStorage)
        # (MMA, MMA_M, MMA_K, STAGE)
        sA = smem.allocate_tensor(AB_DTYPE, a_smem_layout_staged.outer, 128,
                                  a_smem_layout_staged.inner)
        sB = smem.allocate_tensor(AB_DTYPE, b_smem_layout_staged.outer, 128,
                                  b_smem_layout_staged.inner)
        sSFA = smem.allocate_tensor(SF_DTYPE, sfa_smem_layout_staged, 128)
        sSFB = smem.allocate_tensor(SF_DTYPE, sfb_smem_layout_staged, 128)
        # Per accumulator stage, what the epilogue needs to know about the tile it drains.
        stage_layout = cute.make_layout((acc_stages,), stride=(1,))
        tile_coord_x_smem = smem.allocate_tensor(cutlass.Int32, stage_layout, 16)
        tile_coord_y_smem = smem.allocate_tensor(cutlass.Int32, stage_layout, 16)
        tile_m_smem = smem.allocate_tensor(cutlass.Int32, stage_layout, 16)
        tile_n_smem = smem.allocate_tensor(cutlass.Int32, stage_layout, 16)
        tile_l_smem = smem.allocate_tensor(cutlass.Int32, stage_layout, 16)
        tile_c_ptr_smem = smem.allocate_tensor(cutlass.Int64, stage_layout, 16)
        tile_alpha_smem = smem.allocate_tensor(cutlass.Float32, stage_layout, 16)

        # Pipelines: smem stages (TMA -> MMA) and TMEM accumulators (MMA -> epilogue).
        stage0 = (None, None, None, 0)
        num_tma_load_bytes = (  # bytes one stage receives: A + B + SFA + SFB tiles
            cute.size_in_bytes(AB_DTYPE, cute.slice_(a_smem_layout_staged, stage0))
            + cute.size_in_bytes(AB_DTYPE, cute.slice_(b_smem_layout_staged, stage0))
            + cute.size_in_bytes(SF_DTYPE, cute.slice_(sfa_smem_layout_staged, stage0))
            + cute.size_in_bytes(SF_DTYPE, cute.slice_(sfb_smem_layout_staged, stage0))
        )
        ab_producer, ab_consumer = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_mbar_ptr.data_ptr(),
            num_stages=ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            tx_count=num_tma_load_bytes,
        ).make_participants()
        acc_producer, acc_consumer = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_mbar_ptr.data_ptr(),
            num_stages=acc_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, EPILOGUE_WARPS * 32),
        ).make_participants()

        # Global tiles: (bM, bK, RestM, RestK, RestL) and (bN, bK, RestN, RestK, RestL).
        tile_mk = cute.slice_(MMA_TILER, (None, 0, None))
        tile_nk = cute.slice_(MMA_TILER, (0, None, None))
        all_tiles = (None, None, None)
        gA_mkl = cute.local_tile(mA_mkl, tile_mk, all_tiles)
        gB_nkl = cute.local_tile(mB_nkl, tile_nk, all_tiles)
        gSFA_mkl = cute.local_tile(mSFA_mkl, tile_mk, all_tiles)
        gSFB_nkl = cute.local_tile(mSFB_nkl, tile_nk, all_tiles)
        # The MMA partition domain is 128 threads: fold the MMA and TMA warps onto 0..63.
        mma_part_slice_idx = tidx
        if mma_part_slice_idx >= EPILOGUE_WARPS * 32:
            mma_part_slice_idx = mma_part_slice_idx - EPILOGUE_WARPS * 32
        thr_mma = tiled_mma.get_slice(mma_part_slice_idx)
        # (MMA, MMA_M, MMA_K, RestM, RestK, RestL)
        tCgA = thr_mma.partition_A(gA_mkl)
        tCgB = thr_mma.partition_B(gB_nkl)
        tCgSFA = thr_mma.partition_A(gSFA_mkl)
        tCgSFB = thr_mma.partition_B(gSFB_nkl)

        # Per-CTA descriptor workspace: 4 x 128 bytes at blockIdx.x, patched per group (GMEM mode).
        tensormap_manager = TensorMapManager(TensorMapUpdateMode.GMEM, tables.TENSORMAP_BYTES)
        cta_maps = workspace_ptr + bidx * (NUM_TENSORMAPS * TENSORMAP_I64)
        tensormap_a_gmem_ptr = tensormap_manager.get_tensormap_ptr(cta_maps)
        tensormap_b_gmem_ptr = tensormap_manager.get_tensormap_ptr(cta_maps + TENSORMAP_I64)
        tensormap_sfa_gmem_ptr = tensormap_manager.get_tensormap_ptr(cta_maps + 2 * TENSORMAP_I64)
        tensormap_sfb_gmem_ptr = tensormap_manager.get_tensormap_ptr(cta_maps + 3 * TENSORMAP_I64)
        tensormap_smem_ptr = storage.tensormap_buffer.data_ptr()
        tensormap_init_barrier = pipeline.NamedBarrier(
            barrier_id=TENSORMAP_INIT_BARRIER, num_threads=64
        )
        # The MMA warp copies the four templates (kernel parameters) into the workspace; the TMA
        # warp patches them per group once both have passed the barrier.
        if is_tma_warp or is_mma_warp:
            if is_mma_warp:
                tensormap_manager.init_tensormap_from_atom(
                    tma_atom_a, tensormap_a_gmem_ptr, MMA_WARP)
                tensormap_manager.init_tensormap_from_atom(
                    tma_atom_b, tensormap_b_gmem_ptr, MMA_WARP)
                tensormap_manager.init_tensormap_from_atom(
                    tma_atom_sfa, tensormap_sfa_gmem_ptr, MMA_WARP)
                tensormap_manager.init_tensormap_from_atom(
                    tma_atom_sfb, tensormap_sfb_gmem_ptr, MMA_WARP)
            tensormap_init_barrier.arrive_and_wait()

        # TMA partitions: ((atom_v, rest_v), STAGE) and ((atom_v, rest_v), RestM, RestK, RestL).
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a, 0, cute.make_layout(1),
            cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3),
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b, 0, cute.make_layout(1),
            cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3),
        )
        tAsSFA, tAgSFA = cpasync.tma_partition(
            tma_atom_sfa, 0, cute.make_layout(1),
            cute.group_modes(sSFA, 0, 3), cute.group_modes(tCgSFA, 0, 3),
        )
        tAsSFA = cute.filter_zeros(tAsSFA)
        tAgSFA = cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cpasync.tma_partition(
            tma_atom_sfb, 0, cute.make_layout(1),
            cute.group_modes(sSFB, 0, 3), cute.group_modes(tCgSFB, 0, 3),
        )
        tBsSFB = cute.filter_zeros(tBsSFB)
        tBgSFB = cute.filter_zeros(tBgSFB)

        # MMA fragments: (MMA, MMA_M, MMA_K, STAGE) in smem, (MMA, MMA_M, MMA_N) in TMEM.
        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        acc_shape = tiled_mma.partition_shape_C(MMA_TILER[:2])
        tCtAcc_fake = tiled_mma.make_fragment_C(acc_shape)
        tCtSFA_layout = blockscaled_utils.make_tmem_layout_sfa(
            tiled_mma, MMA_TILER, SF_VEC, cute.slice_(sfa_smem_layout_staged, (None, None, None, 0))
        )
        tCtSFB_layout = blockscaled_utils.make_tmem_layout_sfb(
            tiled_mma, MMA_TILER, SF_VEC, cute.slice_(sfb_smem_layout_staged, (None, None, None, 0))
        )
        null_sf = cute.make_ptr(SF_DTYPE, 0, cute.AddressSpace.gmem, assumed_align=16)
        acc_cols = tcgen05.find_tmem_tensor_col_offset(tCtAcc_fake)
        sfa_cols = tcgen05.find_tmem_tensor_col_offset(cute.make_tensor(null_sf, tCtSFA_layout))
        sfb_cols = tcgen05.find_tmem_tensor_col_offset(cute.make_tensor(null_sf, tCtSFB_layout))

        # TMEM: acc_stages accumulators, then SFA, then SFB columns.
        tmem = TmemAllocator(
            storage.tmem_holding_buf,
            barrier_for_retrieve=pipeline.NamedBarrier(
                barrier_id=TMEM_ALLOC_BARRIER, num_threads=THREADS - 32
            ),
        )
        tmem.allocate(self._compute_tmem_cols(acc_cols * acc_stages + sfa_cols + sfb_cols))
        if not is_tma_warp:
            tmem.wait_for_alloc()
        acc_tmem_base_ptr = tmem.retrieve_ptr(cutlass.Float32)
        tCtAcc_stage0 = cute.make_tensor(acc_tmem_base_ptr, tCtAcc_fake.layout)
        sfa_tmem_ptr = cute.recast_ptr(acc_tmem_base_ptr + acc_cols * acc_stages, dtype=SF_DTYPE)
        tCtSFA = cute.make_tensor(sfa_tmem_ptr, tCtSFA_layout)
        sfb_tmem_ptr = cute.recast_ptr(
            acc_tmem_base_ptr + acc_cols * acc_stages + sfa_cols, dtype=SF_DTYPE
        )
        tCtSFB = cute.make_tensor(sfb_tmem_ptr, tCtSFB_layout)

        # Scale factors smem -> TMEM (tcgen05.cp 4x32x128b).
        copy_atom_s2t = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(tcgen05.CtaGroup.ONE), SF_DTYPE)
        tCtSFA_compact = cute.filter_zeros(tCtSFA)
        tiled_copy_s2t_sfa = tcgen05.make_s2t_copy(copy_atom_s2t, tCtSFA_compact)
        thr_copy_s2t_sfa = tiled_copy_s2t_sfa.get_slice(0)
        tCsSFA_compact_s2t = tcgen05.get_s2t_smem_desc_tensor(
            tiled_copy_s2t_sfa, thr_copy_s2t_sfa.partition_S(cute.filter_zeros(sSFA))
        )
        tCtSFA_compact_s2t = thr_copy_s2t_sfa.partition_D(tCtSFA_compact)
        tCtSFB_compact = cute.filter_zeros(tCtSFB)
        tiled_copy_s2t_sfb = tcgen05.make_s2t_copy(copy_atom_s2t, tCtSFB_compact)
        thr_copy_s2t_sfb = tiled_copy_s2t_sfb.get_slice(0)
        tCsSFB_compact_s2t = tcgen05.get_s2t_smem_desc_tensor(
            tiled_copy_s2t_sfb, thr_copy_s2t_sfb.partition_S(cute.filter_zeros(sSFB))
        )
        tCtSFB_compact_s2t = thr_copy_s2t_sfb.partition_D(tCtSFB_compact)

        num_kblocks = cute.size(tCrA, mode=[2])

        #
        # TMA warp: patch descriptors on group change, load every K tile of every owned tile.
        #
        if is_tma_warp and tile_start < tile_end:
            tile_idx = tile_start
            prev_group_idx = cutlass.Int32(-1)
            cta_m = cutlass.Int32(0)
            k_tile_cnt = cutlass.Int32(0)
            coord_x = cutlass.Int32(0)
            coord_y = cutlass.Int32(0)
            group_idx = self._find_group(cta_prefix, num_groups, tile_idx)
            group_end = cta_prefix[group_idx + 1]
            tensormap_a_desc_ptr = tensormap_manager.get_tensormap_ptr(
                tensormap_a_gmem_ptr, cute.AddressSpace.generic)
            tensormap_b_desc_ptr = tensormap_manager.get_tensormap_ptr(
                tensormap_b_gmem_ptr, cute.AddressSpace.generic)
            tensormap_sfa_desc_ptr = tensormap_manager.get_tensormap_ptr(
                tensormap_sfa_gmem_ptr, cute.AddressSpace.generic)
            tensormap_sfb_desc_ptr = tensormap_manager.get_tensormap_ptr(
                tensormap_sfb_gmem_ptr, cute.AddressSpace.generic)
            while tile_idx < tile_end:
                while tile_idx >= group_end:  # groups without tiles (m = 0) are passed
                    group_idx = group_idx + 1
                    group_end = cta_prefix[group_idx + 1]
                if group_idx != prev_group_idx:
                    m = problem_sizes[group_idx, tables.COL_M]
                    n = problem_sizes[group_idx, tables.COL_N]
                    k = problem_sizes[group_idx, tables.COL_K]
                    l = problem_sizes[group_idx, tables.COL_L]
                    cta_m = _ceil_div(m, MMA_TILER[0])
                    k_tile_cnt = _ceil_div(k, MMA_TILER[2])
                    cta_rest = tile_idx - cta_prefix[group_idx]
                    coord_y = cta_rest // cta_m
                    coord_x = cta_rest - coord_y * cta_m

                    # No rounding of the addresses: the runtime checks 16-byte alignment, which
                    # is what TMA needs (the original's Pointer.align(32) rounded them up).
                    a_iter = cute.make_ptr(AB_DTYPE, group_ptrs[group_idx, tables.PTR_A],
                                           cute.AddressSpace.gmem, assumed_align=16)
                    b_iter = cute.make_ptr(AB_DTYPE, group_ptrs[group_idx, tables.PTR_B],
                                           cute.AddressSpace.gmem, assumed_align=16)
                    sfa_iter = cute.make_ptr(SF_DTYPE, group_ptrs[group_idx, tables.PTR_SFA],
                                             cute.AddressSpace.gmem, assumed_align=16)
                    sfb_iter = cute.make_ptr(SF_DTYPE, group_ptrs[group_idx, tables.PTR_SFB],
                                             cute.AddressSpace.gmem, assumed_align=16)
                    a_layout = cute.make_layout(
                        (m, k, l), stride=(cute.assume(k, 32), 1, cute.assume(m * k, 32)))
                    b_layout = cute.make_layout(
                        (n, k, l), stride=(cute.assume(k, 32), 1, cute.assume(n * k, 32)))
                    sfa_layout = blockscaled_utils.tile_atom_to_shape_SF(a_layout.shape, SF_VEC)
                    sfb_layout = blockscaled_utils.tile_atom_to_shape_SF(b_layout.shape, SF_VEC)
                    tensormap_manager.update_tensormap(
                        (
                            cute.make_tensor(a_iter, a_layout),
                            cute.make_tensor(b_iter, b_layout),
                            cute.make_tensor(sfa_iter, sfa_layout),
                            cute.make_tensor(sfb_iter, sfb_layout),
                        ),
                        (tma_atom_a, tma_atom_b, tma_atom_sfa, tma_atom_sfb),
                        (tensormap_a_gmem_ptr, tensormap_b_gmem_ptr, tensormap_sfa_gmem_ptr,
                         tensormap_sfb_gmem_ptr),
                        TMA_WARP,
                        (tensormap_smem_ptr, tensormap_smem_ptr + TENSORMAP_I64,
                         tensormap_smem_ptr + 2 * TENSORMAP_I64,
                         tensormap_smem_ptr + 3 * TENSORMAP_I64),
                    )
                    tensormap_manager.fence_tensormap_update(tensormap_a_gmem_ptr)
                    tensormap_manager.fence_tensormap_update(tensormap_b_gmem_ptr)
                    tensormap_manager.fence_tensormap_update(tensormap_sfa_gmem_ptr)
                    tensormap_manager.fence_tensormap_update(tensormap_sfb_gmem_ptr)
                    prev_group_idx = group_idx

                tAgA_tile = tAgA[(None, coord_x, None, 0)]
                tBgB_tile = tBgB[(None, coord_y, None, 0)]
                tAgSFA_tile = tAgSFA[(None, coord_x, None, 0)]
                tBgSFB_tile = tBgSFB[(None, coord_y, None, 0)]
                for k_tile in range(k_tile_cnt):
                    ab_empty = ab_producer.acquire_and_advance()
                    cute.copy(tma_atom_a, tAgA_tile[(None, k_tile)], tAsA[(None, ab_empty.index)],
                              tma_bar_ptr=ab_empty.barrier, tma_desc_ptr=tensormap_a_desc_ptr)
                    cute.copy(tma_atom_b, tBgB_tile[(None, k_tile)], tBsB[(None, ab_empty.index)],
                              tma_bar_ptr=ab_empty.barrier, tma_desc_ptr=tensormap_b_desc_ptr)
                    cute.copy(tma_atom_sfa, tAgSFA_tile[(None, k_tile)],
                              tAsSFA[(None, ab_empty.index)],
                              tma_bar_ptr=ab_empty.barrier, tma_desc_ptr=tensormap_sfa_desc_ptr)
                    cute.copy(tma_atom_sfb, tBgSFB_tile[(None, k_tile)],
                              tBsSFB[(None, ab_empty.index)],
                              tma_bar_ptr=ab_empty.barrier, tma_desc_ptr=tensormap_sfb_desc_ptr)
                coord_x = coord_x + 1
                if coord_x == cta_m:
                    coord_x = cutlass.Int32(0)
                    coord_y = coord_y + 1
                tile_idx += 1

        #
        # MMA warp: block-scaled MMAs of every owned tile into a TMEM accumulator stage.
        #
        if is_mma_warp and tile_start < tile_end:
            tile_idx = tile_start
            prev_group_idx = cutlass.Int32(-1)
            cta_m = cutlass.Int32(0)
            k_tile_cnt = cutlass.Int32(0)
            coord_x = cutlass.Int32(0)
            coord_y = cutlass.Int32(0)
            m = cutlass.Int32(0)
            n = cutlass.Int32(0)
            l = cutlass.Int32(0)
            c_ptr = cutlass.Int64(0)
            group_alpha = cutlass.Float32(1.0)
            group_idx = self._find_group(cta_prefix, num_groups, tile_idx)
            group_end = cta_prefix[group_idx + 1]
            while tile_idx < tile_end:
                while tile_idx >= group_end:  # groups without tiles (m = 0) are passed
                    group_idx = group_idx + 1
                    group_end = cta_prefix[group_idx + 1]
                if group_idx != prev_group_idx:
                    m = problem_sizes[group_idx, tables.COL_M]
                    n = problem_sizes[group_idx, tables.COL_N]
                    k = problem_sizes[group_idx, tables.COL_K]
                    l = problem_sizes[group_idx, tables.COL_L]
                    c_ptr = group_ptrs[group_idx, tables.PTR_C]
                    group_alpha = alpha[group_idx]
                    cta_m = _ceil_div(m, MMA_TILER[0])
                    k_tile_cnt = _ceil_div(k, MMA_TILER[2])
                    cta_rest = tile_idx - cta_prefix[group_idx]
                    coord_y = cta_rest // cta_m
                    coord_x = cta_rest - coord_y * cta_m
                    prev_group_idx = group_idx

                acc_empty = acc_producer.acquire_and_advance()
                stage_idx = acc_empty.index
                tile_coord_x_smem[stage_idx] = coord_x
                tile_coord_y_smem[stage_idx] = coord_y
                tile_m_smem[stage_idx] = m
                tile_n_smem[stage_idx] = n
                tile_l_smem[stage_idx] = l
                tile_c_ptr_smem[stage_idx] = c_ptr
                tile_alpha_smem[stage_idx] = group_alpha
                if cutlass.const_expr(acc_stages == 1):
                    tCtAcc = tCtAcc_stage0
                else:
                    tCtAcc = cute.make_tensor(acc_tmem_base_ptr + stage_idx * acc_cols,
                                              tCtAcc_fake.layout)

                tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
                accumulate_enabled = False
                for k_tile in range(k_tile_cnt):  # noqa: B007 - the DSL loop counts K tiles; the body uses its state
                    ab_full = ab_consumer.wait_and_advance()
                    s2t_stage_coord = (None, None, None, None, ab_full.index)
                    cute.copy(tiled_copy_s2t_sfa, tCsSFA_compact_s2t[s2t_stage_coord],
                              tCtSFA_compact_s2t)
                    cute.copy(tiled_copy_s2t_sfb, tCsSFB_compact_s2t[s2t_stage_coord],
                              tCtSFB_compact_s2t)
                    for kblock_idx in cutlass.range(num_kblocks, unroll_full=True):
                        kblock_coord = (None, None, kblock_idx, ab_full.index)
                        sf_kblock_coord = (None, None, kblock_idx)
                        tiled_mma.set(tcgen05.Field.SFA, tCtSFA[sf_kblock_coord].iterator)
                        tiled_mma.set(tcgen05.Field.SFB, tCtSFB[sf_kblock_coord].iterator)
                        cute.gemm(tiled_mma, tCtAcc, tCrA[kblock_coord], tCrB[kblock_coord],
                                  tCtAcc)
                        if not accumulate_enabled:
                            tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                            accumulate_enabled = True
                    ab_full.release()
                acc_empty.commit()
                coord_x = coord_x + 1
                if coord_x == cta_m:
                    coord_x = cutlass.Int32(0)
                    coord_y = coord_y + 1
                tile_idx += 1

        #
        # Epilogue warps: TMEM -> registers -> * alpha -> out_dtype -> global, masked to (m, n).
        #
        copy_atom_t2r = cute.make_copy_atom(
            tcgen05.Ld32x32bOp(tcgen05.Repetition.x128, tcgen05.Pack.NONE), cutlass.Float32
        )
        epilogue_slice_idx = tidx
        if not is_epilogue_warp:
            epilogue_slice_idx = 0
        simt_atom_128 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), c_dtype,
                                            num_bits_per_copy=128)
        simt_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), c_dtype, num_bits_per_copy=16)
        thread_row = tidx
        if cutlass.const_expr(acc_stages == 1):
            tiled_copy_t2r_stage0 = tcgen05.make_tmem_copy(copy_atom_t2r, tCtAcc_stage0[None, 0, 0])
            thr_copy_t2r_stage0 = tiled_copy_t2r_stage0.get_slice(epilogue_slice_idx)
            tDtAcc_stage0 = thr_copy_t2r_stage0.partition_S(tCtAcc_stage0[None, 0, 0])

        if is_epilogue_warp and tile_start < tile_end:
            tile_idx = tile_start
            m = cutlass.Int32(0)
            n = cutlass.Int32(0)
            l = cutlass.Int32(0)
            c_ptr = cutlass.Int64(0)
            tile_alpha = cutlass.Float32(1.0)
            while tile_idx < tile_end:
                acc_full = acc_consumer.wait_and_advance()
                stage_idx = acc_full.index
                coord_x = tile_coord_x_smem[stage_idx]
                coord_y = tile_coord_y_smem[stage_idx]
                m = tile_m_smem[stage_idx]
                n = tile_n_smem[stage_idx]
                l = tile_l_smem[stage_idx]
                c_ptr = tile_c_ptr_smem[stage_idx]
                tile_alpha = tile_alpha_smem[stage_idx]

                if cutlass.const_expr(acc_stages == 1):
                    tiled_copy_t2r = tiled_copy_t2r_stage0
                    thr_copy_t2r = thr_copy_t2r_stage0
                    tDtAcc = tDtAcc_stage0
                else:
                    tCtAcc = cute.make_tensor(acc_tmem_base_ptr + stage_idx * acc_cols,
                                              tCtAcc_fake.layout)
                    tiled_copy_t2r = tcgen05.make_tmem_copy(copy_atom_t2r, tCtAcc[None, 0, 0])
                    thr_copy_t2r = tiled_copy_t2r.get_slice(epilogue_slice_idx)
                    tDtAcc = thr_copy_t2r.partition_S(tCtAcc[None, 0, 0])

                # C rows are n 16-bit elements apart; n % 8 == 0 keeps every row 16-byte aligned.
                mC_mnl = cute.make_tensor(
                    cute.make_ptr(c_dtype, c_ptr, cute.AddressSpace.gmem, assumed_align=16),
                    cute.make_layout((m, n, l),
                                     stride=(cute.assume(n, 8), 1, cute.assume(m * n, 8))),
                )
                gC_mnl = cute.local_tile(mC_mnl, cute.slice_(MMA_TILER, (None, None, 0)),
                                         (coord_x, coord_y, 0))
                tCgC = thr_mma.partition_C(gC_mnl)
                tDgC = thr_copy_t2r.partition_D(tCgC[None, 0, 0])
                tDrAcc = cute.make_rmem_tensor(tDgC.shape, cutlass.Float32)
                tDrC = cute.make_rmem_tensor(tDgC.shape, c_dtype)

                residue_m = m - coord_x * MMA_TILER[0]
                residue_n = n - coord_y * MMA_TILER[1]
                full_m_tile = residue_m >= MMA_TILER[0]
                full_n_tile = residue_n >= MMA_TILER[1]
                row_valid = thread_row < residue_m
                has_output_row = full_m_tile or row_valid

                cute.copy(tiled_copy_t2r, tDtAcc, tDrAcc)
                if has_output_row:
                    tDrC.store((tDrAcc.load() * tile_alpha).to(c_dtype))

                if has_output_row and full_n_tile:
                    cute.copy(simt_atom_128, cute.flatten(tDrC), cute.flatten(tDgC))
                elif has_output_row:
                    tDpC = cute.make_rmem_tensor(tDrC.shape, cutlass.Boolean)
                    for i in cutlass.range(cute.size(tDrC.shape), unroll_full=True):
                        tDpC[i] = i < residue_n
                    cute.copy(simt_atom, cute.flatten(tDrC), cute.flatten(tDgC),
                              pred=cute.flatten(tDpC))
                acc_full.release()
                tile_idx += 1

        tmem.relinquish_alloc_permit()
        cute.arch.barrier()
        tmem.free(acc_tmem_base_ptr)

    # Symbol "nvfp4_gg_sm100_cutlass_0". The "cutlass" part is kept on purpose: NVVM and ptxas
    # generate different code for kernels whose name contains it. Measured with DSL 4.8.1 on
    # this kernel: without it the PTX keeps the epilogue's fp16 fragment in a 256-byte local
    # array and the SASS has 160 local loads/stores in 2882 lines; with it the PTX has no local
    # memory and the SASS has 127 in 3682 lines, like the original kernel (127 in 3832), whose
    # name also contained "cutlass". With the alpha multiply (acc_stages 2): fp16 128 in 3722,
    # bf16 96 in 3468.
    kernel.set_name_prefix(SYMBOL_PREFIX, remove_cutlass_symbol=False, keep_mangled_name=False)

    # ----------------------------------------------------------------------------------------
    # Helpers
    # ----------------------------------------------------------------------------------------

    @staticmethod
    @cute.jit
    def _find_group(cta_prefix: cute.Tensor, num_groups: cutlass.Int32,
                    tile_idx: cutlass.Int32) -> cutlass.Int32:
        """The group g with cta_prefix[g] <= tile_idx < cta_prefix[g + 1] (binary search)."""
        left = cutlass.Int32(0)
        right = num_groups
        while left < right:
            mid = (left + right) // 2
            if cta_prefix[mid + 1] <= tile_idx:
                left = mid + 1
            else:
                right = mid
        return left

    @staticmethod
    def _make_tiled_mma() -> cute.TiledMma:
        mma_op = tcgen05.MmaMXF4NVF4Op(
            SF_DTYPE,
            (MMA_TILER[0], MMA_TILER[1], MMA_INST_K),
            tcgen05.CtaGroup.ONE,
            tcgen05.OperandSource.SMEM,
        )
        return cute.make_tiled_mma(mma_op)

    @staticmethod
    def _make_smem_layouts(tiled_mma: cute.TiledMma, stages: int) -> tuple[Any, Any, Any, Any]:
        """Staged smem layouts of A, B (swizzled, composed) and SFA, SFB (plain)."""
        return (
            sm100_utils.make_smem_layout_a(tiled_mma, MMA_TILER, AB_DTYPE, stages),
            sm100_utils.make_smem_layout_b(tiled_mma, MMA_TILER, AB_DTYPE, stages),
            blockscaled_utils.make_smem_layout_sfa(tiled_mma, MMA_TILER, SF_VEC, stages),
            blockscaled_utils.make_smem_layout_sfb(tiled_mma, MMA_TILER, SF_VEC, stages),
        )

    @staticmethod
    def _placeholder_ab(rows: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """Static (rows, K, L=1) K-major shape and element strides of an A or B placeholder."""
        return (rows, PLACEHOLDER_K, 1), (PLACEHOLDER_K, 1, rows * PLACEHOLDER_K)

    @staticmethod
    def _null(dtype: Any) -> cute.Pointer:
        return cute.make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=16)

    @staticmethod
    def _compute_tmem_cols(required: int) -> int:
        """TMEM allocations are a power of two of at least 32 columns, at most 512."""
        for cols in (32, 64, 128, 256, 512):
            if required <= cols:
                return cols
        raise ValueError(f"TMEM columns must be <= 512, but the kernel needs {required}")


# --------------------------------------------------------------------------------------------
# Build entry point
# --------------------------------------------------------------------------------------------


def _imported_arch() -> str | None:
    """The arch the DSL was imported for: CUTE_DSL_ARCH is read once, at `import cutlass`."""
    from cutlass.cutlass_dsl import CuTeDSL

    envar = CuTeDSL._get_dsl().envar
    # `envar.arch` would probe the driver when unset; the private field holds the env value.
    return getattr(envar, "_arch", None) or os.environ.get("CUTE_DSL_ARCH")


def _check_groups(groups: list[tuple[int, int, int]]) -> list[list[int]]:
    out = []
    for i, g in enumerate(groups):
        if len(g) != 3:
            raise ValueError(f"groups[{i}] must be (m, n, k), but got {g!r}")
        m, n, k = (int(x) for x in g)
        if m <= 0 or n <= 0 or k <= 0:
            raise ValueError(f"groups[{i}] must have m, n, k > 0, but got {g!r}")
        if k % sm100_config.K_TILE:
            raise ValueError(f"groups[{i}].k must be a multiple of {sm100_config.K_TILE}, "
                             f"but got {k}")
        if n % sm100_config.N_MULTIPLE:
            raise ValueError(f"groups[{i}].n must be a multiple of {sm100_config.N_MULTIPLE}, "
                             f"but got {n}")
        out.append([m, n, k])
    return out


def compile_dsl(config: sm100_config.Config) -> tuple[Sm100GroupedGemm, Any, bytes, str]:
    """Trace and compile one config: (kernel object with its recorded ABI, DSL compiled object,
    cubin bytes, PTX text). The caller must have imported cutlass under CUTE_DSL_ARCH=sm_100a."""
    imported = _imported_arch()
    if imported != ARCH:
        raise RuntimeError(
            f"cutlass must be imported with CUTE_DSL_ARCH={ARCH}, but it was imported with "
            f"CUTE_DSL_ARCH={imported!r}; the DSL reads the arch once, at import: compile in a "
            "subprocess that sets the variable before importing cutlass"
        )
    i32_ptr = make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=16)
    i64_ptr = make_ptr(cutlass.Int64, 0, cute.AddressSpace.gmem, assumed_align=16)
    f32_ptr = make_ptr(cutlass.Float32, 0, cute.AddressSpace.gmem, assumed_align=4)
    if config.device_offsets:  # offs, a, b, sfa, sfb, c, workspace, alpha, E, rows, n, k
        from kernels.sm100.offsets import Sm100OffsetsGemm

        gemm: Sm100GroupedGemm = Sm100OffsetsGemm(config)
        offs = make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=4)
        u8 = make_ptr(cutlass.Uint8, 0, cute.AddressSpace.gmem, assumed_align=16)
        call = (offs, u8, u8, u8, u8, u8, i64_ptr, f32_ptr, *(cutlass.Int32(1),) * 4)
    else:
        gemm = Sm100GroupedGemm(config)
        call = (i32_ptr, i64_ptr, i32_ptr, i64_ptr, f32_ptr, cutlass.Int32(1))
    with tempfile.TemporaryDirectory(prefix="sm100_gg_") as dump_dir:
        # Without an existing dump directory __cubin__ / __ptx__ are paths, not contents.
        compiled = cute.compile(
            gemm, *call,
            options=f"--gpu-arch {ARCH} --keep-cubin --keep-ptx --dump-dir {dump_dir}",
        )
        cubin = compiled.__cubin__
        ptx = compiled.__ptx__
    if not isinstance(cubin, (bytes, bytearray)) or cubin[:4] != b"\x7fELF":
        raise RuntimeError(f"the DSL returned no cubin bytes (got {type(cubin).__name__})")
    if not isinstance(ptx, str) or ".entry" not in ptx:
        raise RuntimeError("the DSL returned no PTX text")
    return gemm, compiled, bytes(cubin), ptx


def compile_kernel(config: sm100_config.Config, *, arch: str,
                   groups: list[tuple[int, int, int]]) -> abi.CompiledKernel:
    """Compile one sm_100a kernel; `groups` are recorded (the cubin is shape-generic)."""
    if arch != ARCH:
        raise ValueError(f"arch must be {ARCH!r} for the sm100 family, but got {arch!r}")
    recorded_groups = _check_groups(groups)
    gemm, compiled, cubin, ptx = compile_dsl(config)

    symbols = list(compiled.kernel_info.keys())
    if len(symbols) != 1:
        raise RuntimeError(f"expected exactly one kernel in the cubin, but got {symbols}")
    symbol = symbols[0]
    if not symbol.startswith(SYMBOL_PREFIX):
        raise RuntimeError(f"kernel symbol must start with {SYMBOL_PREFIX!r}, but got {symbol!r}")
    if not re.search(rf"\.target\s+{ARCH}\b", ptx):
        raise RuntimeError(f"PTX must target {ARCH}")

    # The builder checks the recorded ABI against this PTX (builder/ptx.py) for every kernel.
    params = gemm.abi.params()

    block = ptx_reqntid(ptx, symbol)
    if block != (THREADS, 1, 1):
        raise RuntimeError(f"block must be ({THREADS}, 1, 1), but PTX .reqntid says {block}")
    cluster = ptx_cluster_dims(ptx, symbol)
    if cluster != (1, 1, 1):
        raise RuntimeError(f"cluster must be (1, 1, 1), but PTX says {cluster}")
    # The DSL sizes dynamic smem at compile time (InferKernelSmemUsagePass) and bakes the byte
    # count into its own launcher; read it back from there, it is the exact launch value.
    launch = lowered_launch(compiled)
    if launch["block"] != block:
        raise RuntimeError(f"the DSL launcher uses block {launch['block']}, PTX says {block}")
    dynamic_smem = launch["dynamic_smem"]
    if not 0 < dynamic_smem <= SM100_MAX_DYNAMIC_SMEM:
        raise RuntimeError(f"dynamic shared memory must be in 1..{SM100_MAX_DYNAMIC_SMEM}, but "
                           f"the DSL computed {dynamic_smem}")

    return abi.CompiledKernel(
        symbol=symbol,
        cubin=cubin,
        ptx=ptx,
        params=params,
        block=block,
        cluster=cluster,
        dynamic_smem=dynamic_smem,
        grid={"policy": "persistent", "ctas_per_sm": 1},
        tile={"m": MMA_TILER[0], "n": MMA_TILER[1], "k": MMA_TILER[2]},
        tables=tables.tables_record(NUM_TENSORMAPS),
        constraints={
            "groups": recorded_groups,
            "k_multiple": sm100_config.K_TILE,
            "n_multiple": sm100_config.N_MULTIPLE,
        },
    )
