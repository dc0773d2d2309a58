"""The shipped kernel's diagnostic hooks: methods the roles call at fixed places, which do
nothing here (they emit no code: a Python call at trace time). A diagnostic subclass overrides
them: the clock-stamp build is experiments/trace_kernels.py's TracedSm90GroupedGemm (and
TracedSm90OffsetsGemm), which experiments/trace_families.py builds. A hook takes the raw
values its override needs (never an expression over them), so the shipped kernels trace no
extra operation."""

from __future__ import annotations


class TraceHooks:
    """No-op hooks; `trace` is a tile's handle from _tile_trace (None here)."""

    trace_bytes = 0  # bytes per CTA the hooks' records take in the workspace

    def _trace_start(self, workspace, a16_base, tidx, bidx, grid, num_groups=None):
        """Phase start (staged.py): returns the fp16 A base, past any records reserved."""
        return a16_base

    def _tile_trace(self, tile, cta, ct=None):
        """A tile's handle for the stamps below (ct: the consumer thread; None: producer)."""
        return None

    def _stamp_tile(self, trace, event: int) -> None:
        """Tile event `event` (0/1 K loop start/end, 2/3 hand-over wait/done)."""

    def _stamp_step(self, trace, kt, s: int, event: int) -> None:
        """Consumer K step event (stage kt, sub-step s)."""

    def _stamp_stage(self, trace, kt, event: int) -> None:
        """Producer stage event (stage kt)."""

    def _stamp_a_wait(self, trace, kt, kb) -> None:
        """Producer: stage kt's staged A seen ready (stream_a)."""

    def _stamp_prologue(self, event: int, kt=None) -> None:
        """Producer prologue event (lane 0; with kt, its first stage only)."""

    def _stamp_stager(self, event: int, st, it=None) -> None:
        """A stream_a stager's event (stager st; with it, its first iteration only)."""
