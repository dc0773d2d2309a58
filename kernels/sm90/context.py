"""The per-CTA context of the sm_90a kernel: what every role reads about the call, built once
at trace time in the kernel body and passed down as one value instead of a tail of positional
parameters. Read-only by design: CuTe DSL's AST preprocessor turns `if`/`while` on run-time
values into scf ops that carry only local variables, so an attribute written inside one fails
("A value carried through this `if` is a plain Python value"); roles rebind locals instead
(pipeline states, tile and group cursors stay plain locals of the role that advances them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CtaContext:
    sizes: Any  # (num_groups, 4) Int32 tensor: m, n, k, l per group (kernels/tables.py)
    ptrs: Any  # (num_groups, 5) Int64 tensor: A, B, SFA, SFB, C addresses per group
    prefix: Any  # (num_groups + 1,) Int32 tensor: the first tile of each group, then the total
    alpha: Any  # (num_groups,) Float32 tensor: the C scale of each group
    total_tiles: Any  # Int32: prefix[num_groups]
    bidx: Any  # Int32: this CTA's index
    grid: Any  # Int32: the CTAs of the launch
    num_groups: Any  # Int32: the call's groups (the kernel parameter)
    # This CTA's tiles: first_tile, first_tile + tile_step, ... below tile_end. Strided (every
    # grid-th tile from bidx) or, with Config.blocked_tiles, one run of consecutive tiles.
    first_tile: Any  # Int32
    tile_step: Any  # Int32
    tile_end: Any  # Int32


@dataclass(frozen=True)
class Mainloop:
    """v3's tile pipeline as its roles share it: the producer fills, the consumers drain."""

    atoms: tuple  # (tma_b, tma_a16, tma_sfb): descriptor templates, in OP_B, OP_A, OP_SFB order
    storage: Any  # the kernel's shared storage (SharedStorageA16)
    b_pipe: Any  # PipelineTmaAsync, `stages` deep: packed weight rows and their scale bytes
    a_pipe: Any  # PipelineTmaAsync, `a_slots` deep: fp16 A tiles of 64 K
    desc_base: Any  # Int64: workspace address of the CTAs' descriptor sets (past the header)
    a16_base: Any  # Int64: workspace address of the staged fp16 A (groups back to back)


@dataclass(frozen=True)
class MmaOperands:
    """A v3 consumer thread's side of the mainloop (consumer.py, _consumer_operands)."""

    tiled_mma: Any  # RS wgmma m64 x tile_m x k16, weights from registers, A from shared memory
    frag_a: Any  # wgmma B fragments over the whole A ring (the last mode is the slot)
    frag_w: Any  # two wgmma A fragments (fp16 weights): step s converts into frag_w[s % 2]
    words_w: Any  # frag_w recast to Uint32 words, what dequantization writes
    acc: Any  # fp32 accumulator fragment (tile_n x tile_m, this thread's share)
    coords: Any  # acc's (weight row, A row) coordinates inside the tile
    num_kblocks: int  # k16 blocks per 64-K step
    packed_b: Any  # Int32: shared address of the weight stages
    scale_b: Any  # Int32: shared address of the weight-scale stages
    b_pipe: Any
    a_pipe: Any
