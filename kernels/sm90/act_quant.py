"""The activation quantizers, AOT sm_90a kernels (imports cutlass: build worker only): bf16
tokens -> NVFP4 codes and blocked e4m3 scales for the two serving layouts, one thread per
16-element block, then CTAs that write sfa's padding zeros: one launch per call, no memset.

- `experts` (runtime.activations.quantize_experts): x (T, K) with rows grouped by expert, offs
  (E,) int32 as scaled_grouped_mm takes them, sfa in its layout. Every CTA derives ends =
  cummax(clamp(offs, 0, T)) and each expert's first blocked scale row in shared memory, for
  up to MAX_EXPERTS experts.
- `masked` (quantize_masked): x (E, max_m, K), sfa (E, round_up(max_m, 128) * round_up(K/16, 4)),
  optionally masked_m (E,) int32: the rows past it are neither read nor written.

Same bits as runtime.activations, by the same IEEE operations where the reference uses float64
(the block scale: amax / 6 / gs in f64, to f32, to e4m3, both round to nearest even), and by an
exact equivalent where it divides: a value's code compares |x| with the e2m1 midpoints times
denom = scale * gs. Each product has at most 3 + 4 + 24 bits, so it is exact in f64, and |x|
(bf16, exact in f32) exceeds it iff it exceeds its f32 round-down and reaches it iff it reaches
its f32 round-up. The reference's f64 quotient cannot flip a comparison or a tie either: an
unequal quotient sits at least 2^-31 (relative) away from a midpoint, its rounding 2^-53.
tests/test_act_quant_kernel.py runs the algorithm in torch against quantize_nvfp4 on ties,
near-ties, saturation, subnormals, NaN / inf and bad scales; experiments/act_quant_check.py
compares the shipped kernels with runtime.activations bit for bit on the H200.

The caller (runtime/quantize.py) launches the quantizing CTAs (experts: ceil(blocks /
THREADS); masked: `quant_ctas`, at most that, grid-stride) and after them at least one filling
CTA (each an equal run of sfa_chunks, sfa's 16-byte chunks), passes x
contiguous and 16-byte aligned, a 8-byte aligned, sfa 16-byte aligned, and keeps the block count
and sfa's bytes in Int32. Parameters, in launch order, are recorded with kernels.abi under the
manifest's quantizer vocabulary (QUANT_OPERANDS, QUANT_SCALARS).

GPU record: 2026-12-05, H200 (as experiments/act_quant.py, 9c5ddd7): 43/43 cases bit-equal to
runtime.activations; the experts path 8.2-22.2 us at 512 rows against 171-496 us for the
torch path. Shipped (2026-12-06, H200, 08f130e): 43/43 through the runtime, 21 GPU tests,
7.9-22.9 us at 8-64 tokens x 8 (bench/RESULTS.md). The masked kernel's valid-block walk
(2026-12-07, H100, 78c4496's build): 33 GPU tests exact, E 32 x max_m 256 x K 7168 with about 8
rows each 27.6 -> 10.7 us against the walk over every block. Its table and walk through
_running_sum / _end_before (2026-12-07, H100, cubin 7c9db504): 29 GPU tests and every
act_quant_check case exact, its masked_m calls within 0.6 us of the walk's first form.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cute.runtime import make_ptr
from cutlass.cutlass_dsl import T, dsl_user_op

from kernels.abi import KernelArgs
from kernels.introspect import lowered_launch, ptx_reqntid, require_no_stack_frame
from runtime.manifest import QUANT_OPERANDS, QUANT_SCALARS

from .ptx import _asm, _i64, _ir, ld_global_nc_v4

THREADS = 256
# The experts kernel's tables in shared memory: up to MAX_EXPERTS experts (ends and pstart),
# plus one scan cell per warp.
EXPERTS_PER_THREAD = 4
MAX_EXPERTS = THREADS * EXPERTS_PER_THREAD
TABLE_SMEM_BYTES = (2 * MAX_EXPERTS + THREADS // 32) * 4 + 64
# The masked kernel's table (with masked_m): each expert's end in the valid blocks' order.
MASKED_SMEM_BYTES = (MAX_EXPERTS + THREADS // 32) * 4 + 64
# e2m1 rounding midpoints (runtime.nvfp4._E2M1_MIDPOINTS) as PTX f64 literals.
MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _f64_literal(v: float) -> str:
    import struct

    return "0d" + struct.pack(">d", v).hex().upper()


def _pure(ret: Any, text: str, constraints: str, args: list[Any], loc: Any, ip: Any) -> Any:
    return llvm.inline_asm(ret, args, text, constraints, has_side_effects=False,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                           loc=loc, ip=ip)


@dsl_user_op
def bf16_to_f32(bits: Any, *, loc: Any = None, ip: Any = None) -> Float32:
    """The bf16 in the HIGH half of `bits` (mask the low half off first) as f32 (exact)."""
    return Float32(_pure(T.f32(), "mov.b32 $0, $1;", "=f,r", [_ir(bits, loc, ip)], loc, ip))


@dsl_user_op
def poison(gs: Any, *, loc: Any = None, ip: Any = None) -> Float32:
    """0 when the decode scale is positive and finite, else NaN. amax starts from it, so a bad
    scale poisons every block of its expert as a NaN value would (runtime.activations)."""
    text = ("{\n.reg .pred p;\nsetp.gt.f32 p, $1, 0f00000000;\n"
            "setp.lt.and.f32 p, $1, 0f7F800000, p;\nselp.f32 $0, 0f00000000, 0f7FFFFFFF, p;\n}")
    return Float32(_pure(T.f32(), text, "=f,f", [gs.ir_value(loc=loc, ip=ip)], loc, ip))


@dsl_user_op
def max_nan_abs(a: Any, b: Any, *, loc: Any = None, ip: Any = None) -> Float32:
    """max(a, |b|), NaN if either is NaN (torch's amax propagates NaN)."""
    return Float32(_pure(T.f32(), "{\n.reg .f32 t;\nabs.f32 t, $2;\nmax.NaN.f32 $0, $1, t;\n}",
                         "=f,f,f", [a.ir_value(loc=loc, ip=ip), b.ir_value(loc=loc, ip=ip)],
                         loc, ip))


@dsl_user_op
def scale_byte(amax: Any, gs: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    """e4m3 byte of min(amax / 6 / gs, 448) computed in f64, rounded to f32, then to e4m3
    (nearest even both times), as quantize_nvfp4 does."""
    text = ("{\n.reg .f64 a, g, q;\n.reg .f32 f, z;\n.reg .b16 h;\n"
            "cvt.f64.f32 a, $1;\ncvt.f64.f32 g, $2;\n"
            f"div.rn.f64 q, a, {_f64_literal(6.0)};\ndiv.rn.f64 q, q, g;\n"
            f"min.f64 q, q, {_f64_literal(448.0)};\ncvt.rn.f32.f64 f, q;\n"
            "mov.f32 z, 0f00000000;\ncvt.rn.satfinite.e4m3x2.f32 h, z, f;\n"
            "cvt.u32.u16 $0, h;\nand.b32 $0, $0, 255;\n}")
    return Uint32(_pure(T.i32(), text, "=r,f,f",
                        [amax.ir_value(loc=loc, ip=ip), gs.ir_value(loc=loc, ip=ip)], loc, ip))


@dsl_user_op
def denominator(byte: Any, gs: Any, *, loc: Any = None, ip: Any = None) -> Float64:
    """f64(e4m3 byte) * f64(gs): exact (4 + 24 significant bits)."""
    text = ("{\n.reg .b16 h;\n.reg .b32 r;\n.reg .f16 lo;\n.reg .f32 s;\n.reg .f64 d, g;\n"
            "cvt.u16.u32 h, $1;\ncvt.rn.f16x2.e4m3x2 r, h;\nmov.b32 {lo, _}, r;\n"
            "cvt.f32.f16 s, lo;\ncvt.f64.f32 d, s;\ncvt.f64.f32 g, $2;\nmul.rn.f64 $0, d, g;\n}")
    return Float64(_pure(T.f64(), text, "=d,r,f",
                         [_ir(byte, loc, ip), gs.ir_value(loc=loc, ip=ip)], loc, ip))


@dsl_user_op
def threshold(denom: Any, midpoint: float, up: bool, *, loc: Any = None,
              ip: Any = None) -> Float32:
    """midpoint * denom (exact in f64) rounded to f32 down (up: up)."""
    mode = "rp" if up else "rm"
    text = (f"{{\n.reg .f64 t;\nmul.rn.f64 t, $1, {_f64_literal(midpoint)};\n"
            f"cvt.{mode}.f32.f64 $0, t;\n}}")
    return Float32(_pure(T.f32(), text, "=f,d", [denom.ir_value(loc=loc, ip=ip)], loc, ip))


@dsl_user_op
def usable(amax: Any, denom: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    """1 when the block gets codes: no NaN in it and denom > 0 (else every code is 0)."""
    text = ("{\n.reg .pred p, q;\nsetp.gt.f64 p, $2, 0d0000000000000000;\n"
            "setp.num.and.f32 q, $1, $1, p;\nselp.u32 $0, 1, 0, q;\n}")
    return Uint32(_pure(T.i32(), text, "=r,f,d",
                        [amax.ir_value(loc=loc, ip=ip), denom.ir_value(loc=loc, ip=ip)],
                        loc, ip))


@dsl_user_op
def e2m1_code(x: Any, down: list, up_odd: list, ok: Any, *, loc: Any = None,
              ip: Any = None) -> Uint32:
    """The e2m1 code of x / denom, round to nearest, ties to the even code, saturating at 6,
    +0 for what rounds to zero, 0 unless ok. lo = the midpoints below |x| (|x| > the f32
    round-down of midpoint * denom), found by a 3-step binary search of the 7 sorted
    round-downs `down`; |x| ties midpoint lo exactly iff |x| >= its round-up, which only moves
    an odd lo (to the even lo + 1), so only the round-ups of midpoints 1, 3, 5 (`up_odd`) are
    needed. Counting all 14 compares took ~29 more SASS instructions an element (the masked
    kernel 1232 -> 768 before the padding fill; docs/lab_notebook.md, twenty-seventh session)."""
    text = "\n".join([
        "{", ".reg .pred p1, p2, p3, pt, p, q;", ".reg .f32 m, t2, ta, tb, t3, ua, ub, u;",
        ".reg .u32 c, t;", "abs.f32 m, $1;",
        "setp.gt.f32 p1, m, $5;",            # > down[3]
        "selp.f32 t2, $7, $3, p1;",          # down[5] : down[1]
        "setp.gt.f32 p2, m, t2;",
        "selp.f32 ta, $8, $4, p1;",          # down[6] : down[2]
        "selp.f32 tb, $6, $2, p1;",          # down[4] : down[0]
        "selp.f32 t3, ta, tb, p2;",
        "setp.gt.f32 p3, m, t3;",            # lo = 4 p1 + 2 p2 + p3
        # lo = 7: no midpoint above, so NaN, which no |x| reaches (+inf would: inf >= inf, a
        # code of 8); lo = 3: up[3].
        "selp.f32 ua, 0f7FFFFFFF, $10, p1;",
        "selp.f32 ub, $11, $9, p1;",         # lo = 5: up[5]; lo = 1: up[1]
        "selp.f32 u, ua, ub, p2;",
        "setp.ge.and.f32 pt, m, u, p3;",     # an odd lo's tie rounds up to the even code
        "selp.u32 c, 4, 0, p1;", "selp.u32 t, 2, 0, p2;", "add.u32 c, c, t;",
        "selp.u32 t, 1, 0, p3;", "add.u32 c, c, t;", "selp.u32 t, 1, 0, pt;", "add.u32 c, c, t;",
        "setp.lt.f32 p, $1, 0f00000000;", "setp.ne.and.u32 q, c, 0, p;",
        "selp.u32 t, 8, 0, q;", "or.b32 c, c, t;",
        "setp.ne.u32 p, $12, 0;", "selp.u32 $0, c, 0, p;", "}"])
    args = [x.ir_value(loc=loc, ip=ip)] + [v.ir_value(loc=loc, ip=ip) for v in down + up_odd]
    args.append(_ir(ok, loc, ip))
    return Uint32(_pure(T.i32(), text, "=r" + ",f" * 11 + ",r", args, loc, ip))


@dsl_user_op
def ld_global_nc_b32(addr: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    return _asm("ld.global.nc.b32 $0, [$1];", "=r,l", [_i64(addr, loc, ip)], loc, ip, True)


@dsl_user_op
def ld_global_nc_f32(addr: Any, *, loc: Any = None, ip: Any = None) -> Float32:
    out = llvm.inline_asm(T.f32(), [_i64(addr, loc, ip)], "ld.global.nc.f32 $0, [$1];", "=f,l",
                          has_side_effects=True, is_align_stack=False,
                          asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return Float32(out)


@dsl_user_op
def st_global_v2(addr: Any, w0: Any, w1: Any, *, loc: Any = None, ip: Any = None) -> None:
    _asm("st.global.v2.b32 [$0], {$1, $2};", "l,r,r",
         [_i64(addr, loc, ip), _ir(w0, loc, ip), _ir(w1, loc, ip)], loc, ip)


@dsl_user_op
def st_global_u8(addr: Any, value: Any, *, loc: Any = None, ip: Any = None) -> None:
    _asm("{\n.reg .b16 h;\ncvt.u16.u32 h, $1;\nst.global.u8 [$0], h;\n}", "l,r",
         [_i64(addr, loc, ip), _ir(value, loc, ip)], loc, ip)


@dsl_user_op
def st_global_zero(addr: Any, width: int, *, loc: Any = None, ip: Any = None) -> None:
    """Store `width` (16, 4 or 1) zero bytes at addr (aligned to width)."""
    text = {16: "st.global.v4.b32 [$0], {0, 0, 0, 0};", 4: "st.global.b32 [$0], 0;",
            1: "st.global.u8 [$0], 0;"}[width]
    _asm(text, "l", [_i64(addr, loc, ip)], loc, ip)


def _blocked_offset(row: Any, j: Any, k: Any) -> Any:
    """runtime.nvfp4.blocked_scale_offset (facts.md) of scale column j of row `row`."""
    rest_k = (k // 16 + 3) // 4
    return (((row // 128) * rest_k + j // 4) * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4
            + (j % 4))


class _Quantizer:
    """One thread per (row, 16-element block) of x: what both layouts share."""

    SMEM_BYTES = 0  # dynamic shared memory of the launch

    def _record(self, operands: tuple, scalars: tuple) -> list:
        """The kernel's arguments through kernels.abi, so the manifest's parameter list comes
        from the traced values (each parameter named by its role)."""
        self.args = KernelArgs(operands=QUANT_OPERANDS, scalars=QUANT_SCALARS)
        for name, ptr in operands:
            self.args.operand(name, ptr, name)
        for name, value in scalars:
            self.args.scalar(name, value, name)
        return self.args.values()

    @cute.jit
    def _position(self, x, a, k) -> tuple:
        """This thread's block: (index, row r, scale column j, its 16 values' address, its 8
        code bytes' address); the caller checks index < blocks."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        idx = bidx * THREADS + tidx
        r = idx // (k // 16)
        j = idx - r * (k // 16)
        return (idx, r, j, x.toint() + (Int64(r) * Int64(k) + Int64(j * 16)) * 2,
                a.toint() + Int64(r) * Int64(k // 2) + Int64(j * 8))

    @cute.jit
    def _block_scan(self, scan, tid, value, is_max: bool):
        """The exclusive prefix (max or +; the values are >= 0, so 0 is the identity of both)
        of thread tid's value across the CTA: a shuffle scan in each warp, then each thread
        folds the totals of the warps before its own from shared memory. Two barriers, against
        sixteen for a Hillis-Steele scan through shared memory."""
        lane = tid % 32
        warp = tid // 32
        v = value
        for d in cutlass.range_constexpr(5):
            below = cute.arch.shuffle_sync_up(v, 1 << d)
            if lane >= (1 << d):
                v = cutlass.max(v, below) if is_max else v + below
        if lane == 31:
            scan[warp] = v
        cute.arch.sync_threads()
        prefix = cute.arch.shuffle_sync_up(v, 1)
        if lane == 0:
            prefix = Int32(0)
        for w in cutlass.range_constexpr(THREADS // 32):
            if w < warp:
                prefix = cutlass.max(prefix, scan[w]) if is_max else prefix + scan[w]
        cute.arch.sync_threads()  # the scratch is reused by the next scan
        return prefix

    @cute.jit
    def _first_above(self, table, n, value) -> Int32:
        """The first g < n with table[g] > value (n if none): a binary search of the
        non-decreasing shared-memory table."""
        lo = Int32(0)
        hi = n
        while lo < hi:
            mid = (lo + hi) // 2
            if table[mid] > value:
                hi = mid
            else:
                lo = mid + 1
        return lo

    @cute.jit
    def _end_before(self, table, g) -> Int32:
        """table[g - 1], the end before entry g of a running table (0 for g = 0)."""
        start = Int32(0)
        if g > 0:
            start = table[g - 1]
        return start

    @cute.jit
    def _running_sum(self, table, scan, tid, n, entry) -> None:
        """table[g] = entry(0) + ... + entry(g) for g < MAX_EXPERTS (entries from n on are 0):
        EXPERTS_PER_THREAD consecutive entries per thread, a thread-local running sum, then
        the threads' carries by _block_scan. The caller syncs before other threads read it."""
        first = tid * EXPERTS_PER_THREAD
        run = Int32(0)
        for j in range(EXPERTS_PER_THREAD):
            v = Int32(0)
            if first + j < n:
                v = entry(first + j)
            run = run + v
            table[first + j] = run
        carry = self._block_scan(scan, tid, run, False)
        for j in range(EXPERTS_PER_THREAD):
            table[first + j] = table[first + j] + carry

    @cute.jit
    def _fill_chunks(self, sfa, k, qctas, chunks, real_rows) -> None:
        """The CTAs past the quantizing ones: write zeros into every byte of sfa the
        quantizing threads do not, so the caller needs no memset (one graph node less). A
        chunk is one row offset o (0..31) of a 512-byte atom: 4 words, rows o, o + 32, o + 64,
        o + 96 of one 128-row block, 4 scale columns each (facts.md). `real_rows(row0)` gives
        the 128-row block's first row relative to its owner and the owner's real rows: a row
        is written iff below them, and then only its columns j < k / 16. Each filling CTA
        takes one run of chunks, its threads 256 apart (coalesced stores), so a thread's
        chunks mostly share a 128-row block and it asks real_rows (a table search) once per
        block it enters, not once per chunk. `qctas`: the quantizing CTAs before this one."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        rest_k = (k // 16 + 3) // 4
        kb = k // 16
        per_cta = (chunks + (grid - qctas) * THREADS - 1) // ((grid - qctas) * THREADS) * THREADS
        begin = (bidx - qctas) * per_cta
        end = cutlass.min(begin + per_cta, chunks)
        c = begin + tidx
        seen = Int32(-1)  # the 128-row block rel and m describe
        rel = Int32(0)
        m = Int32(0)
        while c < end:
            atom = c // 32
            o = c - atom * 32
            rb = atom // rest_k
            jg = atom - rb * rest_k
            if rb != seen:
                rel, m = real_rows(rb * 128)
                seen = rb
            addr = sfa.toint() + Int64(c) * 16
            if rel + o >= m:  # the chunk's first row is padding, so are the other three
                st_global_zero(addr, 16)
            else:
                for i in cutlass.range_constexpr(4):
                    if rel + i * 32 + o >= m:
                        st_global_zero(addr + i * 4, 4)
                    else:
                        for jj in cutlass.range_constexpr(1, 4):  # columns past k / 16
                            if jg * 4 + jj >= kb:
                                st_global_zero(addr + i * 4 + jj, 1)
            c += THREADS

    @cute.jit
    def _block(self, x_addr, gs, a_addr, scale_addr) -> None:
        """Quantize the 16 bf16 at x_addr with decode scale gs: 8 code bytes to a_addr, the
        e4m3 block scale to scale_addr."""
        words = list(ld_global_nc_v4(x_addr)) + list(ld_global_nc_v4(x_addr + 16))
        values = []
        for w in words:  # element 2i in the low half of word i
            values.append(bf16_to_f32(w << Uint32(16)))
            values.append(bf16_to_f32(w & Uint32(0xFFFF0000)))
        amax = poison(gs)
        for v in values:
            amax = max_nan_abs(amax, v)
        byte = scale_byte(amax, gs)
        denom = denominator(byte, gs)
        ok = usable(amax, denom)
        down = [threshold(denom, m, False) for m in MIDPOINTS]
        up_odd = [threshold(denom, MIDPOINTS[b], True) for b in (1, 3, 5)]
        packed = [Uint32(0), Uint32(0)]
        for i, v in enumerate(values):
            packed[i // 8] = packed[i // 8] | (e2m1_code(v, down, up_odd, ok)
                                               << Uint32(4 * (i % 8)))
        st_global_v2(a_addr, packed[0], packed[1])
        # A block holding NaN or inf gets a NaN scale (runtime.activations' convention);
        # amax is NaN or inf exactly then (or NaN from a bad decode scale, poison()).
        finite = amax < Float32(float("inf"))
        if not finite:
            byte = Uint32(0x7F)
        st_global_u8(scale_addr, byte)


class ActQuantExperts(_Quantizer):
    """quantize_experts: rows grouped by expert, sfa in scaled_grouped_mm's layout. Every CTA
    derives the expert tables from the raw offs into shared memory first (one launch, no torch
    ops before it): ends = cummax(clamp(offs, 0, T)) and pstart (each expert's first blocked
    scale row, the sum of round_up(rows, 128) before it), by a thread-local scan of
    EXPERTS_PER_THREAD experts each and a block scan of the threads' totals."""

    SMEM_BYTES = TABLE_SMEM_BYTES

    @cute.jit
    def __call__(self, x: cute.Pointer, offs: cute.Pointer, scales: cute.Pointer,
                 a: cute.Pointer, sfa: cute.Pointer, rows: Int32, k: Int32, experts: Int32,
                 blocks: Int32, sfa_chunks: Int32) -> None:
        args = self._record((("x", x), ("offs", offs), ("scales", scales), ("a", a),
                             ("sfa", sfa)), (("rows", rows), ("k", k), ("experts", experts),
                                             ("blocks", blocks), ("sfa_chunks", sfa_chunks)))
        # The grid here only traces the launcher; the runtime launches its own (quantizing
        # CTAs, then filling ones: runtime/quantize.py).
        self.kernel(*args).launch(grid=[(blocks + THREADS - 1) // THREADS, 1, 1],
                                  block=[THREADS, 1, 1], smem=TABLE_SMEM_BYTES)

    @cute.jit
    def _owner_rows(self, ends, pstart, experts, row0) -> tuple:
        """_fill_chunks' (row0 relative to its owner, the owner's real rows) for the 128-row
        block at blocked row row0: the owner is the last expert whose scale rows start at or
        before row0 (an empty expert starts where the next one does, so the last is the one
        with rows, or the last expert for the slack after every expert's rows)."""
        g = self._first_above(pstart, experts, row0) - 1  # pstart[0] = 0 <= row0
        start = Int32(0)
        if g > 0:
            start = ends[g - 1]
        return row0 - pstart[g], ends[g] - start

    @cute.kernel
    def kernel(self, x: cute.Pointer, offs: cute.Pointer, scales: cute.Pointer,
               a: cute.Pointer, sfa: cute.Pointer, rows: Int32, k: Int32, experts: Int32,
               blocks: Int32, sfa_chunks: Int32) -> None:
        tid, _, _ = cute.arch.thread_idx()
        smem = cutlass.memory.SmemAllocator()
        ends = smem.allocate_tensor(Int32, cute.make_layout(MAX_EXPERTS), 16)
        pstart = smem.allocate_tensor(Int32, cute.make_layout(MAX_EXPERTS), 16)
        scan = smem.allocate_tensor(Int32, cute.make_layout(THREADS // 32), 16)
        # Written out, not through _running_sum and _end_before: the pstart pass is fused into
        # the ends pass, and a version through helpers was 0.2-0.8 us slower per call on the
        # H100 (docs/lab_notebook.md, thirtieth session); this is the shipped cubin.
        first = tid * EXPERTS_PER_THREAD
        # ends: clamp, then the running max within this thread's experts, then across threads.
        run = Int32(0)
        for j in range(EXPERTS_PER_THREAD):
            v = Int32(0)
            if first + j < experts:
                v = cutlass.min(cutlass.max(
                    Int32(ld_global_nc_b32(offs.toint() + Int64(first + j) * 4)), Int32(0)), rows)
            run = cutlass.max(run, v)
            ends[first + j] = run
        carry = self._block_scan(scan, tid, run, True)
        before = carry  # ends[first - 1]: the last end before this thread's experts
        total = Int32(0)
        for j in range(EXPERTS_PER_THREAD):
            e = cutlass.max(ends[first + j], carry)
            ends[first + j] = e
            pstart[first + j] = total
            total = total + (e - before + 127) // 128 * 128
            before = e
        carry = self._block_scan(scan, tid, total, False)
        for j in range(EXPERTS_PER_THREAD):
            pstart[first + j] = pstart[first + j] + carry
        cute.arch.sync_threads()

        bidx, _, _ = cute.arch.block_idx()
        qctas = (blocks + THREADS - 1) // THREADS
        if bidx >= qctas:
            self._fill_chunks(sfa, k, qctas, sfa_chunks,
                              lambda row0: self._owner_rows(ends, pstart, experts, row0))
        idx, r, j, x_addr, a_addr = self._position(x, a, k)
        if idx < blocks:
            # The expert: the first g with ends[g] > r (E when r is past offs[-1]).
            lo = self._first_above(ends, experts, r)
            if lo >= experts:
                st_global_v2(a_addr, Uint32(0), Uint32(0))  # no expert's row: codes 0
            else:
                start = Int32(0)
                if lo > 0:
                    start = ends[lo - 1]
                prow = pstart[lo] + r - start
                gs = ld_global_nc_f32(scales.toint() + Int64(lo) * 4)
                self._block(x_addr, gs, a_addr, sfa.toint() + Int64(_blocked_offset(prow, j, k)))


class ActQuantMasked(_Quantizer):
    """quantize_masked: x (E, max_m, K), sfa (E, round_up(max_m, 128) * round_up(K/16, 4)).
    With masked_m (a nonzero address: (E,) int32, each clamped to [0, max_m] as the masked
    GEMM does; E <= MAX_EXPERTS), expert e's rows from masked_m[e] on are neither read nor
    written and their scales in sfa are zeros (written by the filling CTAs); with a null
    masked_m every row is valid. The first `quant_ctas` CTAs quantize, grid-stride over the
    VALID blocks only: with masked_m every CTA first derives vend (each expert's end in the
    valid blocks' order, a block scan as the experts kernel's) in shared memory and finds a
    block's expert by binary search, so a masked row costs nothing however large max_m is
    (DeepEP low-latency's worst case), and the runtime caps quant_ctas for a masked call."""

    SMEM_BYTES = MASKED_SMEM_BYTES

    @cute.jit
    def __call__(self, x: cute.Pointer, scales: cute.Pointer, masked_m: cute.Pointer,
                 a: cute.Pointer, sfa: cute.Pointer, max_m: Int32, k: Int32, experts: Int32,
                 blocks: Int32, sfa_chunks: Int32, quant_ctas: Int32) -> None:
        args = self._record((("x", x), ("scales", scales), ("masked_m", masked_m), ("a", a),
                             ("sfa", sfa)),
                            (("max_m", max_m), ("k", k), ("experts", experts),
                             ("blocks", blocks), ("sfa_chunks", sfa_chunks),
                             ("quant_ctas", quant_ctas)))
        self.kernel(*args).launch(grid=[quant_ctas + 1, 1, 1], block=[THREADS, 1, 1],
                                  smem=MASKED_SMEM_BYTES)

    @cute.kernel
    def kernel(self, x: cute.Pointer, scales: cute.Pointer, masked_m: cute.Pointer,
               a: cute.Pointer, sfa: cute.Pointer, max_m: Int32, k: Int32, experts: Int32,
               blocks: Int32, sfa_chunks: Int32, quant_ctas: Int32) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        kb = k // 16
        expert_blocks = max_m * kb
        expert_rows = (max_m + 127) // 128 * 128
        expert_bytes = expert_rows * ((k // 16 + 3) // 4) * 4
        smem = cutlass.memory.SmemAllocator()
        vend = smem.allocate_tensor(Int32, cute.make_layout(MAX_EXPERTS), 16)
        scan = smem.allocate_tensor(Int32, cute.make_layout(THREADS // 32), 16)
        masked = masked_m.toint() != Int64(0)
        total = blocks
        if masked:
            # vend: the running sum of clamp(masked_m, 0, max_m) * kb.
            self._running_sum(
                vend, scan, tidx, experts,
                lambda g: cutlass.min(cutlass.max(Int32(ld_global_nc_b32(
                    masked_m.toint() + Int64(g) * 4)), Int32(0)), max_m) * kb)
            cute.arch.sync_threads()
            total = vend[experts - 1]

        if bidx >= quant_ctas:
            # Each expert's scale rows are a whole number of atoms, so sfa's blocked rows run
            # on across experts: the owner of blocked row row0 is row0 // expert_rows.
            self._fill_chunks(sfa, k, quant_ctas, sfa_chunks,
                              lambda row0: (row0 % expert_rows,
                                            self._valid_rows(vend, masked, max_m, kb,
                                                             row0 // expert_rows)))
        else:
            v = bidx * THREADS + tidx
            while v < total:
                e = Int32(0)
                off = Int32(0)
                if masked:
                    e = self._first_above(vend, experts, v)
                    off = v - self._end_before(vend, e)
                else:
                    e = v // cutlass.max(expert_blocks, Int32(1))
                    off = v - e * expert_blocks
                row = off // kb
                j = off - row * kb
                r = e * max_m + row
                self._block(x.toint() + (Int64(r) * Int64(k) + Int64(j * 16)) * 2,
                            ld_global_nc_f32(scales.toint() + Int64(e) * 4),
                            a.toint() + Int64(r) * Int64(k // 2) + Int64(j * 8),
                            sfa.toint() + Int64(e) * Int64(expert_bytes)
                            + Int64(_blocked_offset(row, j, k)))
                v += quant_ctas * THREADS

    @cute.jit
    def _valid_rows(self, vend, masked, max_m, kb, e) -> Int32:
        """Expert e's valid rows: from the vend table with masked_m, else max_m."""
        m = max_m
        if masked:
            m = (vend[e] - self._end_before(vend, e)) // kb
        return m


LAYOUTS = {"experts": ActQuantExperts, "masked": ActQuantMasked}


def compile_quantizer(layout: str, *, arch: str) -> dict[str, Any]:
    """Compile one layout's kernel: {"cubin", "ptx", "symbol", "params", "block",
    "dynamic_smem", "max_experts"} (max_experts: the experts its tables hold: every call of the
    experts layout, a masked call with masked_m), after the build guards (no stack frame; the
    DSL launcher's block and shared memory equal to the kernel's own)."""
    if arch != "sm_90a":
        raise ValueError(f"arch must be 'sm_90a' for the sm90 quantizers, but got {arch!r}")
    if os.environ.get("CUTE_DSL_ARCH") != arch:
        raise RuntimeError(f"CUTE_DSL_ARCH must be {arch!r} before cutlass is imported, but got "
                           f"{os.environ.get('CUTE_DSL_ARCH')!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, but got {layout!r}")
    ptr = {name: make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=align)
           for name, dtype, align in (("x", cutlass.BFloat16, 16), ("i32", Int32, 4),
                                      ("f32", Float32, 4), ("u8", cutlass.Uint8, 8))}
    one = (Int32(1), Int32(16), Int32(1), Int32(1), Int32(32))
    call = ((ptr["x"], ptr["i32"], ptr["f32"], ptr["u8"], ptr["u8"], *one)
            if layout == "experts"
            else (ptr["x"], ptr["f32"], ptr["i32"], ptr["u8"], ptr["u8"], *one, Int32(1)))
    quantizer = LAYOUTS[layout]()
    with tempfile.TemporaryDirectory(prefix="act_quant_") as dump:
        compiled = cute.compile(quantizer, *call, options=(
            f"--gpu-arch {arch} --keep-cubin --keep-ptx --dump-dir {dump}"))
        cubin, ptx = compiled.__cubin__, compiled.__ptx__
    symbols = list(compiled.kernel_info)
    if len(symbols) != 1:
        raise RuntimeError(f"expected exactly one kernel in the module, but got {symbols}")
    require_no_stack_frame(cubin, symbols[0], "the quantizer keeps its 16 values in registers")
    launch = lowered_launch(compiled)
    block = ptx_reqntid(ptx, symbols[0])
    if launch["dynamic_smem"] != quantizer.SMEM_BYTES or tuple(launch["block"]) != block \
            or block != (THREADS, 1, 1):
        raise RuntimeError(f"launcher uses smem {launch['dynamic_smem']} and block "
                           f"{launch['block']}, the kernel expects {quantizer.SMEM_BYTES} and "
                           f"{block} ({THREADS} threads)")
    return {"cubin": cubin, "ptx": ptx, "symbol": symbols[0], "params": quantizer.args.params(),
            "block": list(block), "dynamic_smem": quantizer.SMEM_BYTES,
            "max_experts": MAX_EXPERTS}
