"""Kernel parameter packing, driven only by the manifest's recorded ABI.

All parameters live in one contiguous buffer at exactly the offsets the manifest records (the
offsets the loader checked against cuFuncGetParamInfo), and `kernelParams` is a `void*[]` with
one pointer into that buffer per parameter. cuda.bindings accepts an int address for
`kernelParams` (`_HelperKernelParams`: "an already configured void** address", present from
cuda-python 11.x to cuda.bindings 13.4), and the driver copies the values at launch (and at
graph capture), so a buffer may be rewritten as soon as the launch call returns.

Values are keyed by role: a table parameter by its table name ('pointers', 'problem_sizes',
'cta_prefix', 'tensormap_workspace', 'grid_barrier', 'alpha'), a scalar by its value name
('num_groups', 'rows', 'n', 'k'), an operand address by its operand ('a', ..., 'offs'), a TMA
template by its parameter name. `zeros` parameters take no value.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ManifestError
from .formats import TENSORMAP_BYTES
from .manifest import Param

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def role(p: Param) -> str:
    """The key of `p`'s value in a values dict."""
    if p.kind == "table":
        return str(p.table)
    if p.kind == "scalar":
        return str(p.value)
    if p.kind == "operand":
        return str(p.operand)
    return p.name


class PackedParams:
    """A parameter buffer plus the `void*[]` the driver reads (`kernel_params` is its address).

    `set(role, value)` rewrites a table address or scalar in place: the per-call update (a
    role the kernel does not take is ignored).
    """

    def __init__(self, params: Sequence[Param], size: int) -> None:
        # At least one byte: a zero-length ctypes array has no usable address.
        self.buffer = (ctypes.c_char * max(size, 1))()
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(len(params), 1))(*[base + p.offset for p in params])
        self.kernel_params = ctypes.addressof(self.pointers) if params else 0
        self._slots: dict[str, list[tuple[int, struct.Struct]]] = {}
        for p in params:
            if p.kind in ("table", "operand"):
                self._slots.setdefault(role(p), []).append((p.offset, _U64))
            elif p.kind == "scalar":
                self._slots.setdefault(role(p), []).append((p.offset, _U32))

        def at(key: str) -> tuple[int, ...]:
            return tuple(o for o, _ in self._slots.get(key, ()))

        self._pointers_at = at("pointers")
        self._sizes_at = at("problem_sizes")
        self._prefix_at = at("cta_prefix")
        self._workspace_at = at("tensormap_workspace")
        self._barrier_at = at("grid_barrier")
        self._alpha_at = at("alpha")
        self.has_alpha = bool(self._alpha_at)

    def set(self, key: str, value: int) -> None:
        for offset, fmt in self._slots.get(key, ()):
            fmt.pack_into(self.buffer, offset, value)

    def set_tables(self, pointers: int, problem_sizes: int, cta_prefix: int,
                   workspace: int, barrier: int, alpha: int) -> None:
        """The per-launch update of all six table addresses, with no per-role lookups."""
        buf, pack = self.buffer, _U64.pack_into
        for offset in self._pointers_at:
            pack(buf, offset, pointers)
        for offset in self._sizes_at:
            pack(buf, offset, problem_sizes)
        for offset in self._prefix_at:
            pack(buf, offset, cta_prefix)
        for offset in self._workspace_at:
            pack(buf, offset, workspace)
        for offset in self._barrier_at:
            pack(buf, offset, barrier)
        for offset in self._alpha_at:
            pack(buf, offset, alpha)

    def raw(self) -> bytes:
        return bytes(self.buffer)


def pack_params(params: Sequence[Param], values: Mapping[str, Any]) -> PackedParams:
    """Pack every parameter at its manifest offset (pure: no driver, no device)."""
    size = max((p.offset + p.size for p in params), default=0)
    packed = PackedParams(params, size)
    for i, p in enumerate(params):
        key = role(p)
        if p.kind == "zeros":
            continue  # the buffer starts zeroed
        if key not in values:
            raise ManifestError(f"parameter {i} {p.name!r} ({p.kind}) needs a value for "
                                f"{key!r}, but none was given; have: {sorted(values)}")
        value = values[key]
        if p.kind == "tma_template":
            data = bytes(value)
            if len(data) != TENSORMAP_BYTES or p.size != TENSORMAP_BYTES:
                raise ManifestError(f"parameter {i} {p.name!r}: a TMA template must be "
                                    f"{TENSORMAP_BYTES} bytes in a {TENSORMAP_BYTES}-byte slot, "
                                    f"but got {len(data)} bytes for a {p.size}-byte slot")
            ctypes.memmove(ctypes.addressof(packed.buffer) + p.offset, data, TENSORMAP_BYTES)
        elif p.kind in ("table", "operand"):
            if p.size != 8:
                raise ManifestError(f"parameter {i} {p.name!r}: a device address needs an "
                                    f"8-byte slot, but the slot is {p.size} bytes")
            _U64.pack_into(packed.buffer, p.offset, int(value))
        elif p.kind == "scalar":
            if p.size != 4:
                raise ManifestError(f"parameter {i} {p.name!r}: a 32-bit scalar needs a 4-byte "
                                    f"slot, but the slot is {p.size} bytes")
            if not 0 <= int(value) < 2**32:
                raise ManifestError(f"parameter {i} {p.name!r}: {key} must fit in uint32, "
                                    f"but got {value}")
            _U32.pack_into(packed.buffer, p.offset, int(value))
        else:
            raise ManifestError(f"parameter {i} {p.name!r} has kind {p.kind!r}, which the "
                                "runtime cannot fill")
    return packed
