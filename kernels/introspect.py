"""Read launch facts of a compiled kernel from the objects that built it (build time only).

- TMA template geometry from the traced atom types (`tma_gbasis`, `tma_format`, `copy_bits`) and the
  placeholder tensors the atoms were made from. `kernels.abi.tma_geometry` covers flat bases with
  byte-sized elements; the sm100 atoms need: 4-bit A/B elements (byte strides are
  computed in bits) and the scale-factor atoms, whose basis is nested (the DSL views a 512-byte
  scale atom as 256 16-bit elements: descriptor dims (256, rest_k, rest_mn, l)).
- Dynamic shared memory from the lowered host launcher: the DSL resolves `cute.kernel_smem_size`
  to a constant (InferKernelSmemUsagePass) and stores it in the `cudaLaunchConfig_t` it builds.
- Block and cluster dims from the PTX `.entry` directives (the parameter list is builder/ptx.py's).
- Local memory from the cubin (`require_no_stack_frame`): a kernel meant to stay in registers.
- Serialized wgmma from the SASS (`require_async_wgmma`, nvdisasm): a kernel whose wgmma ptxas
  made synchronous for lack of registers.
"""

from __future__ import annotations

import math
import re
from typing import Any

_TMA_TYPE_RE = re.compile(
    r"non_exec_tiled_tma_load<(?P<arch>\w+), (?P<elem>\w+), copy_bits = (?P<bits>\d+), "
    r'tma_gbasis = <"(?P<shape>.*?):(?P<basis>.*?)">, tma_format = (?P<fmt>\w+)>'
)
_TMA_FORMAT = {"U4": "16U4_ALIGN8B", "U8": "UINT8", "U16": "UINT16", "U32": "UINT32",
               "U64": "UINT64", "F16": "FLOAT16", "F16_RN": "FLOAT16", "S32": "INT32"}
_FORMAT_BITS = {"16U4_ALIGN8B": 4, "UINT8": 8, "UINT16": 16, "UINT32": 32, "UINT64": 64,
                "FLOAT16": 16, "INT32": 32}
_ELEM_BITS = {"f4E2M1FN": 4, "f8E4M3FN": 8, "i8": 8, "i16": 16, "f16": 16, "bf16": 16, "i32": 32,
              "f32": 32}

# SF blocked layout (facts.md): 512-byte atoms of 128 rows x 4 scale columns (64 K elements).
SF_ATOM_ROWS, SF_ATOM_K, SF_ATOM_BYTES = 128, 64, 512


class IntrospectError(Exception):
    """A compiled artifact does not have the shape the sm100 kernel relies on."""


_SWIZZLE_RE = re.compile(r"S<(\d+),(\d+),(\d+)>")


def tma_swizzle(smem_layout: Any) -> str:
    """TMA swizzle of a staged smem layout ("S<b,4,3> o ..." or a plain layout).

    CuTe swizzles shared-memory BYTE addresses whatever the element width: S<3,4,3> XORs the
    16-byte chunk index (bits 4..6) with the 128-byte row index (bits 7..9), i.e. the 128B TMA
    swizzle, for fp4, fp8 and fp16 alike. The DSL's packed descriptors agree (probed with
    f16 / i8 atoms: S<b,4,3> -> swizzle field b for both).
    """
    text = str(getattr(smem_layout, "inner", ""))
    m = _SWIZZLE_RE.search(text)
    if not m or int(m.group(1)) == 0:
        return "NONE"
    bits, base, shift = (int(x) for x in m.groups())
    if base != 4 or shift != 3 or bits not in (1, 2, 3):
        raise IntrospectError(f"swizzle {m.group(0)} is not a TMA swizzle (S<1..3,4,3>)")
    return {1: "32B", 2: "64B", 3: "128B"}[bits]


def _split_top(text: str) -> list[str]:
    """Top-level comma-separated items of "(a,(b,c),d)"."""
    assert text[0] == "(" and text[-1] == ")", text
    items, depth, cur = [], 0, ""
    for ch in text[1:-1]:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    items.append(cur)
    return items


def _product(text: str) -> int:
    return math.prod(int(x) for x in re.findall(r"\d+", text))


