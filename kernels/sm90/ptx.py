"""PTX one-liners the Hopper kernel needs and the DSL lacks or emits less freely.

`cute.arch.prmt` is inline asm WITH side effects, which blocks scheduling and CSE; the pure
arithmetic ops here are declared side-effect free so the compiler may interleave them with
loads and wgmma. Shared-memory accesses keep side effects (they must not cross barriers).
"""

from __future__ import annotations

from typing import Any

from cutlass import Int32, Uint32
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _ir(value: Any, loc: Any, ip: Any) -> ir.Value:
    return value if isinstance(value, ir.Value) else Int32(value).ir_value(loc=loc, ip=ip)


def _pure_i32(text: str, constraints: str, args: list[Any], loc: Any, ip: Any) -> Uint32:
    out = llvm.inline_asm(
        T.i32(), [_ir(a, loc, ip) for a in args], text, constraints,
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    )
    return Uint32(out)


@dsl_user_op
def prmt(a: Any, b: Any, selector: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    """Byte permute: 4 bytes picked from the 8 bytes {b, a} by the 4 low selector nibbles."""
    return _pure_i32("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, selector], loc, ip)


@dsl_user_op
def mul_f16x2(a: Any, b: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    """Two fp16 products in one HMUL2 on packed 32-bit registers (round to nearest even)."""
    return _pure_i32("mul.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b], loc, ip)


@dsl_user_op
def mul_f16x2_by_half(a: Any, b: Any, half: int, *, loc: Any = None, ip: Any = None) -> Uint32:
    """a * (half `half` of b in both lanes): ptxas folds the splat into the HMUL2 operand."""
    pick = "{h, h}" if half else "{l, l}"
    return _pure_i32(
        "{\n.reg .b16 l, h;\n.reg .b32 t;\nmov.b32 {l, h}, $2;\nmov.b32 t, " + pick
        + ";\nmul.rn.f16x2 $0, $1, t;\n}", "=r,r,r", [a, b], loc, ip)


@dsl_user_op
def mad_lo_imm(a: Any, x: Any, imm: int, *, loc: Any = None, ip: Any = None) -> Uint32:
    """a * x + imm (low 32 bits), opaque to LLVM; ptxas keeps two of them with different
    immediates apart (experiments/first_code.py's straight-line code)."""
    return _pure_i32(f"mad.lo.u32 $0, $1, $2, {int(imm)};", "=r,r,r", [a, x], loc, ip)


@dsl_user_op
def shl(a: Any, bits: int, *, loc: Any = None, ip: Any = None) -> Uint32:
    """a << bits, opaque to LLVM (which would rewrite (a & m) << s as (a << s) & m' and so cost
    a separate mask instruction when `a & m` is needed anyway)."""
    return _pure_i32(f"shl.b32 $0, $1, {int(bits)};", "=r,r", [a], loc, ip)


@dsl_user_op
def select_bits(a: Any, b: Any, mask: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    """(a & mask) | (b & ~mask) in one LOP3."""
    return _pure_i32("lop3.b32 $0, $1, $2, $3, 0xE4;", "=r,r,r,r", [a, b, mask], loc, ip)


@dsl_user_op
def e4m3x2_to_f16x2(a: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    """The two e4m3 bytes in the low half of `a` to two fp16 (exact; cvt exists from sm_89)."""
    return _pure_i32(
        "{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, $1;\ncvt.rn.f16x2.e4m3x2 $0, lo;\n}",
        "=r,r", [a], loc, ip,
    )


def _asm(text: str, constraints: str, args: list[Any], loc: Any, ip: Any,
         result: bool = False) -> Any:
    """Inline PTX with side effects (memory, barriers): never moved across others like it."""
    out = llvm.inline_asm(
        T.i32() if result else None, args, text, constraints,
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    )
    return Uint32(out) if result else None


def _i64(value: Any, loc: Any, ip: Any) -> ir.Value:
    from cutlass import Int64

    return value if isinstance(value, ir.Value) else Int64(value).ir_value(loc=loc, ip=ip)


# Memory accesses: `op` is the PTX opcode prefix, `addr` an IR value of the constraint `ac`
# ("r": a 32-bit shared address; "l": a 64-bit global address from the pointer table).


def _ld_words(op: str, addr: ir.Value, ac: str, words: int, loc: Any,
              ip: Any) -> tuple[Uint32, ...]:
    outs = ", ".join(f"${i}" for i in range(words))
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * words), [addr],
        f"{op}.v{words}.b32 {{{outs}}}, [${words}];", "=r," * words + ac,
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    )
    return tuple(Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip))
                 for i in range(words))


def _ld_u16(op: str, addr: ir.Value, ac: str, loc: Any, ip: Any) -> Uint32:
    return _asm(f"{{\n.reg .b16 h;\n{op}.b16 h, [$1];\ncvt.u32.u16 $0, h;\n}}", "=r," + ac,
                [addr], loc, ip, True)


def _st_words(op: str, addr: ir.Value, ac: str, values: tuple[Any, ...], loc: Any,
              ip: Any) -> None:
    words = len(values)
    ins = ", ".join(f"${i + 1}" for i in range(words))
    _asm(f"{op}.v{words}.b32 [$0], {{{ins}}};", ac + ",r" * words,
         [addr] + [_ir(x, loc, ip) for x in values], loc, ip)


@dsl_user_op
def ld_shared_v4(addr: Any, *, loc: Any = None, ip: Any = None) -> tuple[Uint32, ...]:
    """16-byte shared-memory load at a 32-bit shared address."""
    return _ld_words("ld.shared", _ir(addr, loc, ip), "r", 4, loc, ip)


@dsl_user_op
def ld_shared_v2(addr: Any, *, loc: Any = None, ip: Any = None) -> tuple[Uint32, ...]:
    """8-byte shared-memory load at a 32-bit shared address (8-byte aligned)."""
    return _ld_words("ld.shared", _ir(addr, loc, ip), "r", 2, loc, ip)


@dsl_user_op
def ld_shared_u8(addr: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    """One shared-memory byte, zero-extended."""
    return _asm("ld.shared.u8 $0, [$1];", "=r,r", [_ir(addr, loc, ip)], loc, ip, True)


@dsl_user_op
def st_shared_v4(addr: Any, w0: Any, w1: Any, w2: Any, w3: Any, *, loc: Any = None,
                 ip: Any = None) -> None:
    """16-byte shared-memory store at a 32-bit shared address."""
    _st_words("st.shared", _ir(addr, loc, ip), "r", (w0, w1, w2, w3), loc, ip)


@dsl_user_op
def ld_global_nc_v4(addr: Any, *, loc: Any = None, ip: Any = None) -> tuple[Uint32, ...]:
    """16-byte read-only global load (the kernel never writes what it reads this way)."""
    return _ld_words("ld.global.nc", _i64(addr, loc, ip), "l", 4, loc, ip)


@dsl_user_op
def ld_global_nc_u16(addr: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    """A 16-bit read-only global load, zero-extended."""
    return _ld_u16("ld.global.nc", _i64(addr, loc, ip), "l", loc, ip)


@dsl_user_op
def ld_global_nc_u32(addr: Any, offset: int = 0, *, loc: Any = None,
                     ip: Any = None) -> Uint32:
    """A 32-bit read-only global load at addr + offset (an immediate: loads at several offsets
    of one address keep one address register)."""
    return _asm(f"ld.global.nc.b32 $0, [$1+{int(offset)}];", "=r,l", [_i64(addr, loc, ip)],
                loc, ip, True)


@dsl_user_op
def st_global_v4(addr: Any, w0: Any, w1: Any, w2: Any, w3: Any, *, loc: Any = None,
                 ip: Any = None) -> None:
    """16-byte global store."""
    _st_words("st.global", _i64(addr, loc, ip), "l", (w0, w1, w2, w3), loc, ip)


@dsl_user_op
def trap(*, loc: Any = None, ip: Any = None) -> None:
    """Abort the kernel (the launch fails with an illegal-instruction class error)."""
    _asm("trap;", "", [], loc, ip)


# ---------------------------------------------------------------- grid barrier (phase 1)


@dsl_user_op
def fence_proxy_async_global(*, loc: Any = None, ip: Any = None) -> None:
    """Order this thread's generic-proxy global accesses with later async-proxy (TMA) ones."""
    _asm("fence.proxy.async.global;", "", [], loc, ip)


@dsl_user_op
def ld_acquire_gpu_u32(addr: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    return _asm("ld.acquire.gpu.global.u32 $0, [$1];", "=r,l", [_i64(addr, loc, ip)], loc, ip,
                True)


@dsl_user_op
def ld_relaxed_gpu_u32(addr: Any, *, loc: Any = None, ip: Any = None) -> Uint32:
    """A strong (L1-bypassing) load without acquire's ordering: ptxas follows ld.acquire with
    CCTL.IVALL, which waits for the load before the thread goes on."""
    return _asm("ld.relaxed.gpu.global.u32 $0, [$1];", "=r,l", [_i64(addr, loc, ip)], loc, ip,
                True)


@dsl_user_op
def atom_add_acq_rel_gpu_u32(addr: Any, value: Any, *, loc: Any = None,
                             ip: Any = None) -> Uint32:
    return _asm("atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r",
                [_i64(addr, loc, ip), _ir(value, loc, ip)], loc, ip, True)


@dsl_user_op
def st_relaxed_gpu_u32(addr: Any, value: Any, *, loc: Any = None, ip: Any = None) -> None:
    _asm("st.relaxed.gpu.global.u32 [$0], $1;", "l,r", [_i64(addr, loc, ip), _ir(value, loc, ip)],
         loc, ip)


def _stamp(register: str, addr: Any, pred: Any, loc: Any, ip: Any) -> None:
    """Store the 64-bit special register at a global address when `pred` is non-zero.
    Predicated inside the asm, so a caller in the K loop adds no branch next to its wgmma."""
    _asm("{\n.reg .pred p;\n.reg .u64 t;\nsetp.ne.u32 p, $1, 0;\nmov.u64 t, " + register
         + ";\n@p st.global.u64 [$0], t;\n}", "l,r", [_i64(addr, loc, ip), _ir(pred, loc, ip)],
         loc, ip)


@dsl_user_op
def stamp_clock(addr: Any, pred: Any, *, loc: Any = None, ip: Any = None) -> None:
    """Store this SM's %clock64 at a global address when `pred` is non-zero (diagnostics:
    experiments/trace_kernels.py)."""
    _stamp("%clock64", addr, pred, loc, ip)


@dsl_user_op
def stamp_globaltimer(addr: Any, pred: Any, *, loc: Any = None, ip: Any = None) -> None:
    """stamp_clock with %globaltimer (nanoseconds, one clock for the whole GPU), so stamps of
    different CTAs compare."""
    _stamp("%globaltimer", addr, pred, loc, ip)


@dsl_user_op
def red_add_release_gpu_u32(addr: Any, value: Any, *, loc: Any = None, ip: Any = None) -> None:
    _asm("red.release.gpu.global.add.u32 [$0], $1;", "l,r",
         [_i64(addr, loc, ip), _ir(value, loc, ip)], loc, ip)


@dsl_user_op
def prefetch_tensormap(addr: Any, *, loc: Any = None, ip: Any = None) -> None:
    """Bring the TMA descriptor at global address `addr` into the descriptor cache now, not at
    its first load."""
    _asm("prefetch.tensormap [$0];", "l", [_i64(addr, loc, ip)], loc, ip)


@dsl_user_op
def nanosleep(ns: int, *, loc: Any = None, ip: Any = None) -> None:
    _asm(f"nanosleep.u32 {int(ns)};", "", [], loc, ip)


@dsl_user_op
def cp_async_cg_16(smem_addr: Any, gmem_addr: Any, *, loc: Any = None, ip: Any = None) -> None:
    """16-byte cp.async from global memory (through L2 only) to a 32-bit shared address
    (experiments/first_load.py: every load in flight, then one wait for all of them)."""
    _asm("cp.async.cg.shared.global [$0], [$1], 16;", "r,l",
         [_ir(smem_addr, loc, ip), _i64(gmem_addr, loc, ip)], loc, ip)
