"""NVFP4 x NVFP4 block-scaled grouped GEMM for Hopper (sm_90a), in CuTe DSL.

Op, per group g:
    C_g[m, n] = alpha[g] * sum_k (A_g[m, k] * SFA_g[m, k//16]) * (B_g[n, k] * SFB_g[n, k//16])
with A (M, K) and B (N, K) packed e2m1 (K/2 bytes per row, element 2j in the low nibble), SFA and
SFB e4m3 in the blocked 128x4 layout of facts.md, alpha one fp32 per group (the checkpoint's
global scales; the runtime passes ones when the caller gives none), C (M, N) row-major in
Config.out_dtype (fp16 or bf16); fp32 accumulation, alpha applied to the fp32 accumulator.

Hopper has no FP4 tensor cores, so the data path is (v3):
  phase 1: all warps but warp 0 of every CTA convert a share of all groups' A to fp16 (value *
           scale * 2^-7, exact) into the workspace, in the kernel's permuted K order, while
           warp 0 loads its first tile's first weight stages; a grid-wide barrier follows (the
           launch is cooperative, so all CTAs are resident; its counters are at the
           grid_barrier parameter, zeroed by the runtime and left zeroed). With
           Config.stream_a (streamed.py) warps 1..3 stage A in K order while the tiles run
           instead, and the producer waits for each stage's A rows alone
  phase 2: TMA (packed B fp4 and its scale bytes, per-group descriptors patched in the
           workspace) -> a `stages`-deep mbarrier pipeline; TMA of fp16 A tiles (64 K each)
           -> an `a_slots`-deep ring; one producer warp issues both
    -> one consumer warpgroup per 64 weight rows of the tile (setmaxnreg moves registers from
       the producer warpgroup to them) dequantizes B to fp16 straight into its wgmma register
       fragments (dequant.dequant_word_w) and runs RS wgmma m64nNk16 with A from the ring
    -> epilogue scales by alpha[g] * 2^14 (both operands carried 2^-7: one FMUL) and rounds to
       out_dtype into a padded shared C tile; warps 1..3 store it to C in 16-byte vectors
       (rows >= m and cols >= n untouched) while the consumers go on.
v2 (A converted per tile) was removed in issue 25 (last at b6627c2).

Operand roles are swapped to suit mixture-of-experts shapes (few tokens m, many weight rows n):
the wgmma M dimension walks B's rows (tile_n per CTA tile, 64 per warpgroup) and the wgmma N
dimension walks A's rows (tile_m, config.TILE_MS), so a small m wastes at most tile_m - 1 rows.

Persistent grouped schedule: CTA b takes tiles b, b + grid, ... (Config.blocked_tiles: one run)
of the concatenated per-group tile lists of the CTA prefix table (m-tiles fastest in a group).
Group count, problem sizes, pointers and the grid are run-time values; nothing about the call is
baked into the cubin.

Constraints: k % 64 == 0 (k % 256 with stream_a: config.k_multiple), n % 8 == 0,
16-byte aligned rows and base pointers, scales padded to 128-row atoms (the blocked layout
always is). Build: see build_kernels.py (CUTE_DSL_ARCH=sm_90a).

Code: this module holds the host-side trace (TMA templates, shared storage, launch) and what the
roles share (tables, tile walk, descriptor patching); compile.py compiles it. The roles are
mixins: staged.py (role dispatch, phase 1, grid barrier), producer.py, consumer.py, epilogue.py
(the tile loop), streamed.py (stream_a) and weights.py (weights into wgmma registers).
structure.py has shared layout constants, fp4_bits.py / dequant.py the bit tricks, ptx.py the
PTX. hooks.py: the no-op diagnostic hooks the roles call, which the trace build's subclasses
(experiments/trace_kernels.py) override.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float16, Float32, Int32, Int64, Uint8
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from kernels import tables
from kernels.abi import KernelArgs
from kernels.introspect import subbyte_tma_geometry, tma_swizzle

from . import tma
from .config import (
    K_TILE,
    SCALE_ATOM_BYTES,
    SCALE_STAGE_BYTES,
    SUB_K,
    Config,
    c_tile_bytes,
    can_implement,
    k_multiple,
    scale_blocks,
    smem_bytes,
)
from .consumer import TileConsumer
from .context import CtaContext
from .epilogue import AsyncEpilogue
from .fp4_bits import ACC_UNSCALE
from .hooks import TraceHooks
from .inline_a import InlineA
from .producer import TileProducer
from .ptx import trap
from .staged import HEADER_BYTES, StagedA
from .staging import STREAM_HEADER_BYTES
from .streamed import StreamedA
from .structure import PACKED_ROW_BYTES, SCALE_BOX, SUB_STEPS, WARPGROUP
from .weights import WeightFragments

SYMBOL_PREFIX = "nvfp4_gg_sm90"
# Placeholder extents for the descriptor templates; the kernel patches dims and strides.
_PH_ROWS, _PH_ROW_BYTES = 1024, 4096
_PH_SCALE = (256, 64, 16)
_PH_K = 4096  # placeholder K of the fp16 A template
C_DTYPES = {"float16": Float16, "bfloat16": BFloat16}


class Sm90GroupedGemm(StagedA, InlineA, TileProducer, TileConsumer, AsyncEpilogue, StreamedA,
                      WeightFragments, TraceHooks):
    """One persistent warp-specialized kernel per Config; see the module docstring."""

    # compile_kernel requires every wgmma to stay asynchronous (ptxas serializes them when a
    # thread holds too much); diagnostic subclasses without MMA (experiments/diag_kernels.py)
    # clear it. Likewise every role must fit its registers (no stack frame), unless a diagnostic
    # subclass (experiments/trace_kernels.py) clears REQUIRE_NO_STACK_FRAME.
    REQUIRE_ASYNC_WGMMA = True
    REQUIRE_NO_STACK_FRAME = True

    def __init__(self, config: Config) -> None:
        reasons = self.can_implement(config)
        if reasons:
            raise ValueError("; ".join(reasons))
        self.config = config
        self.c_dtype = C_DTYPES[config.out_dtype]  # what the epilogue rounds C to
        self.tile_m = config.tile_m  # A rows (tokens) per CTA tile = wgmma N
        self.tile_n = config.tile_n  # B rows (weights) per CTA tile = consumer warpgroups x 64
        self.consumer_threads = WARPGROUP * (config.tile_n // 64)
        self.threads = WARPGROUP + self.consumer_threads
        self.scale_blocks = scale_blocks(config.tile_n)
        self.sfb_stage_bytes = self.scale_blocks * SCALE_STAGE_BYTES  # weight scales per stage
        self.stages = config.stages
        # Descriptor sets per CTA, used in turn on group changes (tma.py). The A ring holds
        # a_slots sub-stage loads; a set is patched one tile before its loads (patch_ahead):
        # one set more in the rotation.
        self.desc_sets = tma.sets_needed(max(config.stages, -(-config.a_slots // SUB_STEPS)) + 1)
        # The zeroed header at the workspace's start and the grid_barrier parameter: the grid
        # barrier (staged.py), or with stream_a the progress counters (staging.py).
        self.header_bytes = STREAM_HEADER_BYTES if config.stream_a else HEADER_BYTES
        self.args: KernelArgs | None = None
        self.smem_bytes = 0

    @staticmethod
    def can_implement(config: Config, shapes: Sequence[Sequence[int]] | None = None
                      ) -> list[str]:
        """Reasons this kernel cannot be built for `config` (and serve the groups `shapes`);
        config.can_implement, the rules shapes.yaml validation uses too."""
        return can_implement(config, shapes)

    # ------------------------------------------------------------------ host (trace time)
    @cute.jit
    def __call__(
        self,
        problem_sizes: cute.Pointer,
        pointers: cute.Pointer,
        cta_prefix: cute.Pointer,
        workspace: cute.Pointer,
        grid_barrier: cute.Pointer,
        alpha: cute.Pointer,
        num_groups: Int32,
        num_ctas: Int32,
    ) -> None:
        # num_ctas only sizes the launch: a static grid would let the compiler assume
        # blockIdx.x == 0, which a persistent kernel must never see.
        args = KernelArgs()
        self._record_templates(args)
        args.table("problem_sizes", problem_sizes, "problem_sizes")
        args.table("pointers", pointers, "pointers")
        args.table("cta_prefix", cta_prefix, "cta_prefix")
        self._record_state(args, workspace, grid_barrier, alpha, num_groups)
        self._launch(args, num_ctas)

    def _record_templates(self, args: KernelArgs) -> None:
        """The four TMA descriptor templates (B, A, SFB, SFA), recorded in `args` in that
        order: the kernel's first parameters. Nothing loads through SFA (phase 1 reads A's
        scales with plain loads); its template and slot keep the launch ABI (and cubins) v2's."""
        tile_n = self.tile_n

        packed_b_smem = self._packed_layout(tile_n)
        scale_smem = cute.make_layout(SCALE_BOX, stride=(1, SCALE_BOX[0]))
        op = cpasync.CopyBulkTensorTileG2SOp()
        packed_ph = self._placeholder((_PH_ROWS, _PH_ROW_BYTES), (_PH_ROW_BYTES, 1))
        scale_stride = (1, _PH_SCALE[0], _PH_SCALE[0] * _PH_SCALE[1])
        scale_ph = self._placeholder(_PH_SCALE, scale_stride)
        atom_b, _ = cpasync.make_tiled_tma_atom(op, packed_ph, packed_b_smem,
                                                (tile_n, PACKED_ROW_BYTES))
        a16_ph = cute.make_tensor(
            cute.make_ptr(Float16, Int64(16), cute.AddressSpace.gmem, assumed_align=16),
            cute.make_layout((_PH_ROWS, _PH_K), stride=(_PH_K, 1)))
        a16_smem = self._a16_slot_layout()
        atom_a, _ = cpasync.make_tiled_tma_atom(op, a16_ph, a16_smem,
                                                (self._a16_load_rows(), SUB_K))
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
        args.tma_template("tma_a", atom_a, "a",
                          geometry(atom_a, (_PH_ROWS, _PH_K), (_PH_K, 1), a16_smem))
        args.tma_template("tma_sfb", atom_sfb, "sfb",
                          geometry(atom_sfb, _PH_SCALE, scale_stride,
                                   scale_smem if self.scale_blocks == 1 else sfb_smem))
        args.tma_template("tma_sfa", atom_sfa, "sfa",
                          geometry(atom_sfa, _PH_SCALE, scale_stride, scale_smem))

    def _record_state(self, args: KernelArgs, workspace, grid_barrier, alpha,
                      num_groups) -> None:
        """The parameters after the call's tables: workspace, grid barrier, alpha and the
        group count."""
        args.table("tensormap_workspace", workspace, "tensormap_workspace")
        # The grid barrier's zeroed header (staged.py): its own parameter, so a captured
        # launch can keep it outside the graph's workspace (runtime/device.py).
        args.table("grid_barrier", grid_barrier, "grid_barrier")
        args.table("alpha", alpha, "alpha")
        args.scalar("num_groups", num_groups, "num_groups")

    def _launch(self, args: KernelArgs, num_ctas) -> None:
        """Declare the shared storage, then launch `self.kernel` on `args` (trace time)."""
        tile_n = self.tile_n
        stages = self.stages
        a_slots = self.config.a_slots
        a16_elems = cute.cosize(self._a16_layout())
        sfb_stage_bytes = self.sfb_stage_bytes

        # Fields as a dict of real objects: string annotations (this module's `from __future__
        # import annotations`) would be evaluated in a frame that does not hold these locals.
        fields = {
            "mbar": cute.struct.MemRange[Int64, stages * 2],
            "mbar_a": cute.struct.MemRange[Int64, a_slots * 2],
        }
        # The storers' look-ahead for the consumers: (k, first scale row) of the tile after
        # the one being handed over. Inside the barriers' first KiB, so the size is
        # config.smem_bytes's.
        fields["next_tile"] = cute.struct.MemRange[Int32, 2]
        # The C scale (_c_scale) of the tile being handed over, posted by the storers.
        fields["tile_scale"] = cute.struct.MemRange[Float32, 1]
        if self.config.device_offsets:
            # The group of the CTA's first tile (_first_group).
            fields["first_group"] = cute.struct.MemRange[Int32, 1]
        fields |= {
            "packed_b": cute.struct.Align[
                cute.struct.MemRange[Uint8, stages * tile_n * PACKED_ROW_BYTES], 1024],
            "scale_b": cute.struct.Align[
                cute.struct.MemRange[Uint8, stages * sfb_stage_bytes], 128],
            "a16": cute.struct.Align[cute.struct.MemRange[Float16, a16_elems], 1024],
        }
        fields["c_tile"] = cute.struct.Align[
            cute.struct.MemRange[self.c_dtype, c_tile_bytes(self.config) // 2], 1024]
        self.shared_storage = cute.struct(
            type("SharedStorageA16", (), {"__annotations__": fields}))
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
        return sm90_utils.make_trivial_tiled_mma(
            Float16, Float16, OperandMajorMode.K, OperandMajorMode.K, Float32,
            (self.tile_n // 64, 1, 1), tiler_mn=(64, self.tile_m),
            a_source=warpgroup.OperandSource.RMEM,
        )

    def _a16_layout(self) -> Any:
        """The fp16 A ring: K-major 128B-swizzled (tile_m, 64) tiles, a_slots deep."""
        return sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR,
                                             (self.tile_n, self.tile_m, SUB_K), Float16,
                                             self.config.a_slots)

    def _a16_load_rows(self) -> int:
        """A rows per fp16 A TMA load: the whole tile (a diagnostic subclass may load less)."""
        return self.tile_m

    def _a16_slot_layout(self) -> Any:
        """The shared layout one fp16 A TMA load fills: one slot of the ring."""
        return cute.slice_(self._a16_layout(), (None, None, 0))

    @staticmethod
    def _packed_layout(rows: int) -> Any:
        """Packed fp4 rows of 128 bytes, 128B-swizzled so 8 rows x 16 B reads hit 32 banks."""
        return cute.make_composed_layout(
            cute.make_swizzle(3, 4, 3), 0,
            cute.make_layout((rows, PACKED_ROW_BYTES), stride=(PACKED_ROW_BYTES, 1)))

    @staticmethod
    def _placeholder(shape: tuple, stride: tuple) -> cute.Tensor:
        return cute.make_tensor(cute.make_ptr(Uint8, Int64(16), cute.AddressSpace.gmem,
                                              assumed_align=16),
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
        grid_barrier: cute.Pointer,
        alpha: cute.Pointer,
        num_groups: Int32,
    ) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        self._run((tma_b, tma_a, tma_sfb, tma_sfa), problem_sizes, pointers, cta_prefix,
                  workspace, grid_barrier, alpha, num_groups, tidx, warp_idx, bidx, grid)

    @cute.jit
    def _run(self, atoms, problem_sizes, pointers, cta_prefix, workspace, grid_barrier, alpha,
             num_groups, tidx, warp_idx, bidx, grid, first_group=None) -> None:
        """The kernel body once the call's tables are in device memory (`atoms`: the B, A,
        SFB and SFA templates; SFA unused, _record_templates)."""
        tma_b, tma_a, tma_sfb, _ = atoms
        # The runtime launches with the recorded dynamic smem; trap rather than corrupt memory
        # if a launch ever provides less.
        if cute.arch.dynamic_smem_size() < self.smem_bytes:
            trap()
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        # Read by the epilogues through _c_scale (in the CtaContext the roles get).
        alpha_table = cute.make_tensor(alpha, cute.make_layout(num_groups))
        # What _context makes the CtaContext of, once _kernel_a16 has set up its pipelines.
        tables_ = (problem_sizes, pointers, cta_prefix, alpha_table, num_groups, bidx, grid)
        if cutlass.const_expr(first_group is not None):
            # Warp 0's group of the CTA's first tile, found while deriving the tables
            # (kernels/device_offsets.py), for every role (_first_group): in shared memory at
            # once, so no register holds it through the setup.
            if tidx == 0:
                storage.first_group.get_tensor(cute.make_layout(1))[0] = first_group
        self._kernel_a16((tma_b, tma_a, tma_sfb), storage, tables_, workspace, grid_barrier,
                         tidx, warp_idx)

    @cute.jit
    def _context(self, problem_sizes, pointers, cta_prefix, alpha_table, num_groups, bidx,
                 grid) -> CtaContext:
        """The device tables as tensors (kernels/tables.py layouts), the total tile count, this
        CTA and the grid: the roles' read-only context."""
        sizes = cute.make_tensor(problem_sizes, cute.make_layout((num_groups, 4), stride=(4, 1)))
        ptrs = cute.make_tensor(pointers, cute.make_layout((num_groups, 5), stride=(5, 1)))
        prefix = cute.make_tensor(cta_prefix, cute.make_layout(num_groups + 1))
        total = prefix[num_groups]
        first, step, end = self._first_tile(bidx, grid, total), grid, total
        if cutlass.const_expr(self.config.blocked_tiles):
            step = Int32(1)
            end = cutlass.min(total, first + (total + grid - 1) // grid)
        return CtaContext(sizes=sizes, ptrs=ptrs, prefix=prefix, alpha=alpha_table,
                          total_tiles=total, bidx=bidx, grid=grid, num_groups=num_groups,
                          first_tile=first, tile_step=step, tile_end=end)

    def _first_tile(self, bidx: Int32, grid: Int32, total: Int32) -> Int32:
        """This CTA's first tile of `total`: bidx, or with blocked_tiles the start of its run of
        ceil(total / grid)."""
        if cutlass.const_expr(self.config.blocked_tiles):
            return bidx * ((total + grid - 1) // grid)
        return bidx

    def _tma_pipeline(self, barriers: Any, stages: int, tx_bytes: int, producers: int = 1
                      ) -> Any:
        """A TMA-fed mbarrier pipeline: `producers` arrivals fill a slot (the thread issuing
        the TMA; inline_a's A ring: every lane of a converter warp, plain arrivals);
        consumer_release arrives once per consumer warp (lane 0)."""
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers.data_ptr(),
            num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, producers),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     self.consumer_threads // 32),
            tx_count=tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )

    @cute.jit
    def _group_of(self, tile: Int32, group: Int32, prefix: cute.Tensor, sizes: cute.Tensor):
        """Walk forward from `group` to the group owning `tile` (tiles only increase per CTA);
        returns it with its (m, n, k)."""
        while tile >= prefix[group + 1]:
            group += 1
        return (group, sizes[group, tables.COL_M], sizes[group, tables.COL_N],
                sizes[group, tables.COL_K])

    @cute.jit
    def _first_group(self, storage, cta: CtaContext) -> Int32:
        """Where a role walks to its first tile's group from: the group itself in a
        device-offsets kernel (found while deriving the tables, in shared memory since _run),
        group 0 in a list kernel (a few groups, host-built tables). Walking the prefix table for
        it after the grid barrier cost up to 12 us of a 30 us call (docs/lab_notebook.md,
        twentieth session)."""
        group = Int32(0)
        if cutlass.const_expr(self.config.device_offsets):
            group = storage.first_group.get_tensor(cute.make_layout(1))[0]
        return group

    def _k_stages(self, k: Int32) -> Int32:
        """K_TILE stages of a tile of this k: the last may run past k (config.K_MULTIPLE).
        Configs that take whole stages only keep the plain quotient (and their cubins)."""
        if k_multiple(self.config) == K_TILE:
            return k // K_TILE
        return (k + K_TILE - 1) // K_TILE

    @cute.jit
    def _tile_coords(self, tile: Int32, group: Int32, prefix: cute.Tensor, m: Int32):
        local = tile - prefix[group]
        tiles_m = (m + self.tile_m - 1) // self.tile_m
        tile_n_idx = local // tiles_m
        return local - tile_n_idx * tiles_m, tile_n_idx

    def _desc(self, ws: Any, cta: Any, set_idx: Any, operand: int) -> Any:
        return tma.descriptor_ptr(ws, cta, set_idx, operand, self.desc_sets)

    def _next_set(self, desc_set: Any) -> Any:
        """The descriptor set a group change patches: the sets are used in turn."""
        return (desc_set + 1) % self.desc_sets

    @staticmethod
    def _scale_tensor(address: Int64, rows: Int32, scale_k: Int32) -> cute.Tensor:
        """An operand's blocked scales as the (256 bytes, 2 x 64-K atoms, 128-row blocks) view
        the scale TMA box walks."""
        return Sm90GroupedGemm._bytes_tensor(address,
                                             (SCALE_BOX[0], 2 * scale_k, (rows + 127) // 128),
                                             (1, SCALE_BOX[0], scale_k * SCALE_ATOM_BYTES))

    @cute.jit
    def _copy_templates(self, atoms, ws, bidx) -> None:
        """Copy the descriptor templates (kernel parameters) into every one of this CTA's sets."""
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(self.desc_sets):
                for o in cutlass.range_constexpr(len(atoms)):
                    cpasync.copy_tensormap(atoms[o], self._desc(ws, bidx, s, o))
        cute.arch.sync_warp()
        cute.arch.fence_acq_rel_cta()

    @cute.jit
    def _install_descriptors(self, atoms, tensors, ws, bidx, desc_set) -> None:
        """Patch set `desc_set` to `tensors` and make it visible to this warp's TMA loads."""
        for o in cutlass.range_constexpr(len(atoms)):
            cpasync.update_tma_descriptor(atoms[o], tensors[o],
                                          self._desc(ws, bidx, desc_set, o))
        cute.arch.sync_warp()
        cpasync.fence_tma_desc_release()
        for o in cutlass.range_constexpr(len(atoms)):
            cpasync.fence_tma_desc_acquire(self._desc(ws, bidx, desc_set, o))

    @staticmethod
    def _bytes_tensor(address: Int64, shape: tuple, stride: tuple) -> cute.Tensor:
        ptr = cute.make_ptr(Uint8, address, cute.AddressSpace.gmem, assumed_align=16)
        return cute.make_tensor(ptr, cute.make_layout(shape, stride=stride))

    def _c_scale(self, cta: CtaContext, group: Int32) -> Float32:
        """What a tile of `group` multiplies its fp32 accumulator by before the cast: the
        group's alpha and ACC_UNSCALE (both operands leave dequant_word_w scaled by 2^-7), one
        factor, so the epilogue keeps one FMUL per element. Exact reordering: ACC_UNSCALE is a
        power of two, so acc * (alpha * 2^14) rounds as (acc * 2^14) * alpha does."""
        return cta.alpha[group] * Float32(ACC_UNSCALE)