def atom_type(atom: Any) -> dict[str, Any]:
    """Parsed `!cute_nvgpu.atom.non_exec_tiled_tma_load<...>` type of a traced TMA atom."""
    from cutlass.cutlass_dsl import extract_mlir_values

    types = [str(v.type) for v in extract_mlir_values(atom)]
    if len(types) != 1:
        raise IntrospectError(f"a TMA atom must lower to one value, but got {types}")
    m = _TMA_TYPE_RE.search(types[0])
    if not m:
        raise IntrospectError(f"cannot read TMA geometry from atom type {types[0]}")
    fmt = _TMA_FORMAT.get(m.group("fmt"))
    if fmt is None:
        raise IntrospectError(f"TMA format {m.group('fmt')} has no cuTensorMapEncodeTiled dtype")
    return {
        "type": types[0],
        "elem": m.group("elem"),
        "copy_bits": int(m.group("bits")),
        "box_modes": _split_top(m.group("shape")),
        "basis_modes": _split_top(m.group("basis")),
        "dtype": fmt,
    }


def _geometry(dtype: str, dims: list[int], strides: list[int], box: list[int], swizzle: str,
              l2_promotion: str) -> dict[str, Any]:
    for i, s in enumerate(strides):
        if s % 16 or not 0 < s < 1 << 40:
            raise IntrospectError(f"TMA stride {i} = {s} bytes is not a multiple of 16 below 2**40")
    for i, d in enumerate(dims):
        if not 0 < d <= 1 << 32:
            raise IntrospectError(f"TMA dim {i} = {d} is not in 1..2**32")
    return {
        "dtype": dtype,
        "dims": dims,
        "strides": strides,
        "box": box,
        "element_strides": [1] * len(box),
        "swizzle": swizzle,
        "interleave": "NONE",
        "l2_promotion": l2_promotion,
        "oob_fill": "NONE",
    }


