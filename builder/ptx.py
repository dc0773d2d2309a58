"""Check a recorded launch ABI against the `.entry` parameter list of the kernel's PTX.

The manifest's ABI is derived from the traced objects that built the kernel (kernels/abi.py);
the PTX is what the compiler actually emitted. If they disagree, the runtime would pack
parameters at the wrong offsets and the kernel would read garbage, so the build fails here,
naming the parameter. Forms seen in nvidia-cutlass-dsl 4.8.1 PTX:

    .param .u32 name                               scalar: size 4, align 4
    .param .u64 .ptr .global .align 16 name        pointer: size 8, align 8 (the .align after
                                                   .ptr is the pointee's, not the parameter's)
    .param .align 64 .b8 name[128]                 by-value struct (a CUtensorMap): 128, 64
    .param .align 4 .b8 name[12]                   by-value struct (MMA state, coordinates)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import BuildError

_TYPE_BYTES = {"b8": 1, "s8": 1, "u8": 1, "b16": 2, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
               "b32": 4, "s32": 4, "u32": 4, "f32": 4, "f16x2": 4, "bf16x2": 4,
               "b64": 8, "s64": 8, "u64": 8, "f64": 8}
_STATE_SPACES = {"global", "shared", "const", "local"}
_ENTRY_RE = r"\.entry\s+{sym}\s*\("
_ANY_ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$%][\w$]*)\s*\(")


@dataclass(frozen=True)
class PtxParam:
    name: str
    size: int
    align: int
    text: str  # the declaration as written, for messages


def entry_names(ptx: str) -> list[str]:
    return _ANY_ENTRY_RE.findall(ptx)


def _parse_param(decl: str, symbol: str) -> PtxParam:
    toks = decl.replace("[", " [").split()
    if not toks or toks[0] != ".param":
        raise BuildError(f"cannot parse parameter {decl!r} of .entry {symbol}")
    align = elem = None
    count = 1
    name = None
    i, after_ptr = 1, False
    while i < len(toks):
        t = toks[i]
        if t == ".align":
            value = int(toks[i + 1])
            if not after_ptr:  # after .ptr, .align is the pointee's alignment
                align = value
            i += 2
            continue
        if t == ".ptr":
            after_ptr = True
        elif t.startswith(".") and t[1:] in _TYPE_BYTES:
            elem = _TYPE_BYTES[t[1:]]
        elif t.startswith(".") and t[1:] in _STATE_SPACES:
            pass
        elif t.startswith("["):
            count = int(t.strip("[]"))
        elif not t.startswith("."):
            name = t
        else:
            raise BuildError(f"cannot parse {t!r} in parameter {decl!r} of .entry {symbol}")
        i += 1
    if elem is None or name is None:
        raise BuildError(f"cannot parse parameter {decl!r} of .entry {symbol}")
    # Without .align a parameter is naturally aligned: to its element size.
    return PtxParam(name=name, size=elem * count, align=align or elem, text=decl)


def entry_params(ptx: str, symbol: str) -> list[PtxParam]:
    """(size, align) of each parameter of `.entry <symbol>(...)`, in order."""
    m = re.search(_ENTRY_RE.format(sym=re.escape(symbol)), ptx)
    if not m:
        raise BuildError(f"the PTX has no .entry named {symbol!r}; its entries: "
                         f"{entry_names(ptx)}")
    end = ptx.find(")", m.end())
    if end < 0:
        raise BuildError(f"the parameter list of .entry {symbol} in the PTX is not closed")
    body = ptx[m.end():end]
    body = re.sub(r"//[^\n]*", "", body)
    decls = [d.strip() for d in body.split(",") if d.strip()]
    return [_parse_param(d, symbol) for d in decls]


def _get(p: Any, key: str) -> Any:
    return p[key] if isinstance(p, Mapping) else getattr(p, key)


def check_abi(params: list[Any], ptx: str, symbol: str) -> None:
    """Raise BuildError at the first recorded parameter whose size or alignment differs from
    the PTX, or when the counts differ. `params` are manifest dicts or runtime Param objects."""
    actual = entry_params(ptx, symbol)
    at = 0
    for i, (rec, got) in enumerate(zip(params, actual, strict=False)):  # counts: below
        name, size, align = _get(rec, "name"), _get(rec, "size"), _get(rec, "align")
        if (size, align) != (got.size, got.align):
            raise BuildError(
                f"launch ABI mismatch at parameter {i} ({name!r}): recorded size {size}, align "
                f"{align}, but the PTX .entry {symbol} has size {got.size}, align {got.align} "
                f"({got.text})")
        at = (at + got.align - 1) // got.align * got.align
        offset = _get(rec, "offset")
        if offset != at:
            raise BuildError(f"launch ABI mismatch at parameter {i} ({name!r}): recorded offset "
                             f"{offset}, but the PTX parameter list puts it at {at}")
        at += got.size
    if len(params) != len(actual):
        extra = (f"first unrecorded: {actual[len(params)].text}" if len(actual) > len(params)
                 else f"first extra recorded: {_get(params[len(actual)], 'name')!r}")
        raise BuildError(f"launch ABI mismatch: {len(params)} parameters recorded, but the PTX "
                         f".entry {symbol} has {len(actual)} ({extra})")
