"""The trace build's kernels (experiments/trace_families.py; its compile module, so it imports
cutlass): TracedSm90GroupedGemm overrides the shipped kernel's no-op hooks
(kernels/sm90/hooks.py) with clock stamps into a record per CTA in the workspace, between the
descriptors and the fp16 A, at the places trace_families.TRACE_* lay out;
TracedSm90OffsetsGemm is the device-offsets (serving) kernel with the same stamps. The shipped
kernels hold none of it."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from trace_families import (
    TRACE_BYTES,
    TRACE_CONSUMER_BYTES,
    TRACE_GLOBAL_EVENTS,
    TRACE_PRODUCER_BYTES,
    TRACE_STAGE_EVENTS,
    TRACE_STAGES,
    TRACE_STEP_EVENTS,
    TRACE_TILE_EVENTS,
    TRACE_TILES,
)

from kernels.abi import CompiledKernel
from kernels.sm90 import compile as sm90_compile
from kernels.sm90.config import Config
from kernels.sm90.grouped_gemm import Sm90GroupedGemm
from kernels.sm90.offsets import Sm90OffsetsGemm
from kernels.sm90.ptx import stamp_clock, stamp_globaltimer
from kernels.sm90.structure import SUB_STEPS


def compile_kernel(config: Config, *, arch: str,
                   groups: list[tuple[int, int, int]]) -> CompiledKernel:
    """The build worker's entry (trace_families.py): `config`'s kernel with the stamps,
    TracedSm90OffsetsGemm for device_offsets, else TracedSm90GroupedGemm."""
    kernel_class = TracedSm90OffsetsGemm if config.device_offsets else TracedSm90GroupedGemm
    return sm90_compile.compile_kernel(config, arch=arch, groups=groups,
                                       kernel_class=kernel_class)


class TracedSm90GroupedGemm(Sm90GroupedGemm):
    """The shipped kernel with its hooks stamping (hooks.py says where each is called); where
    each event's stamp goes in this CTA's record. A handle `trace` is (record index of the
    tile, whether this thread records it); hooks given None stamp nothing."""

    trace_bytes = TRACE_BYTES
    REQUIRE_NO_STACK_FRAME = False  # the stamps spill a few per-tile values outside the K loop

    def _trace_start(self, workspace, a16_base, tidx, bidx, grid, num_groups=None) -> Int64:
        """Reserve the grid's records before A (returns A's new base) and stamp the CTA's
        start. The record is kept as its parts (a kernel parameter, the CTA index, the grid
        and, for a device-offsets kernel's derived tables, the group count): a 64-bit address
        held across the roles spilled."""
        self._trace_parts = (workspace, bidx, grid, num_groups)
        self._stamp_cta(0, Int32(tidx == 0))
        return a16_base + grid * TRACE_BYTES

    def _tile_trace(self, tile, cta, ct=None) -> tuple:
        """(record index of this CTA's tile, whether this thread records it: consumer thread
        ct 0, or the producer's thread 0): tiles past TRACE_TILES share the last index and
        are not recorded."""
        recorder = cute.arch.thread_idx()[0] == 0 if ct is None else ct == 0
        local = (tile - cta.first_tile) // cta.tile_step
        return (cutlass.min(local, Int32(TRACE_TILES - 1)),
                Int32(recorder) & Int32(local < TRACE_TILES))

    def _stamp_tile(self, trace, event: int) -> None:
        if trace is not None:
            self._stamp_tile_at(trace[0], event, trace[1])

    def _stamp_step(self, trace, kt, s: int, event: int) -> None:
        if trace is None:
            return
        index, rec = trace
        kt = cutlass.min(kt, Int32(TRACE_STAGES - 1))
        slot = ((index * TRACE_STAGES + kt) * SUB_STEPS + s) * TRACE_STEP_EVENTS + event
        stamp_clock(self._trace_at(slot * 8), rec)

    def _stamp_stage(self, trace, kt, event: int) -> None:
        if trace is None:
            return
        index, rec = trace
        kt = cutlass.min(kt, Int32(TRACE_STAGES - 1))
        slot = (index * TRACE_STAGES + kt) * TRACE_STAGE_EVENTS + event
        stamp_clock(self._trace_at(TRACE_CONSUMER_BYTES + slot * 8), rec)

    def _stamp_a_wait(self, trace, kt, kb) -> None:
        """The first tile's first wait for staged A (CTA event 4)."""
        if trace is not None:
            self._stamp_cta(4, trace[1] & Int32(trace[0] == 0) & Int32(kt == kb))

    def _stamp_prologue(self, event: int, kt=None) -> None:
        rec = Int32(cute.arch.lane_idx() == 0)
        if kt is not None:
            rec = rec & Int32(kt == 0)
        self._stamp_cta(event, rec)

    def _stamp_stager(self, event: int, st, it=None) -> None:
        rec = Int32(st == 0)
        if it is not None:
            rec = Int32(it == 0) & rec
        self._stamp_cta(event, rec)

    # ------------------------------------------------------------------ the record
    def _trace_at(self, offset) -> Int64:
        """Global address of byte `offset` of this CTA's record."""
        workspace, bidx, grid, num_groups = self._trace_parts
        return (self._past_descriptors(workspace.toint(), grid, num_groups)
                + Int64(bidx * TRACE_BYTES + offset))

    def _stamp_cta(self, event: int, rec) -> None:
        """One of the CTA's own events (trace_families.TRACE_CTA_EVENTS), after its tiles' records.
        The events named in TRACE_GLOBAL_EVENTS also get a %globaltimer stamp in their own
        slot, which compares across CTAs."""
        self._stamp_tile_at(Int32(TRACE_TILES), event, rec)
        if event in TRACE_GLOBAL_EVENTS:
            slot = TRACE_TILES * TRACE_TILE_EVENTS + TRACE_GLOBAL_EVENTS[event]
            stamp_globaltimer(self._tile_record_at(slot), rec)

    def _stamp_tile_at(self, index, event: int, rec) -> None:
        stamp_clock(self._tile_record_at(index * TRACE_TILE_EVENTS + event), rec)

    def _tile_record_at(self, slot) -> Int64:
        """Address of stamp `slot` of the tiles' and the CTA's part of the record."""
        return self._trace_at(TRACE_CONSUMER_BYTES + TRACE_PRODUCER_BYTES + slot * 8)


class TracedSm90OffsetsGemm(Sm90OffsetsGemm, TracedSm90GroupedGemm):
    """The device-offsets (serving) kernel with the same stamps; its records follow every
    CTA's derived tables (Sm90GroupedGemm._past_descriptors)."""