def subbyte_tma_geometry(atom: Any, shape: tuple[int, ...], stride: tuple[int, ...], swizzle: str,
                         l2_promotion: str) -> dict[str, Any]:
    """Geometry of an atom with a flat basis ("(256,128,1):(1@1,1@0,1@2)") over a placeholder of
    `shape` / element `stride`; byte strides are computed in bits, so 4-bit elements work."""
    t = atom_type(atom)
    box = [int(b) for b in t["box_modes"]]
    modes = []
    for b in t["basis_modes"]:
        m = re.fullmatch(r"1@(\d+)", b)
        if not m:
            raise IntrospectError(f"basis {b!r} of {t['type']} is not a flat unit basis")
        modes.append(int(m.group(1)))
    bits = _FORMAT_BITS[t["dtype"]]
    if _ELEM_BITS.get(t["elem"]) != bits:
        raise IntrospectError(f"atom element {t['elem']} moved as {t['dtype']}: no flat geometry")
    if int(stride[modes[0]]) != 1:
        raise IntrospectError(f"descriptor dim 0 of {t['type']} is not the contiguous tensor mode")
    if math.prod(box) * bits != t["copy_bits"]:
        raise IntrospectError(f"box {box} of {bits}-bit elements is not copy_bits {t['copy_bits']}")
    dims = [int(shape[m]) for m in modes]
    strides = []
    for m in modes[1:]:
        stride_bits = int(stride[m]) * bits
        if stride_bits % 8:
            raise IntrospectError(f"stride of mode {m} is not a whole number of bytes")
        strides.append(stride_bits // 8)
    return _geometry(t["dtype"], dims, strides, box, swizzle, l2_promotion)


def sf_tma_geometry(atom: Any, ab_shape: tuple[int, int, int], sf_vec: int, swizzle: str,
                    l2_promotion: str) -> dict[str, Any]:
    """Geometry of a scale-factor atom made (internal_type=Int16) from
    `tile_atom_to_shape_SF(ab_shape, sf_vec)`, ab_shape = (rows, K, L).

    The DSL views the blocked layout as 16-bit elements: descriptor dim 0 is one 512-byte atom
    (256 elements, basis modes of the atom's rows and scale columns), dim 1 the K atoms
    (`1@1@1`), dim 2 the row atoms (`1@1@0`), dim 3 L (`1@1@2`). The kernel's per-group
    tensormap.replace writes the same dims and strides (checked in tests/test_sm100_compile.py).
    """
    t = atom_type(atom)
    if t["dtype"] != "UINT16" or t["elem"] != "f8E4M3FN":
        raise IntrospectError(f"scale-factor atom must move f8E4M3FN as U16, got {t['type']}")
    outer = t["basis_modes"][1:]
    # A static L of 1 is dropped from the descriptor by the DSL (rank 3 instead of 4).
    if outer not in (["1@1@1", "1@1@0", "1@1@2"], ["1@1@1", "1@1@0"]):
        raise IntrospectError(f"scale-factor atom basis {t['basis_modes']} is not "
                              "(atom, rest_k, rest_mn[, l])")
    box = [_product(b) for b in t["box_modes"]]
    elem_bytes = 2
    if box[0] * elem_bytes != SF_ATOM_BYTES:
        raise IntrospectError(f"scale-factor box dim 0 is {box[0]} 16-bit elements, not one "
                              f"{SF_ATOM_BYTES}-byte atom")
    if math.prod(box) * 16 != t["copy_bits"]:
        raise IntrospectError(f"box {box} of 16-bit elements is not copy_bits {t['copy_bits']}")
    rows, k, l_ = (int(x) for x in ab_shape)
    if k % (sf_vec * 4) or rows % SF_ATOM_ROWS:
        raise IntrospectError(f"placeholder {ab_shape} is not a whole number of scale atoms")
    rest_k = k // SF_ATOM_K
    rest_mn = rows // SF_ATOM_ROWS
    dims = [SF_ATOM_BYTES // elem_bytes, rest_k, rest_mn, l_][: len(box)]
    strides = [SF_ATOM_BYTES, SF_ATOM_BYTES * rest_k, SF_ATOM_BYTES * rest_k * rest_mn]
    strides = strides[: len(box) - 1]
    return _geometry(t["dtype"], dims, strides, box, swizzle, l2_promotion)


# --------------------------------------------------------------------------------------------
# PTX
# --------------------------------------------------------------------------------------------


def ptx_directives(ptx: str, symbol: str) -> str:
    """The performance directives (.reqntid, .reqnctapercluster, ...) after `.entry symbol(...)`.
    The parameter list itself is parsed by builder/ptx.py, which checks every recorded ABI."""
    m = re.search(rf"\.entry\s+{re.escape(symbol)}\s*\((?P<params>.*?)\)(?P<dirs>[^{{]*)\{{",
                  ptx, re.DOTALL)
    if not m:
        raise IntrospectError(f"no .entry {symbol} in the PTX")
    return m.group("dirs")


def _dims(directives: str, name: str) -> tuple[int, int, int] | None:
    m = re.search(rf"\.{name}\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?", directives)
    if not m:
        return None
    return tuple(int(x) if x else 1 for x in m.groups())  # type: ignore[return-value]


def ptx_reqntid(ptx: str, symbol: str) -> tuple[int, int, int]:
    """Exact block dims (`.reqntid`) of `symbol`."""
    dims = _dims(ptx_directives(ptx, symbol), "reqntid")
    if dims is None:
        raise IntrospectError(f".entry {symbol} has no .reqntid: the block size is not fixed")
    return dims


def ptx_cluster_dims(ptx: str, symbol: str) -> tuple[int, int, int]:
    """Cluster dims required by `symbol`: `.reqnctapercluster`, or (1, 1, 1) without one."""
    directives = ptx_directives(ptx, symbol)
    if ".explicitcluster" in directives and _dims(directives, "reqnctapercluster") is None:
        raise IntrospectError(f".entry {symbol} needs a cluster launch of unknown shape")
    return _dims(directives, "reqnctapercluster") or (1, 1, 1)


# --------------------------------------------------------------------------------------------
# Lowered host launcher
# --------------------------------------------------------------------------------------------

# cudaLaunchConfig_t {dim3 gridDim; dim3 blockDim; size_t dynamicSmemBytes; stream; attrs; n}.
_LAUNCH_CFG = "!llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>"


def _host_function_text(ir_module: Any, function_name: str) -> str:
    for op in ir_module.body.operations:
        if op.operation.name != "llvm.func":
            continue
        if str(op.attributes["sym_name"]).strip('"') == function_name:
            return str(op)
    raise IntrospectError(f"no host function {function_name} in the lowered module")


def _stored_constant(fn: str, field: str) -> int:
    """The constant the launcher stores into `field` ("2" or "1, 0") of its launch config."""
    geps = re.findall(rf"(%\d+) = llvm\.getelementptr %\d+\[0, {field}\] : \(!llvm\.ptr\) -> "
                      rf"!llvm\.ptr, {re.escape(_LAUNCH_CFG)}", fn)
    if len(geps) != 1:
        raise IntrospectError(f"expected one launch config field [0, {field}], found {len(geps)}")
    stores = re.findall(rf"llvm\.store (%\d+), {re.escape(geps[0])} :", fn)
    if len(stores) != 1:
        raise IntrospectError(f"expected one store to launch config field [0, {field}]")
    const = re.search(rf"{re.escape(stores[0])} = llvm\.mlir\.constant\((-?\d+) : i\d+\)", fn)
    if not const:
        raise IntrospectError(f"launch config field [0, {field}] is not a compile-time constant")
    return int(const.group(1))


def lowered_launch(compiled: Any) -> dict[str, Any]:
    """Dynamic shared memory and block dims the DSL's own launcher would use."""
    fn = _host_function_text(compiled.ir_module, compiled.function_name)
    return {
        "dynamic_smem": _stored_constant(fn, "2"),
        "block": tuple(_stored_constant(fn, f"1, {i}") for i in range(3)),
    }


def lowered_tma_descriptors(compiled: Any) -> list[list[int | None]]:
    """The CUtensorMap words the DSL's own launcher packs for each TMA atom, in trace order.

    With static placeholder tensors every word but the address is a compile-time constant; a
    word that is not (the address) is None. Used by tests to cross-check the recorded geometry
    against the DSL's own encoding.
    """
    fn = _host_function_text(compiled.ir_module, compiled.function_name)
    consts = dict(re.findall(r"(%\d+) = llvm\.mlir\.constant\((-?\d+) : i64\) : i64", fn))
    descriptors = []
    for alloca in re.findall(r"(%\d+) = llvm\.alloca %\d+ x i64 \{alignment = 64 : i64\}", fn):
        geps = dict(re.findall(rf"(%\d+) = llvm\.getelementptr {re.escape(alloca)}\[0, (\d+)\] "
                               r": \(!llvm\.ptr\) -> !llvm\.ptr, !llvm\.array<16 x i64>", fn))
        words: dict[int, int | None] = {}
        for value, ptr in re.findall(r"llvm\.store (%\w+), (%\d+) : i64, !llvm\.ptr", fn):
            if ptr in geps:  # the last store wins: the launcher zero-fills first
                c = consts.get(value)
                words[int(geps[ptr])] = None if c is None else int(c) & ((1 << 64) - 1)
        descriptors.append([words.get(i, 0) for i in range(16)])
    return descriptors


def require_no_stack_frame(cubin: bytes, symbol: str, hint: str) -> None:
    """IntrospectError when ptxas gave `symbol` a stack frame (local memory: register spills
    or stack arrays). A warp-specialized kernel whose consumer spills runs correctly but far
    slower, and nothing else at build time would say so; `hint` names the likely cause."""
    from runtime.loader import cubin_frame_size

    frame = cubin_frame_size(cubin, symbol)
    if frame:
        raise IntrospectError(f"ptxas gave {symbol} a {frame}-byte stack frame (local memory: "
                              f"register spills or stack arrays); {hint}")


def wgmma_serialized(sass: str) -> bool:
    """Whether ptxas serialized a kernel's wgmma (its "C7512 ... serialized due to insufficient
    register resources"): then every HGMMA waits on its own scoreboard (carries `gsb0`), while
    an asynchronous commit group of k-blocks carries it on its last HGMMA only."""
    hgmma = re.findall(r"HGMMA\.[^;]*;", sass)
    return bool(hgmma) and all("gsb0" in op for op in hgmma)


def nvdisasm_path() -> str | None:
    """nvdisasm on PATH, else from the nvidia-cuda-nvdisasm wheel (the `build` extra has it)."""
    import glob
    import importlib.util
    import os
    import shutil

    found = shutil.which("nvdisasm")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        hits = sorted(glob.glob(os.path.join(root, "*", "bin", "nvdisasm")))
        if hits:
            return hits[-1]
    return None


def require_async_wgmma(cubin: bytes, symbol: str, hint: str) -> None:
    """IntrospectError when ptxas serialized `symbol`'s wgmma. Such a kernel is correct but
    loses the overlap of MMA with everything else (25% on the H200 when it happened), and
    ptxas only says so in an info line the DSL does not show."""
    import subprocess
    import tempfile

    tool = nvdisasm_path()
    if tool is None:
        raise IntrospectError("nvdisasm not found: install nvidia-cuda-nvdisasm (the build "
                              "extra has it) to check sm_90a kernels for serialized wgmma")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        # The module holds this one kernel (compile_kernel checks), so its whole code is it.
        proc = subprocess.run([tool, "-c", f.name], capture_output=True, text=True,
                              timeout=300, check=False)
    if proc.returncode != 0:
        raise IntrospectError(f"nvdisasm failed on {symbol}: {proc.stderr.strip()[:300]}")
    if wgmma_serialized(proc.stdout):
        raise IntrospectError(f"ptxas serialized every wgmma of {symbol} (insufficient "
                              f"registers); {hint}")
