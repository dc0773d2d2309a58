"""Constants and formulas that kernels (build time), the builder and the runtime all use.

Imports nothing but the standard library: no DSL, no torch, no driver, so `kernels/` may import
it at trace time and the runtime at serve time, and each number has one owner (before this
module TENSORMAP_BYTES was defined four times and the blocked-scale size formula four times).

- Device tables (what the kernels index, what the manifest's `tables` record describes):
  problem_sizes int32 (G, 4) of PROBLEM_COLUMNS; pointers int64 (G, 5) of POINTER_COLUMNS;
  cta_prefix int32 (G + 1,); tensormap workspace slots of TENSORMAP_BYTES, that aligned.
- NVFP4 blocked scales: one e4m3 scale per SF_VEC elements of K, stored in 128-row x 4-column
  atoms (`blocked_scale_numel`).
- MN_LIMIT: the kernels index C with 32-bit offsets, so every group needs m * n < 2^31.
- MAX_GROUPS: groups per set, the spec's limit and the manifest reader's; MAX_SHARDS: N of a
  `--shard I/N` build.
"""

from __future__ import annotations

PROBLEM_COLUMNS = ("m", "n", "k", "l")
POINTER_COLUMNS = ("a", "b", "sfa", "sfb", "c")
COL_M, COL_N, COL_K, COL_L = range(4)
PTR_A, PTR_B, PTR_SFA, PTR_SFB, PTR_C = range(5)
TABLE_DTYPES = ("int32", "int64")

# A CUtensorMap is 128 bytes and must be 128-byte aligned (CUDA driver API).
TENSORMAP_BYTES = 128

INT32_LIMIT = 2**31  # problem_sizes and cta_prefix cells are int32
MN_LIMIT = 2**31  # m * n per group: C is indexed with 32-bit offsets

# Groups one set may have (shapes.yaml `groups`, or E of `experts: E`): the spec refuses more
# and the manifest reader too, so a tampered `experts` cannot make load build a huge row tuple.
MAX_GROUPS = 1024
# N of a `--shard I/N` build, as the manifest records it ([I, N]) and merge reads it: merge
# needs every one of the N shards, so a larger N is a tampered or mistyped one.
MAX_SHARDS = 4096

SF_VEC = 16  # elements of K per e4m3 scale
SCALE_ROWS = 128  # rows of one blocked-scale atom
SCALE_COLS = 4  # scale columns of one atom (4 * SF_VEC = 64 elements of K)


def scale_cols(k: int) -> int:
    """Scale columns (bytes) of one blocked row: ceil(k / 64) * 4, one scale per 16 k."""
    # + and // only (k > 0): the device-offsets kernels evaluate it on a DSL Int32 too.
    return (k + SCALE_COLS * SF_VEC - 1) // (SCALE_COLS * SF_VEC) * SCALE_COLS


def blocked_scale_numel(rows: int, k: int) -> int:
    """Bytes of one operand's e4m3 scales in the blocked layout: ceil(rows / 128) * 128 rows
    x scale_cols(k)."""
    return (rows + SCALE_ROWS - 1) // SCALE_ROWS * SCALE_ROWS * scale_cols(k)


def sfa_rows_needed(t: int, experts: int) -> int:
    """Blocked A-scale rows that hold any routing of t rows over `experts` experts, each
    expert's rows padded to 128: round_up(t, 128) + 128 * experts (scaled_grouped_mm's sfa)."""
    return (t + SCALE_ROWS - 1) // SCALE_ROWS * SCALE_ROWS + SCALE_ROWS * experts


# Device-offsets kernels (Config.device_offsets; the serving contract, issue 26): each CTA
# derives the three tables above from the call's offsets itself, into its own slot of the
# workspace placed after the CTAs' descriptor sets: the pointers first (8-byte cells), then the
# problem sizes, then the CTA prefix, then each expert's end row in the order its rows are
# staged (ROW_ENDS: phase 1 and the producer find a row's expert and an expert's staged A from
# it in O(log E) and O(1) instead of walking the experts), the slot rounded up to
# OFFSETS_TABLE_ALIGN bytes.
OFFSETS_TABLE_ALIGN = 128
POINTER_ROW_BYTES = 8 * len(POINTER_COLUMNS)
PROBLEM_ROW_BYTES = 4 * len(PROBLEM_COLUMNS)


def offsets_tables_bytes(groups):  # an int, or a DSL Int32 at trace time
    """Bytes of one CTA's derived tables for `groups` groups (pointers, problem sizes, CTA
    prefix, row ends), rounded up to OFFSETS_TABLE_ALIGN. Written with + and // only, so the
    kernel evaluates the same expression on its run-time group count."""
    raw = (POINTER_ROW_BYTES + PROBLEM_ROW_BYTES + 4 + 4) * groups + 4
    return (raw + OFFSETS_TABLE_ALIGN - 1) // OFFSETS_TABLE_ALIGN * OFFSETS_TABLE_ALIGN
