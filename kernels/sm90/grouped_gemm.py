"""NVFP4 x NVFP4 block-scaled grouped GEMM for Hopper (sm_90a), in CuTe DSL.

Op, per group g:  C_g[m, n] = sum_k (A_g[m, k] * SFA_g[m, k//16]) * (B_g[n, k] * SFB_g[n, k//16])
with A (M, K) and B (N, K) packed e2m1 (K/2 bytes per row, element 2j in the low nibble), SFA and
SFB e4m3 in the blocked 128x4 layout of facts.md, C (M, N) fp16 row-major; fp32 accumulation.

Hopper has no FP4 tensor cores, so the data path is (v3, Config.a_fp16, the default):
  phase 1: every thread of every CTA converts a share of all groups' A to fp16 (exact) into the
           workspace, in the kernel's permuted K order; a grid-wide barrier follows (the launch
           is cooperative, so all CTAs are resident; counters in a zeroed workspace header)
  phase 2: TMA (packed B fp4 and its scale bytes, per-group descriptors patched in the
           workspace) -> a `stages`-deep mbarrier pipeline; TMA of fp16 A tiles (64 K each)
           -> an `a_slots`-deep ring; one producer warp issues both
    -> one consumer warpgroup per 64 weight rows of the tile (2 for tile_n 128, 3 for 192, with
       setmaxnreg moving registers from the producer warpgroup to them) dequantizes B (weights)
       to fp16 straight into its wgmma register fragments (dequant.dequant_word_w: value *
       scale * 2^-7) and runs RS wgmma m64nNk16 with A from the ring, fp32 accumulate
    -> epilogue scales by 2^7 and writes C with per-element bounds checks (rows >= m and
       cols >= n untouched).
v2 (a_fp16: false) has no phase 1: the consumers also convert their A rows per 64-K step into
swizzled shared memory (3 buffers, a named barrier per step). It stays the better choice for
small problems, where phase 1 and the barrier cost more than the conversions they save.

Operand roles are swapped to suit mixture-of-experts shapes (few tokens m, many weight rows n):
the wgmma M dimension walks B's rows (tile_n per CTA tile, 64 per warpgroup) and the wgmma N
dimension walks A's rows (`tile_m`, 64 or 128), so a small m wastes at most tile_m - 1 rows.

Persistent grouped schedule: CTA b takes tiles b, b + grid, ... of the concatenated per-group tile
lists described by the CTA prefix table (m-tiles fastest inside a group). Group count, problem
sizes, pointers and the grid are run-time values; nothing about the call is baked into the cubin.

Constraints: k % 256 == 0, n % 8 == 0, 16-byte aligned rows and base pointers, scales padded to
128-row atoms (the blocked layout always is). Build:
    CUTE_DSL_ARCH=sm_90a python -m builder.worker ...   (see build_kernels.py)
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float16, Float32, Int32, Int64, Uint8, Uint32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cute.runtime import make_ptr
from cutlass.tensor_utils import LayoutEnum

from kernels import tables
from kernels.abi import CompiledKernel, KernelArgs
from kernels.introspect import (lowered_launch, ptx_cluster_dims, ptx_reqntid,
                                require_async_wgmma, require_no_stack_frame,
                                subbyte_tma_geometry, tma_swizzle)

from . import tma
from .config import (FP16_BUFFERS, K_TILE, N_MULTIPLE, SCALE_ATOM_BYTES, SCALE_STAGE_BYTES, SUB_K,
                     Config, check, scale_blocks, smem_bytes)
from .dequant import dequant_word, dequant_word_w, scale_pair, scales_w
from .fp4_bits import W_UNSCALE, fragment_word, permuted_chunk
from .ptx import (atom_add_acq_rel_gpu_u32, e4m3x2_to_f16x2, fence_proxy_async_global,
                  ld_acquire_gpu_u32, ld_global_nc_u16, ld_global_nc_v4, ld_shared_u16,
                  ld_shared_u32, ld_shared_v2, ld_shared_v4, nanosleep, prmt,
                  red_add_release_gpu_u32, st_global_v4, st_relaxed_gpu_u32, st_shared_v2,
                  st_shared_v4, trap)
from .smem_layout import scale_word_offset
from .staging import A_CHUNK_K, chunk_addresses

SYMBOL_PREFIX = "nvfp4_gg_sm90"
PACKED_ROW_BYTES = K_TILE // 2  # one 128-byte (swizzle-128B) row of packed fp4 per operand row
SUB_STEPS = K_TILE // SUB_K
# One 128-row block's scales of a stage as (256 bytes, 8) for TMA (box dims <= 256).
SCALE_BOX = (256, 2 * K_TILE // 64)
# Warpgroup 0: producer (warp 0 issues TMA); one consumer warpgroup per 64 weight rows of the tile.
WARPGROUP = 128
# Registers per thread with three consumer warpgroups (512 threads, 128 each at launch): the
# producer warpgroup gives up all but PRODUCER_REGS, the consumers take CONSUMER_REGS.
# 128 * 56 + 384 * 152 = 65536, the whole register file.
PRODUCER_REGS, CONSUMER_REGS = 56, 152
REBALANCED_CONSUMER_WARPGROUPS = 3  # the only consumer count those two numbers are made for
assert WARPGROUP * (PRODUCER_REGS + REBALANCED_CONSUMER_WARPGROUPS * CONSUMER_REGS) \
    <= 65536 == WARPGROUP * (1 + REBALANCED_CONSUMER_WARPGROUPS) * 128
# Placeholder extents for the descriptor templates; the kernel patches dims and strides.
_PH_ROWS, _PH_ROW_BYTES = 1024, 4096
_PH_SCALE = (256, 64, 16)
_PH_K = 4096  # placeholder K of the fp16 A template (a_fp16)
# Operand order inside a descriptor set (with a_fp16, OP_A is the fp16 copy and OP_SFA unused).
OP_B, OP_A, OP_SFB, OP_SFA = range(4)
# a_fp16: the workspace starts with the grid barrier (arrival counter, then the generation word
# on its own 64-byte line); the runtime zeroes it once and every launch leaves it zeroed.
HEADER_BYTES = 128
BARRIER_GENERATION = 64
STAGE_UNROLL = 4  # staging chunks whose loads one thread has in flight at once


class _Slot:
    """A pipeline position by buffer index alone: consumer_release reads only `.index`, and a
    lagged release must not copy the live PipelineState inside dynamic control flow."""

    def __init__(self, index: Any) -> None:
        self.index = index


class Sm90GroupedGemm:
    """One persistent warp-specialized kernel per Config; see the module docstring."""

    def __init__(self, config: Config) -> None:
        reasons = check(config)
        if reasons:
            raise ValueError("; ".join(reasons))
        self.config = config
        self.tile_m = config.tile_m  # A rows (tokens) per CTA tile = wgmma N
        self.tile_n = config.tile_n  # B rows (weights) per CTA tile = consumer warpgroups x 64
        self.consumer_threads = WARPGROUP * (config.tile_n // 64)
        self.threads = WARPGROUP + self.consumer_threads
        self.scale_blocks = scale_blocks(config.tile_n)
        self.sfb_stage_bytes = self.scale_blocks * SCALE_STAGE_BYTES  # weight scales per stage
        self.stages = config.stages
        self.w_regs = config.w_regs
        self.a_fp16 = config.a_fp16
        self.args: KernelArgs | None = None
        self.smem_bytes = 0

    # ------------------------------------------------------------------ host (trace time)
    @cute.jit
    def __call__(
        self,
        problem_sizes: cute.Pointer,
        pointers: cute.Pointer,
        cta_prefix: cute.Pointer,
        workspace: cute.Pointer,
        num_groups: Int32,
        num_ctas: Int32,
    ) -> None:
        # num_ctas only sizes the launch: a static grid would let the compiler assume
        # blockIdx.x == 0, which a persistent kernel must never see.
        args = KernelArgs()
        tile_m, tile_n = self.tile_m, self.tile_n

        packed_b_smem = self._packed_layout(tile_n)
        packed_a_smem = self._packed_layout(tile_m)
        scale_smem = cute.make_layout(SCALE_BOX, stride=(1, SCALE_BOX[0]))
        op = cpasync.CopyBulkTensorTileG2SOp()
        packed_ph = self._placeholder((_PH_ROWS, _PH_ROW_BYTES), (_PH_ROW_BYTES, 1))
        scale_stride = (1, _PH_SCALE[0], _PH_SCALE[0] * _PH_SCALE[1])
        scale_ph = self._placeholder(_PH_SCALE, scale_stride)
        atom_b, _ = cpasync.make_tiled_tma_atom(op, packed_ph, packed_b_smem,
                                                (tile_n, PACKED_ROW_BYTES))
        if cutlass.const_expr(self.a_fp16):
            a16_layout = self._a16_layout()
            a16_ph = cute.make_tensor(
                cute.make_ptr(Float16, Int64(16), cute.AddressSpace.gmem, assumed_align=16),
                cute.make_layout((_PH_ROWS, _PH_K), stride=(_PH_K, 1)))
            a16_smem = cute.slice_(a16_layout, (None, None, 0))
            atom_a, _ = cpasync.make_tiled_tma_atom(op, a16_ph, a16_smem, (tile_m, SUB_K))
        else:
            atom_a, _ = cpasync.make_tiled_tma_atom(op, packed_ph, packed_a_smem,
                                                    (tile_m, PACKED_ROW_BYTES))
        if cutlass.const_expr(self.scale_blocks == 1):
            atom_sfb, _ = cpasync.make_tiled_tma_atom(op, scale_ph, scale_smem, SCALE_BOX)
        else:
            sfb_box = (*SCALE_BOX, self.scale_blocks)
            sfb_smem = cute.make_layout(sfb_box, stride=(1, SCALE_BOX[0], SCALE_STAGE_BYTES))
            atom_sfb, _ = cpasync.make_tiled_tma_atom(op, scale_ph, sfb_smem, sfb_box)
        atom_sfa, _ = cpasync.make_tiled_tma_atom(op, scale_ph, scale_smem, SCALE_BOX)

        def geometry(atom: Any, shape: tuple, stride: tuple, smem: Any) -> dict:
            return subbyte_tma_geometry(atom, shape, stride, tma_swizzle(smem), "256B")

        packed_shape, packed_stride = (_PH_ROWS, _PH_ROW_BYTES), (_PH_ROW_BYTES, 1)
        args.tma_template("tma_b", atom_b, "b",
                          geometry(atom_b, packed_shape, packed_stride, packed_b_smem))
        if cutlass.const_expr(self.a_fp16):
            args.tma_template("tma_a", atom_a, "a",
                              geometry(atom_a, (_PH_ROWS, _PH_K), (_PH_K, 1), a16_smem))
        else:
            args.tma_template("tma_a", atom_a, "a",
                              geometry(atom_a, packed_shape, packed_stride, packed_a_smem))
        args.tma_template("tma_sfb", atom_sfb, "sfb",
                          geometry(atom_sfb, _PH_SCALE, scale_stride,
                                   scale_smem if self.scale_blocks == 1 else sfb_smem))
        args.tma_template("tma_sfa", atom_sfa, "sfa",
                          geometry(atom_sfa, _PH_SCALE, scale_stride, scale_smem))
        args.table("problem_sizes", problem_sizes, "problem_sizes")
        args.table("pointers", pointers, "pointers")
        args.table("cta_prefix", cta_prefix, "cta_prefix")
        args.table("tensormap_workspace", workspace, "tensormap_workspace")
        args.scalar("num_groups", num_groups, "num_groups")

        fb_layout, fa_layout = self._fp16_layouts()

        stages = self.stages

        fb_elems = 16 if self.w_regs else cute.cosize(fb_layout)  # unused without an fp16 B tile

        @cute.struct
        class SharedStorage:
            mbar: cute.struct.MemRange[Int64, stages * 2]
            packed_b: cute.struct.Align[
                cute.struct.MemRange[Uint8, stages * tile_n * PACKED_ROW_BYTES], 1024]
            packed_a: cute.struct.Align[
                cute.struct.MemRange[Uint8, stages * tile_m * PACKED_ROW_BYTES], 1024]
            scale_b: cute.struct.Align[
                cute.struct.MemRange[Uint8, stages * SCALE_STAGE_BYTES], 128]
            scale_a: cute.struct.Align[
                cute.struct.MemRange[Uint8, stages * SCALE_STAGE_BYTES], 128]
            fp16_a: cute.struct.Align[
                cute.struct.MemRange[Float16, cute.cosize(fa_layout)], 1024]
            fp16_b: cute.struct.Align[cute.struct.MemRange[Float16, fb_elems], 1024]

        self.shared_storage = SharedStorage
        if cutlass.const_expr(self.a_fp16):
            a_slots = self.config.a_slots
            a16_elems = cute.cosize(self._a16_layout())
            sfb_stage_bytes = self.sfb_stage_bytes

            @cute.struct
            class SharedStorageA16:
                mbar: cute.struct.MemRange[Int64, stages * 2]
                mbar_a: cute.struct.MemRange[Int64, a_slots * 2]
                packed_b: cute.struct.Align[
                    cute.struct.MemRange[Uint8, stages * tile_n * PACKED_ROW_BYTES], 1024]
                scale_b: cute.struct.Align[
                    cute.struct.MemRange[Uint8, stages * sfb_stage_bytes], 128]
                a16: cute.struct.Align[cute.struct.MemRange[Float16, a16_elems], 1024]

            self.shared_storage = SharedStorageA16
        self.smem_bytes = self.shared_storage.size_in_bytes()
        assert self.smem_bytes == smem_bytes(self.config), "config.smem_bytes is out of date"
        self.args = args
        self.kernel.set_name_prefix(SYMBOL_PREFIX, remove_cutlass_symbol=True,
                                    keep_mangled_name=False)
        self.kernel(*args.values()).launch(
            grid=(num_ctas, 1, 1), block=(self.threads, 1, 1), cluster=(1, 1, 1),
            min_blocks_per_mp=1, smem=self.smem_bytes,
        )

    def _tiled_mma(self) -> cute.TiledMma:
        # wgmma M walks B rows (64 per warpgroup), wgmma N walks A rows.
        source = warpgroup.OperandSource.RMEM if self.w_regs else warpgroup.OperandSource.SMEM
        return sm90_utils.make_trivial_tiled_mma(
            Float16, Float16, OperandMajorMode.K, OperandMajorMode.K, Float32,
            (self.tile_n // 64, 1, 1), tiler_mn=(64, self.tile_m), a_source=source,
        )

    def _fp16_layouts(self) -> tuple[Any, Any]:
        """K-major 128B-swizzled fp16 tiles (B rows, A rows) x 64 K, FP16_BUFFERS deep."""
        mnk = (self.tile_n, self.tile_m, SUB_K)
        return (sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, mnk, Float16, FP16_BUFFERS),
                sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, mnk, Float16, FP16_BUFFERS))

    def _a16_layout(self) -> Any:
        """The fp16 A ring (a_fp16): K-major 128B-swizzled (tile_m, 64) tiles, a_slots deep."""
        return sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR,
                                             (self.tile_n, self.tile_m, SUB_K), Float16,
                                             self.config.a_slots)

    @staticmethod
    def _packed_layout(rows: int) -> Any:
        """Packed fp4 rows of 128 bytes, 128B-swizzled so 8 rows x 16 B reads hit 32 banks."""
        return cute.make_composed_layout(
            cute.make_swizzle(3, 4, 3), 0,
            cute.make_layout((rows, PACKED_ROW_BYTES), stride=(PACKED_ROW_BYTES, 1)))

    @staticmethod
    def _placeholder(shape: tuple, stride: tuple) -> cute.Tensor:
        return cute.make_tensor(cute.make_ptr(Uint8, Int64(16), cute.AddressSpace.gmem, assumed_align=16),
                                cute.make_layout(shape, stride=stride))

    # ------------------------------------------------------------------ device
    @cute.kernel
    def kernel(
        self,
        tma_b: cute.CopyAtom,
        tma_a: cute.CopyAtom,
        tma_sfb: cute.CopyAtom,
        tma_sfa: cute.CopyAtom,
        problem_sizes: cute.Pointer,
        pointers: cute.Pointer,
        cta_prefix: cute.Pointer,
        workspace: cute.Pointer,
        num_groups: Int32,
    ) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()

        # The runtime launches with the recorded dynamic smem; trap rather than corrupt memory
        # if a launch ever provides less.
        if cute.arch.dynamic_smem_size() < self.smem_bytes:
            trap()
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        if cutlass.const_expr(self.a_fp16):
            self._kernel_a16(tma_b, tma_a, tma_sfb, storage, problem_sizes, pointers, cta_prefix,
                             workspace, num_groups, tidx, warp_idx, bidx, grid)
        else:
            self._kernel_v2(tma_b, tma_a, tma_sfb, tma_sfa, storage, problem_sizes, pointers,
                            cta_prefix, workspace, num_groups, tidx, warp_idx, bidx, grid)

    @cute.jit
    def _kernel_v2(self, tma_b, tma_a, tma_sfb, tma_sfa, storage, problem_sizes, pointers,
                   cta_prefix, workspace, num_groups, tidx, warp_idx, bidx, grid) -> None:
        mainloop = self._tma_pipeline(
            storage.mbar, self.stages,
            (self.tile_n + self.tile_m) * PACKED_ROW_BYTES + 2 * SCALE_STAGE_BYTES)

        sizes, ptrs, prefix, total_tiles = self._tables(problem_sizes, pointers, cta_prefix,
                                                        num_groups)

        # All 384 threads fit in the register file at the compiled count (ptxas reports 168),
        # so no setmaxnreg rebalancing: it is only safe when ptxas can honour the lower limit
        # in the producer path, which patches descriptors with 64-bit values.
        if warp_idx == 0:
            self._producer(tma_b, tma_a, tma_sfb, tma_sfa, storage, mainloop, sizes, ptrs,
                           prefix, workspace, total_tiles, bidx, grid)
        if warp_idx >= 4:
            fb_layout, fa_layout = self._fp16_layouts()
            self._consumer(self._tiled_mma(), fb_layout, fa_layout, storage, mainloop, sizes, ptrs,
                           prefix, total_tiles, bidx, grid, tidx - 128)

    @cute.jit
    def _tables(self, problem_sizes, pointers, cta_prefix, num_groups):
        """The device tables as tensors (kernels/tables.py layouts), and the total tile count."""
        sizes = cute.make_tensor(problem_sizes, cute.make_layout((num_groups, 4), stride=(4, 1)))
        ptrs = cute.make_tensor(pointers, cute.make_layout((num_groups, 5), stride=(5, 1)))
        prefix = cute.make_tensor(cta_prefix, cute.make_layout(num_groups + 1))
        return sizes, ptrs, prefix, prefix[num_groups]

    def _tma_pipeline(self, barriers: Any, stages: int, tx_bytes: int) -> Any:
        """A TMA-fed mbarrier pipeline: one producer thread; consumer_release arrives once per
        consumer warp (lane 0)."""
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers.data_ptr(),
            num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     self.consumer_threads // 32),
            tx_count=tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )

    # ------------------------------------------------------------------ a_fp16 (v3)
    @cute.jit
    def _kernel_a16(self, tma_b, tma_a16, tma_sfb, storage, problem_sizes, pointers,
                    cta_prefix, workspace, num_groups, tidx, warp_idx, bidx, grid) -> None:
        """Phase 1: every thread of every CTA converts a share of all groups' A to fp16 in the
        workspace; grid barrier. Phase 2: the persistent tile loop, with TMA loading fp16 A
        tiles into a ring the wgmma reads directly, and only the weights converted per tile."""
        b_pipe = self._tma_pipeline(storage.mbar, self.stages,
                                    self.tile_n * PACKED_ROW_BYTES + self.sfb_stage_bytes)
        a_pipe = self._tma_pipeline(storage.mbar_a, self.config.a_slots,
                                    self.tile_m * SUB_K * 2)
        sizes, ptrs, prefix, total_tiles = self._tables(problem_sizes, pointers, cta_prefix,
                                                        num_groups)
        ws_base = workspace.toint()
        a16_base = ws_base + HEADER_BYTES + grid * (tma.SETS * tma.MAPS_PER_SET
                                                    * tma.TENSORMAP_BYTES)

        self._stage_a(sizes, ptrs, num_groups, a16_base, tidx, bidx, grid)
        cute.arch.barrier()
        if tidx == 0:
            self._grid_barrier(ws_base, grid)
        cute.arch.barrier()
        # The fp16 A just written (generic proxy, other CTAs) is read by TMA (async proxy).
        fence_proxy_async_global()

        # Each role is called from two places below: its arguments, written once.
        producer_args = (tma_b, tma_a16, tma_sfb, storage, b_pipe, a_pipe, sizes, ptrs, prefix,
                         ws_base + HEADER_BYTES, a16_base, total_tiles, bidx, grid)
        consumer_args = (storage, b_pipe, a_pipe, sizes, ptrs, prefix, total_tiles, bidx, grid)
        rebalance = self.consumer_threads == REBALANCED_CONSUMER_WARPGROUPS * WARPGROUP
        if cutlass.const_expr(rebalance):
            # 512 threads launch with 128 registers each; the consumers need more. setmaxnreg is
            # per warpgroup (all of warpgroup 0 gives registers up, not just warp 0), and ptxas
            # honours it only when each role's code is reachable from its own setmaxnreg alone.
            if warp_idx < 4:
                cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
                if warp_idx == 0:
                    self._producer_a16(*producer_args)
            else:
                cute.arch.warpgroup_reg_alloc(CONSUMER_REGS)
                self._consumer_a16(self._tiled_mma(), *consumer_args, tidx - WARPGROUP)
        else:
            if warp_idx == 0:
                self._producer_a16(*producer_args)
            if warp_idx >= 4:
                self._consumer_a16(self._tiled_mma(), *consumer_args, tidx - WARPGROUP)

    @cute.jit
    def _stage_a(self, sizes, ptrs, num_groups, a16_base, tidx, bidx, grid) -> None:
        """Convert every group's A to fp16 at a16_base (groups back to back, rows of k). Each
        thread takes 32-K chunks (16 packed bytes, two scales) in a grid-stride loop and writes
        them in the kernel's permuted K order (fp4_bits.permuted_chunk), so a TMA tile of 64 K
        lands in shared memory exactly as the v2 kernel's own fp16 stores would place it.
        The chunks of all groups form one index space (group after group, rows in order, K
        chunks fastest), so a thread's chunks are spread over the whole call rather than
        handled group by group: STAGE_UNROLL chunks per iteration issue their loads before any
        conversion, and the phase is one memory round trip per thread for calls of up to
        STAGE_UNROLL * grid * threads chunks, whatever the number of groups."""
        stride = grid * self.threads
        total = Int32(0)
        for g in cutlass.range(num_groups, unroll=1):
            total += sizes[g, tables.COL_M] * (sizes[g, tables.COL_K] // A_CHUNK_K)
        # Group cursor (a thread's chunk indices only grow): group `group` holds chunks
        # [first, first + count) and its fp16 A starts `offset` bytes into the staging area
        # (A_CHUNK_K fp16 = 64 bytes per chunk).
        group = Int32(-1)
        first = Int32(0)
        count = Int32(0)
        offset = Int64(0)
        c = bidx * self.threads + tidx
        while c < total:
            dsts, words, scales = [], [], []
            for u in cutlass.range_constexpr(STAGE_UNROLL):
                # Past the end: load the last chunk again (valid memory), store nothing.
                cu = cutlass.min(c + u * stride, total - 1)
                while cu >= first + count:  # groups of m = 0 have no chunks and are skipped
                    first += count
                    offset += Int64(count) * Int64(A_CHUNK_K * 2)
                    group += 1
                    count = sizes[group, tables.COL_M] * (sizes[group, tables.COL_K] // A_CHUNK_K)
                src, sf, dst = chunk_addresses(
                    cu, first, sizes[group, tables.COL_K],
                    lambda: (ptrs[group, tables.PTR_A], ptrs[group, tables.PTR_SFA],
                             a16_base + offset), Int64)
                words.append(ld_global_nc_v4(src))
                scales.append(ld_global_nc_u16(sf))
                dsts.append(dst)
            for u in cutlass.range_constexpr(STAGE_UNROLL):
                s0, s1 = scale_pair(scales[u])
                outs = [dequant_word(words[u][i], (s0, s0, s1, s1)[i]) for i in range(4)]
                if c + u * stride < total:
                    for q in cutlass.range_constexpr(4):
                        chunk, _ = permuted_chunk(0, q)
                        st_global_v4(dsts[u] + chunk * 16, outs[0][q], outs[1][q], outs[2][q],
                                     outs[3][q])
            c += STAGE_UNROLL * stride
        fence_proxy_async_global()

    @cute.jit
    def _grid_barrier(self, ws_base, grid) -> None:
        """One thread per CTA: a self-resetting barrier over the whole (co-resident,
        cooperatively launched) grid, counters in the zeroed workspace header."""
        counter = ws_base
        generation = ws_base + BARRIER_GENERATION
        seen = ld_acquire_gpu_u32(generation)
        arrived = atom_add_acq_rel_gpu_u32(counter, 1)
        if arrived == Uint32(grid - 1):
            st_relaxed_gpu_u32(counter, 0)  # ready for the next launch before anyone leaves
            red_add_release_gpu_u32(generation, 1)
        else:
            now = ld_acquire_gpu_u32(generation)
            while now == seen:
                nanosleep(64)
                now = ld_acquire_gpu_u32(generation)

    @cute.jit
    def _a16_offset(self, sizes, group) -> Int64:
        """Byte offset of group `group`'s fp16 A in the staging area."""
        offset = Int64(0)
        for g in cutlass.range(group, unroll=1):
            offset += Int64(sizes[g, tables.COL_M]) * Int64(sizes[g, tables.COL_K] * 2)
        return offset

    @cute.jit
    def _producer_a16(self, tma_b, tma_a16, tma_sfb, storage, b_pipe, a_pipe, sizes, ptrs,
                      prefix, desc_base, a16_base, total_tiles, bidx, grid) -> None:
        atoms = (tma_b, tma_a16, tma_sfb)
        ws = cute.make_ptr(Int64, desc_base, cute.AddressSpace.gmem, assumed_align=128)
        self._copy_templates(atoms, ws, bidx)

        packed_b = storage.packed_b.data_ptr()
        scale_b = storage.scale_b.data_ptr()
        a16 = storage.a16.data_ptr()
        b_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        a_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                               self.config.a_slots)
        group = Int32(0)
        prev_group = Int32(-1)
        desc_set = Int32(1)
        tile = bidx
        while tile < total_tiles:
            group, m, n, k = self._group_of(tile, group, prefix, sizes)
            if group != prev_group:
                desc_set = 1 - desc_set
                self._patch_descriptors_a16(atoms, ws, bidx, desc_set, ptrs, sizes, group,
                                            a16_base, m, n, k)
                prev_group = group
            tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
            d_b = tma.descriptor_ptr(ws, bidx, desc_set, OP_B)
            d_a = tma.descriptor_ptr(ws, bidx, desc_set, OP_A)
            d_sfb = tma.descriptor_ptr(ws, bidx, desc_set, OP_SFB)
            row_a = tile_m_idx * self.tile_m
            row_b = tile_n_idx * self.tile_n
            for kt in cutlass.range(k // K_TILE, unroll=1):
                b_pipe.producer_acquire(b_state)
                bar = b_pipe.producer_get_barrier(b_state)
                stage = b_state.index
                tma.tma_load(d_b, packed_b + stage * (self.tile_n * PACKED_ROW_BYTES), bar,
                             (kt * PACKED_ROW_BYTES, row_b))
                tma.tma_load(d_sfb, scale_b + stage * self.sfb_stage_bytes,
                             bar, (0, kt * SCALE_BOX[1], row_b // 128))
                b_pipe.producer_commit(b_state)
                b_state.advance()
                for s in cutlass.range_constexpr(SUB_STEPS):
                    a_pipe.producer_acquire(a_state)
                    tma.tma_load(d_a, a16 + a_state.index * (self.tile_m * SUB_K),
                                 a_pipe.producer_get_barrier(a_state),
                                 (kt * K_TILE + s * SUB_K, row_a))
                    a_pipe.producer_commit(a_state)
                    a_state.advance()
            tile += grid
        b_pipe.producer_tail(b_state)
        a_pipe.producer_tail(a_state)

    @cute.jit
    def _patch_descriptors_a16(self, atoms, ws, bidx, desc_set, ptrs, sizes, group, a16_base,
                               m, n, k) -> None:
        row_bytes = k // 2
        scale_k = k // 64
        a16_ptr = cute.make_ptr(Float16, a16_base + self._a16_offset(sizes, group),
                                cute.AddressSpace.gmem, assumed_align=16)
        tensors = (
            self._bytes_tensor(ptrs[group, tables.PTR_B], (n, row_bytes), (row_bytes, 1)),
            cute.make_tensor(a16_ptr, cute.make_layout((m, k), stride=(k, 1))),
            self._scale_tensor(ptrs[group, tables.PTR_SFB], n, scale_k),
        )
        self._install_descriptors(atoms, tensors, ws, bidx, desc_set)

    @cute.jit
    def _consumer_a16(self, tiled_mma, storage, b_pipe, a_pipe, sizes, ptrs, prefix,
                      total_tiles, bidx, grid, ct) -> None:
        a16_layout = self._a16_layout()
        a16 = storage.a16.get_tensor(a16_layout.outer, swizzle=a16_layout.inner)
        thr_mma = tiled_mma.get_slice(ct)
        frag_a = tiled_mma.make_fragment_B(thr_mma.partition_B(a16))
        frag_w = [tiled_mma.make_fragment_A(thr_mma.partition_shape_A((self.tile_n, SUB_K)))
                  for _ in range(2)]
        words_w = [cute.recast_tensor(f, Uint32) for f in frag_w]
        acc = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((self.tile_n, self.tile_m)), Float32)
        coords = thr_mma.partition_C(cute.make_identity_tensor((self.tile_n, self.tile_m)))
        num_kblocks = cute.size(frag_w[0], mode=[2])
        packed_b = storage.packed_b.data_ptr().toint()
        scale_b = storage.scale_b.data_ptr().toint()

        b_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        a_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                               self.config.a_slots)
        prev_slot = Int32(0)
        group = Int32(0)
        tile = bidx
        while tile < total_tiles:
            group, m, n, k = self._group_of(tile, group, prefix, sizes)
            tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
            # The tile's first weight row within its 128-row scale block (0 unless tile_n 192).
            scale_row0 = (tile_n_idx * self.tile_n) % 128
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            for kt in cutlass.range(k // K_TILE, unroll=1):
                b_pipe.consumer_wait(b_state)
                stage = b_state.index
                if cutlass.const_expr(self.config.w_prefetch):
                    stage_b = packed_b + stage * (self.tile_n * PACKED_ROW_BYTES)
                    stage_s = scale_b + stage * self.sfb_stage_bytes
                    loaded = [self._load_b_half(ct, 0, h, stage_b, stage_s, scale_row0)
                              for h in range(2)]
                for s in cutlass.range_constexpr(SUB_STEPS):
                    if cutlass.const_expr(self.config.w_prefetch):
                        for h in cutlass.range_constexpr(2):
                            self._convert_b_half(words_w[s % 2], ct, h, loaded[h])
                        if cutlass.const_expr(s + 1 < SUB_STEPS):
                            # The next step's shared-memory words, issued before this step's
                            # waits and wgmma so their latency is off the next step's chain.
                            loaded = [self._load_b_half(ct, s + 1, h, stage_b, stage_s,
                                                        scale_row0) for h in range(2)]
                    else:
                        self._dequant_b_fragment(
                            words_w[s % 2], ct, s,
                            packed_b + stage * (self.tile_n * PACKED_ROW_BYTES),
                            scale_b + stage * self.sfb_stage_bytes, scale_row0)
                    if s == SUB_STEPS - 1:
                        b_pipe.consumer_release(b_state)  # the weights are in registers now
                    a_pipe.consumer_wait(a_state)
                    slot = a_state.index
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(num_kblocks):
                        cute.gemm(tiled_mma, acc, frag_w[s % 2][None, None, kb],
                                  frag_a[None, None, kb, slot], acc)
                    warpgroup.commit_group()
                    warpgroup.wait_group(1)
                    # The previous step's wgmma has retired: its A slot may be refilled. (The
                    # first step of a tile has none: the tile end released it.)
                    if cutlass.const_expr(s > 0):
                        a_pipe.consumer_release(_Slot(prev_slot))
                    else:
                        if kt > 0:
                            a_pipe.consumer_release(_Slot(prev_slot))
                    prev_slot = slot
                    a_state.advance()
                b_state.advance()
            warpgroup.wait_group(0)
            a_pipe.consumer_release(_Slot(prev_slot))
            self._store_tile(acc, coords, ptrs[group, tables.PTR_C], m, n,
                             tile_m_idx * self.tile_m, tile_n_idx * self.tile_n)
            tile += grid

    @cute.jit
    def _group_of(self, tile: Int32, group: Int32, prefix: cute.Tensor, sizes: cute.Tensor):
        """Walk forward from `group` to the group owning `tile` (tiles only increase per CTA);
        returns it with its (m, n, k)."""
        while tile >= prefix[group + 1]:
            group += 1
        return (group, sizes[group, tables.COL_M], sizes[group, tables.COL_N],
                sizes[group, tables.COL_K])

    @cute.jit
    def _tile_coords(self, tile: Int32, group: Int32, prefix: cute.Tensor, m: Int32):
        local = tile - prefix[group]
        tiles_m = (m + self.tile_m - 1) // self.tile_m
        tile_n_idx = local // tiles_m
        return local - tile_n_idx * tiles_m, tile_n_idx

    @cute.jit
    def _producer(self, tma_b, tma_a, tma_sfb, tma_sfa, storage, mainloop, sizes, ptrs, prefix,
                  workspace, total_tiles, bidx, grid) -> None:
        atoms = (tma_b, tma_a, tma_sfb, tma_sfa)
        ws = cute.make_ptr(Int64, workspace.toint(), cute.AddressSpace.gmem, assumed_align=128)
        self._copy_templates(atoms, ws, bidx)

        packed_b = storage.packed_b.data_ptr()
        packed_a = storage.packed_a.data_ptr()
        scale_b = storage.scale_b.data_ptr()
        scale_a = storage.scale_a.data_ptr()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        group = Int32(0)
        prev_group = Int32(-1)
        desc_set = Int32(1)
        tile = bidx
        while tile < total_tiles:
            group, m, n, k = self._group_of(tile, group, prefix, sizes)
            if group != prev_group:
                desc_set = 1 - desc_set
                self._patch_descriptors(atoms, ws, bidx, desc_set, ptrs, group, m, n, k)
                prev_group = group
            tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
            d_b = tma.descriptor_ptr(ws, bidx, desc_set, OP_B)
            d_a = tma.descriptor_ptr(ws, bidx, desc_set, OP_A)
            d_sfb = tma.descriptor_ptr(ws, bidx, desc_set, OP_SFB)
            d_sfa = tma.descriptor_ptr(ws, bidx, desc_set, OP_SFA)
            row_a = tile_m_idx * self.tile_m
            row_b = tile_n_idx * self.tile_n
            for kt in cutlass.range(k // K_TILE, unroll=1):
                mainloop.producer_acquire(state)
                bar = mainloop.producer_get_barrier(state)
                stage = state.index
                col = kt * PACKED_ROW_BYTES
                tma.tma_load(d_b, packed_b + stage * (self.tile_n * PACKED_ROW_BYTES), bar,
                             (col, row_b))
                tma.tma_load(d_a, packed_a + stage * (self.tile_m * PACKED_ROW_BYTES), bar,
                             (col, row_a))
                tma.tma_load(d_sfb, scale_b + stage * SCALE_STAGE_BYTES, bar,
                             (0, kt * SCALE_BOX[1], row_b // 128))
                tma.tma_load(d_sfa, scale_a + stage * SCALE_STAGE_BYTES, bar,
                             (0, kt * SCALE_BOX[1], row_a // 128))
                mainloop.producer_commit(state)
                state.advance()
            tile += grid
        mainloop.producer_tail(state)

    @cute.jit
    def _patch_descriptors(self, atoms, ws, bidx, desc_set, ptrs, group, m, n, k) -> None:
        """Point this CTA's descriptor set at group `group` (whole warp; one lane writes)."""
        row_bytes = k // 2
        scale_k = k // 64  # 512-byte atoms per 128-row block
        tensors = (
            self._bytes_tensor(ptrs[group, tables.PTR_B], (n, row_bytes), (row_bytes, 1)),
            self._bytes_tensor(ptrs[group, tables.PTR_A], (m, row_bytes), (row_bytes, 1)),
            self._scale_tensor(ptrs[group, tables.PTR_SFB], n, scale_k),
            self._scale_tensor(ptrs[group, tables.PTR_SFA], m, scale_k),
        )
        self._install_descriptors(atoms, tensors, ws, bidx, desc_set)

    @staticmethod
    def _scale_tensor(address: Int64, rows: Int32, scale_k: Int32) -> cute.Tensor:
        """An operand's blocked scales as the (256 bytes, 2 x 64-K atoms, 128-row blocks) view
        the scale TMA box walks."""
        return Sm90GroupedGemm._bytes_tensor(address,
                                             (SCALE_BOX[0], 2 * scale_k, (rows + 127) // 128),
                                             (1, SCALE_BOX[0], scale_k * SCALE_ATOM_BYTES))

    @cute.jit
    def _copy_templates(self, atoms, ws, bidx) -> None:
        """Copy the descriptor templates (kernel parameters) into both of this CTA's sets."""
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(tma.SETS):
                for o in cutlass.range_constexpr(len(atoms)):
                    cpasync.copy_tensormap(atoms[o], tma.descriptor_ptr(ws, bidx, s, o))
        cute.arch.sync_warp()
        cute.arch.fence_acq_rel_cta()

    @cute.jit
    def _install_descriptors(self, atoms, tensors, ws, bidx, desc_set) -> None:
        """Patch set `desc_set` to `tensors` and make it visible to this warp's TMA loads."""
        for o in cutlass.range_constexpr(len(atoms)):
            cpasync.update_tma_descriptor(atoms[o], tensors[o],
                                          tma.descriptor_ptr(ws, bidx, desc_set, o))
        cute.arch.sync_warp()
        cpasync.fence_tma_desc_release()
        for o in cutlass.range_constexpr(len(atoms)):
            cpasync.fence_tma_desc_acquire(tma.descriptor_ptr(ws, bidx, desc_set, o))

    @staticmethod
    def _bytes_tensor(address: Int64, shape: tuple, stride: tuple) -> cute.Tensor:
        ptr = cute.make_ptr(Uint8, address, cute.AddressSpace.gmem, assumed_align=16)
        return cute.make_tensor(ptr, cute.make_layout(shape, stride=stride))

    @cute.jit
    def _consumer(self, tiled_mma, fb_layout, fa_layout, storage, mainloop, sizes, ptrs, prefix,
                  total_tiles, bidx, grid, ct) -> None:
        fp16_a = storage.fp16_a.get_tensor(fa_layout.outer, swizzle=fa_layout.inner)
        thr_mma = tiled_mma.get_slice(ct)
        frag_a = tiled_mma.make_fragment_B(thr_mma.partition_B(fp16_a))
        if cutlass.const_expr(self.w_regs):
            # Two register fragments: a step writes one while the previous step's wgmma may
            # still read the other (wait_group(1) retires the one before that).
            frag_w = [tiled_mma.make_fragment_A(thr_mma.partition_shape_A((self.tile_n, SUB_K)))
                      for _ in range(2)]
            words_w = [cute.recast_tensor(f, Uint32) for f in frag_w]
            frag_b = frag_w[0]
        else:
            fp16_b = storage.fp16_b.get_tensor(fb_layout.outer, swizzle=fb_layout.inner)
            frag_b = tiled_mma.make_fragment_A(thr_mma.partition_A(fp16_b))
        acc = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((self.tile_n, self.tile_m)), Float32)
        coords = thr_mma.partition_C(cute.make_identity_tensor((self.tile_n, self.tile_m)))
        num_kblocks = cute.size(frag_b, mode=[2])
        step_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.consumer_threads)

        packed_b = storage.packed_b.data_ptr().toint()
        packed_a = storage.packed_a.data_ptr().toint()
        scale_b = storage.scale_b.data_ptr().toint()
        scale_a = storage.scale_a.data_ptr().toint()
        f16_b = storage.fp16_b.data_ptr().toint()
        f16_a = storage.fp16_a.data_ptr().toint()
        fb_stride = self.tile_n * SUB_K * 2  # bytes per fp16 buffer
        fa_stride = self.tile_m * SUB_K * 2

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        step = Int32(0)
        group = Int32(0)
        tile = bidx
        while tile < total_tiles:
            group, m, n, k = self._group_of(tile, group, prefix, sizes)
            tile_m_idx, tile_n_idx = self._tile_coords(tile, group, prefix, m)
            a_row0_in_block = (tile_m_idx * self.tile_m) % 128
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            for kt in cutlass.range(k // K_TILE, unroll=1):
                mainloop.consumer_wait(state)
                stage = state.index
                for s in cutlass.range_constexpr(SUB_STEPS):
                    buf = step % FP16_BUFFERS
                    # Three buffers: the buffer written now was last read by the wgmma of step
                    # `step - 3`, which every consumer warpgroup retired (wait_group(1) at the end
                    # of step - 2) before arriving at the barrier of step - 1.
                    if cutlass.const_expr(self.w_regs):
                        self._dequant_b_fragment(
                            words_w[s % 2], ct, s,
                            packed_b + stage * (self.tile_n * PACKED_ROW_BYTES),
                            scale_b + stage * SCALE_STAGE_BYTES)
                    else:
                        self._dequant_rows(
                            self.tile_n, ct, s,
                            packed_b + stage * (self.tile_n * PACKED_ROW_BYTES),
                            scale_b + stage * SCALE_STAGE_BYTES, 0, f16_b + buf * fb_stride)
                    self._dequant_rows(
                        self.tile_m, ct, s,
                        packed_a + stage * (self.tile_m * PACKED_ROW_BYTES),
                        scale_a + stage * SCALE_STAGE_BYTES, a_row0_in_block,
                        f16_a + buf * fa_stride)
                    if s == SUB_STEPS - 1:
                        mainloop.consumer_release(state)
                    # Generic-proxy stores must be visible to the async proxy (wgmma) ...
                    cute.arch.fence_proxy("async.shared", space="cta")
                    # ... and every consumer's rows written before either warpgroup reads them.
                    step_barrier.arrive_and_wait()
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(num_kblocks):
                        if cutlass.const_expr(self.w_regs):
                            b_operand = frag_w[s % 2][None, None, kb]
                        else:
                            b_operand = frag_b[None, None, kb, buf]
                        cute.gemm(tiled_mma, acc, b_operand, frag_a[None, None, kb, buf], acc)
                    warpgroup.commit_group()
                    warpgroup.wait_group(1)
                    step += 1
                state.advance()
            warpgroup.wait_group(0)
            self._store_tile(acc, coords, ptrs[group, tables.PTR_C], m, n,
                             tile_m_idx * self.tile_m, tile_n_idx * self.tile_n)
            tile += grid

    @cute.jit
    def _dequant_rows(self, rows: int, ct: Int32, s: int, packed: Int32, scales: Int32,
                      scale_row0: Int32, dst: Int32) -> None:
        """Dequantize sub-step `s` (64 K) of `rows` packed rows into an fp16 wgmma tile.

        Thread `ct` of 256 takes `rows / 32` consecutive words (8 e2m1 each) of one row. Packed
        and fp16 tiles are both 128B-swizzled: 16-byte chunk c of row r sits at c ^ (r % 8).
        """
        words = rows // 32  # 4 (16 bytes) for 128 rows, 2 (8 bytes) for 64 rows
        per_row = 8 // words  # threads sharing one row's 64 K
        r = ct // per_row
        part = ct % per_row
        first_word = part * words  # in 0..7: 8 words = 32 bytes = 64 K per row per sub-step
        chunk = 2 * s + first_word // 4
        src = packed + r * PACKED_ROW_BYTES + ((chunk ^ (r % 8)) * 16) + (first_word % 4) * 4
        sr = scale_row0 + r
        scale_at = (scales + s * SCALE_ATOM_BYTES + (sr % 32) * 16 + (sr // 32) * 4
                    + first_word // 2)
        if cutlass.const_expr(words == 4):
            w = ld_shared_v4(src)
            s0, s1 = scale_pair(ld_shared_u16(scale_at))
            scale_per_word = (s0, s0, s1, s1)
        else:
            w = ld_shared_v2(src)
            # One scale for both words; it may be the high byte of its aligned 16-bit pair.
            odd = (first_word // 2) % 2
            both = e4m3x2_to_f16x2(ld_shared_u16(scale_at - odd))
            s0 = prmt(both, 0, Uint32(0x1010) + Uint32(odd) * Uint32(0x2222))
            scale_per_word = (s0, s0)
        outs = [dequant_word(w[i], scale_per_word[i]) for i in range(words)]
        if cutlass.const_expr(self.w_regs):
            # K order of the register B operand (see _dequant_b_fragment): output pair q of
            # word j (0..7) belongs at K 32 (j // 4) + 8 q + 2 (j % 4), i.e. 16-byte chunk
            # 4 (j // 4) + q at byte 4 (j % 4): this thread's words fill one slice of 4 chunks.
            for q in cutlass.range_constexpr(4):
                chunk, byte = permuted_chunk(first_word, q)
                dst_at = dst + r * (SUB_K * 2) + ((chunk ^ (r % 8)) * 16) + byte
                if cutlass.const_expr(words == 4):
                    st_shared_v4(dst_at, outs[0][q], outs[1][q], outs[2][q], outs[3][q])
                else:
                    st_shared_v2(dst_at, outs[0][q], outs[1][q])
        else:
            for i in cutlass.range_constexpr(words):
                out_chunk = first_word + i  # 8 K = 16 bytes of fp16 per input word
                dst_at = dst + r * (SUB_K * 2) + ((out_chunk ^ (r % 8)) * 16)
                st_shared_v4(dst_at, outs[i][0], outs[i][1], outs[i][2], outs[i][3])

    @cute.jit
    def _dequant_b_fragment(self, words: cute.Tensor, ct: Int32, s: int, packed: Int32,
                            scales: Int32, scale_row0: Int32 = 0) -> None:
        """Dequantize sub-step `s` of this thread's B rows straight into its wgmma A fragment.

        The fragment of thread (warp w, lane l) holds rows r0 = 16 w + l / 4 (+ 64 per
        warpgroup) and r1 = r0 + 8 at K positions 2c, 2c+1, 2c+8, 2c+9 of each k16 block
        (c = l % 4); word index 4 kb + 2 khalf + rowhalf. The K order inside a 64-K step is
        ours to choose (both operands follow it): packed word c of a row (8 e2m1) feeds blocks
        0 and 1 of thread c, word c + 4 blocks 2 and 3, so each thread reads 2 words per row.
        """
        for half in cutlass.range_constexpr(2):
            self._convert_b_half(words, ct, half,
                                 self._load_b_half(ct, s, half, packed, scales, scale_row0))

    @cute.jit
    def _load_b_half(self, ct: Int32, s: int, half: int, packed: Int32, scales: Int32,
                     scale_row0: Int32) -> tuple:
        """The shared-memory words of row r0 + 8 half for sub-step `s` (_dequant_b_fragment):
        its packed words c and c + 4, and its 4 scales of the step."""
        t = ct % 128
        c = t % 4
        row = (ct // 128) * 64 + (t // 32) * 16 + (t % 32) // 4 + 8 * half
        base = packed + row * PACKED_ROW_BYTES
        lo = ld_shared_u32(base + (((2 * s) ^ (row % 8)) * 16) + 4 * c)
        hi = ld_shared_u32(base + (((2 * s + 1) ^ (row % 8)) * 16) + 4 * c)
        four = ld_shared_u32(scale_word_offset(row, s, self.scale_blocks, scale_row0,
                                               base=scales))
        return lo, hi, four

    @cute.jit
    def _convert_b_half(self, words: cute.Tensor, ct: Int32, half: int, loaded: tuple) -> None:
        """Convert one row's loaded words (_load_b_half) into its fragment slots."""
        lo, hi, four = loaded
        c = (ct % 128) % 4
        # Word c uses scale column c // 2 and word c + 4 column 2 + c // 2.
        sel = Uint32(c // 2) | (Uint32(2 + c // 2) << Uint32(4))
        both = scales_w(prmt(four, 0, sel))
        d_lo = dequant_word_w(lo, both, 0)
        d_hi = dequant_word_w(hi, both, 1)
        for q in cutlass.range_constexpr(4):
            words[fragment_word(q, half, 0)] = d_lo[q]
            words[fragment_word(q, half, 1)] = d_hi[q]

    @cute.jit
    def _store_tile(self, acc, coords, c_address: Int64, m: Int32, n: Int32, row0: Int32,
                    col0: Int32) -> None:
        """Accumulator (B row, A row) -> C[A row, B row] as fp16, skipping rows >= m, cols >= n."""
        c_ptr = cute.make_ptr(Float16, c_address, cute.AddressSpace.gmem, assumed_align=16)
        c = cute.make_tensor(c_ptr, cute.make_layout((m, n), stride=(n, 1)))
        for i in cutlass.range_constexpr(cute.size(acc)):
            b_row, a_row = coords[i]
            row = row0 + a_row
            col = col0 + b_row
            if row < m and col < n:
                # Register weights leave dequant_word_w scaled by 2^-7 (fp4_bits.W_SCALE_EXP).
                c[row, col] = Float16(acc[i] * Float32(W_UNSCALE) if self.w_regs else acc[i])


def _check_dsl_arch(arch: str) -> None:
    """CUTE_DSL_ARCH is read once at `import cutlass`; a mismatch would silently target sm_100."""
    env_arch = os.environ.get("CUTE_DSL_ARCH")
    if env_arch != arch:
        raise RuntimeError(
            f"CUTE_DSL_ARCH must be {arch!r} before cutlass is imported, but got {env_arch!r}")


def compile_kernel(config: Config, *, arch: str,
                   groups: list[tuple[int, int, int]]) -> CompiledKernel:
    """Compile the kernel for `config` (shape-generic; `groups` is recorded as what it serves)."""
    if arch != "sm_90a":
        raise ValueError(f"arch must be 'sm_90a' for the sm90 family, but got {arch!r}")
    _check_dsl_arch(arch)
    gemm = Sm90GroupedGemm(config)
    i32 = make_ptr(Int32, 16, cute.AddressSpace.gmem, assumed_align=16)
    i64 = make_ptr(Int64, 16, cute.AddressSpace.gmem, assumed_align=16)
    ws = make_ptr(Int64, 128, cute.AddressSpace.gmem, assumed_align=128)
    with tempfile.TemporaryDirectory(prefix="nvfp4_sm90_") as dump:
        compiled = cute.compile(
            gemm, i32, i64, i32, ws, Int32(1), Int32(1),
            options=f"--gpu-arch {arch} --keep-cubin --keep-ptx --dump-dir {dump}",
        )
        cubin, ptx = compiled.__cubin__, compiled.__ptx__
    if not isinstance(cubin, bytes) or not ptx:
        raise RuntimeError("the DSL returned no cubin/PTX (dump directory missing?)")
    symbols = list(compiled.kernel_info)
    if len(symbols) != 1:
        raise RuntimeError(f"expected exactly one kernel in the module, but got {symbols}")
    require_no_stack_frame(cubin, symbols[0],
                           "every role should fit its registers: check ptxas did not ignore "
                           "setmaxnreg ('ignored to maintain minimum register requirements')")
    require_async_wgmma(cubin, symbols[0], "fewer accumulators or fragments per thread")
    # Record what the DSL's own launcher would use, and check it against the kernel's own view.
    launch = lowered_launch(compiled)
    block = ptx_reqntid(ptx, symbols[0])
    if launch["dynamic_smem"] != gemm.smem_bytes or tuple(launch["block"]) != block:
        raise RuntimeError(f"launcher uses smem {launch['dynamic_smem']} and block "
                           f"{launch['block']}, the kernel expects {gemm.smem_bytes} and {block}")
    return CompiledKernel(
        symbol=symbols[0],
        cubin=cubin,
        ptx=ptx,
        params=gemm.args.params(),
        block=block,
        cluster=ptx_cluster_dims(ptx, symbols[0]),
        dynamic_smem=launch["dynamic_smem"],
        # a_fp16 has a grid-wide barrier: the launch must be cooperative (all CTAs resident).
        grid={"policy": "persistent", "ctas_per_sm": 1,
              **({"cooperative": True} if config.a_fp16 else {})},
        tile={"m": config.tile_m, "n": config.tile_n, "k": K_TILE},
        tables=tables.tables_record(
            tma.SETS * tma.MAPS_PER_SET,
            header_bytes=HEADER_BYTES if config.a_fp16 else 0,
            bytes_per_a_element=2 if config.a_fp16 else 0),
        constraints={"groups": [list(g) for g in groups], "k_multiple": K_TILE,
                     "n_multiple": N_MULTIPLE},
    )
