"""Where the kernel's phase 1 reads and writes one chunk of A (no DSL import: CPU tests
check the same formulas the kernel traces, on Python ints).

A group's A is staged in A_CHUNK_K-element chunks, numbered row-major: k // A_CHUNK_K chunks per
row. A chunk is 16 packed bytes of A, the 2 scale bytes of its two 16-K blocks (adjacent in the
blocked layout), and 64 bytes of fp16 output. The output rows are k fp16 long, and each 64-K
step of a row is one 128-byte TMA box row, holding two chunks. The two lanes that take a step's
two chunks each convert the words of their own parity of the whole step (fp4_bits.position_word;
phase 1 swaps half its loaded words with the partner lane, dequant.exchange_half_step, and
inline_a's converters load theirs, half_step_addresses), which fill their own chunk's 64 output
bytes in the K order of the weights' fragments.
"""

from __future__ import annotations

from typing import Any

from .config import K_TILE, SCALE_ATOM_BYTES, SUB_K
from .fp4_bits import position_vector, position_word

A_CHUNK_K = 32  # K elements per staging chunk: 16 packed bytes in, 64 fp16 bytes out


def chunk_addresses(index: Any, first: Any, k: Any, bases: Any,
                    wide: Any = int) -> tuple[Any, Any, Any]:
    """(packed A, scale, fp16 output) byte addresses of chunk `index` of the call, the chunk
    `index - first` of its group, whose K is k.
    `bases()` gives the group's A pointer, SFA pointer and staging start (called after the
    index arithmetic, where the kernel has always read them); `wide` makes a 64-bit integer
    (Int64 in the kernel) of the row terms. Pass `lambda: (0, 0, 0)` for offsets."""
    chunks_per_row = k // A_CHUNK_K
    local = index - first
    row = local // chunks_per_row
    kc = local - row * chunks_per_row
    j = kc * 2  # blocked scales: 16-K blocks 2 kc and 2 kc + 1 are adjacent
    sf = (((row // 128) * (k // 64) + j // 4) * SCALE_ATOM_BYTES
          + (row % 32) * 16 + ((row % 128) // 32) * 4 + j % 4)
    a_base, sf_base, dst_base = bases()
    return (a_base + wide(row) * wide(k // 2) + kc * 16, sf_base + wide(sf),
            dst_base + wide(row) * wide(k * 2) + (kc // 2) * (SUB_K * 2) + (kc % 2) * 64)


def half_step_addresses(step: Any, parity: Any) -> tuple[Any, list[int]]:
    """(a base address, the byte offsets from it of the 4 packed words of positions 0..3) of
    the lane of parity `parity` in the 64-K step of one A row whose packed bytes start at
    `step`: the step's words p, p + 2, p + 4, p + 6 (fp4_bits.position_word), 8 bytes apart,
    so the offsets are immediates. The step's 4 scales are one aligned word
    (inline_step_offsets)."""
    base = step + 4 * position_word(parity, 0)
    return base, [4 * (position_word(0, i) - position_word(0, 0)) for i in range(4)]


# Stores of one chunk's 64 fp16 bytes (four 16-byte vectors v0..v3 at offsets 0, 16, 32, 48),
# shared by the two lanes of a pair (lane parity p; the even lane holds an even chunk, the odd
# lane the next one, whose output follows it). Storing its own four vectors, each lane would
# fill half of a 32-byte sector per store instruction; a partly written sector that is not in
# L2 costs a DRAM read before the write (docs/lab_notebook.md, 2026-11-30: about half of
# moe_gateup's staging). Instead each lane sends two vectors to its partner
# (PAIR_SEND[p]: the partner receives them as r0, r1) and store i of the pair writes one whole
# sector: the even lane the first half, the odd lane the second.
PAIR_SEND = (("v1", "v3"), ("v0", "v2"))  # what lane p sends (as r0, r1)
PAIR_STORES = (  # per lane parity: (offset from the lane's own output, vector) per store
    ((0, "v0"), (32, "v2"), (64, "r0"), (96, "r1")),
    ((-48, "r0"), (-16, "r1"), (16, "v1"), (48, "v3")),
)


def pair_store_offset(i: int, p: Any) -> Any:
    """Byte offset of store i of lane parity p from the lane's own chunk output (PAIR_STORES,
    one formula for both parities, as the kernel computes it)."""
    return 64 * (i // 2) + 32 * (i % 2) - 48 * p


# ------------------------------------------------------------------ streamed staging (stream_a)
# With Config.stream_a, phase 1 overlaps the tile loop: warps 1..3 of every CTA stage A while
# the consumers already run, and each producer waits only for the A it is about to load. The
# chunks are then numbered K-slab-major: slab kt holds the chunks of weight stage kt (K_TILE
# elements, SLAB_CHUNKS chunks) of every row of every group (rows back to back, as the fp16
# area holds them), so the first stages of all tiles are staged first. It needs one k for all
# groups (kernels/sm90/config.py, check_groups).
SLAB_CHUNKS = K_TILE // A_CHUNK_K  # chunks of one row in one weight stage
STREAM_WARPS = 3  # warps 1..3 stage; each counts its own iterations
STREAM_STAGERS = STREAM_WARPS * 32
STREAM_UNROLL = 2  # chunks a stager has in flight (they run at the producer warpgroup's registers)


def slab_chunk(index: Any, rows: Any) -> tuple[Any, Any, Any]:
    """(stage kt, row among all groups' rows, K chunk within the row) of streamed chunk
    `index`, for `rows` rows in all."""
    slab = rows * SLAB_CHUNKS
    kt = index // slab
    r = index - kt * slab
    return kt, r // SLAB_CHUNKS, kt * SLAB_CHUNKS + r % SLAB_CHUNKS


def chunks_before(kt: Any, row_end: Any, rows: Any) -> Any:
    """How many streamed chunks precede the end of stage kt's chunks of rows < row_end: once
    they are all staged, so are stages 0..kt of those rows."""
    return (kt * rows + row_end) * SLAB_CHUNKS


# The progress header (the kernel's grid_barrier parameter, zeroed by the runtime once): two
# banks of PROGRESS_SLOTS counters and an epoch word. A launch uses bank epoch % 2: after a
# streaming iteration, each stager warp of each CTA adds 1 to its slot (iterations past the last
# slot share it), so a slot is complete at grid * STREAM_WARPS. CTA 0 zeroes the other bank and
# advances the epoch once every iteration is counted, which is after every CTA has read the
# epoch; the next launch (stream-ordered) then finds its bank zeroed.
PROGRESS_SLOTS = 32
PROGRESS_BANK_BYTES = PROGRESS_SLOTS * 4
EPOCH_OFFSET = 2 * PROGRESS_BANK_BYTES
STREAM_HEADER_BYTES = 384  # the banks and the epoch, rounded up to whole 128-byte lines


def progress_slot(iteration: Any) -> Any:
    """The counter slot streaming iteration `iteration` adds to."""
    return min(iteration, PROGRESS_SLOTS - 1)


def progress_target(iteration: Any, iterations: Any, counters: Any) -> tuple[Any, Any]:
    """(value of progress_slot(iteration) once `iteration` is counted by all `counters` counting
    warps (grid * STREAM_WARPS), and how many iterations are then known staged). The last slot
    is shared, so it proves only that all `iterations` are."""
    if iteration < PROGRESS_SLOTS - 1:
        return counters, iteration + 1
    return counters * (iterations - (PROGRESS_SLOTS - 1)), iterations


# ------------------------------------------------------------------ inline A (Config.inline_a)
# A converter warp covers INLINE_A_ROWS rows of a tile: lane 2 r + h converts half h (the words
# of parity h, half_step_addresses) of row r of each 64-K step, and writes its 64 fp16 bytes
# straight into the A ring's slot where the TMA box of the staged copy would have put them: row r
# at r * SUB_K * 2 bytes, 16-byte vector c (= 4 h + q, fp4_bits.position_vector, as phase 1
# writes it) at c XOR (r % 8) (TMA's 128-byte swizzle, which is what the slot's wgmma layout
# reads).
def inline_row_offsets(row: Any, k: Any) -> tuple[Any, Any]:
    """(packed A, scale) byte offsets of row `row` of a group, from the group's A and SFA
    pointers: chunk_addresses' row terms (the step terms are inline_step_offsets')."""
    return (row * (k // 2),
            (row // 128) * (k // 64) * SCALE_ATOM_BYTES + (row % 32) * 16
            + ((row % 128) // 32) * 4)


def inline_step_offsets(ks: Any) -> tuple[Any, Any]:
    """(packed A, scale word) byte offsets of 64-K step ks from its row's: 32 packed bytes,
    and its four scales, one word at the start of the blocked layout's atom of 64 K."""
    return ks * 32, ks * SCALE_ATOM_BYTES


def inline_smem_offset(r: Any, h: Any, q: Any) -> Any:
    """Byte offset in an A slot of row r's 16-byte vector q of half h (0 or 1) of the step."""
    return r * (SUB_K * 2) + ((position_vector(h, q) ^ (r % 8)) * 16)
