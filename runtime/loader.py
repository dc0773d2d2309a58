"""Artifact loading: manifest, cubin checks, per-device functions with their ABI verified.

Everything is lazy: `ArtifactStore(dir)` reads only the manifest; a kernel's cubin is read,
hashed, arch-checked and loaded on its first use, and bound to a device (cuKernelGetFunction in
that device's primary context) on its first use there. A corrupt or mismatched artifact is an
ArtifactError naming the file or parameter, never a crash or a wrong answer (Runtime rules).
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ArtifactError, CudaError
from .manifest import ARCH_CAPABILITY, KernelEntry, Manifest, load_manifest

_ELF_MAGIC = b"\x7fELF"
_EM_CUDA = 190
# Beyond any real kernel (the driver caps parameters at 32764 bytes): stops a runaway loop.
_MAX_PARAMS = 8192
_SMEM_DEFAULT_LIMIT = 48 * 1024  # above this a kernel must opt in with a function attribute


def cubin_arch(image: bytes) -> str:
    """The SASS target of a cubin ('sm_90a', 'sm_100a', 'sm_90', ...) from its ELF header.

    CUDA ELF e_flags come in two layouts, told apart by EI_ABIVERSION (byte 8):
    - ABI 7 (ptxas 12.x/13.x for sm_90a and older): SM number in bits 0-7, the 'a' variant in
      bit 11 (EF_CUDA_ACCELERATORS_V1 = 0x800).
    - ABI 8 (Blackwell): SM number in bits 8-15, 'a' in bit 3 (EF_CUDA_ACCELERATORS = 0x8).
    Checked on cubins from the DSL's ptxas (nvidia-cutlass-dsl 4.8.1): sm_90a 0x5a0d5a and
    sm_90 0x5a055a (ABI 7); sm_100a 0x600640a, sm_100 and sm_100f 0x6006402 (ABI 8).
    """
    if len(image) < 64 or image[:4] != _ELF_MAGIC:
        raise ValueError("not an ELF file")
    if image[4] != 2 or image[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (machine,) = struct.unpack_from("<H", image, 18)
    if machine != _EM_CUDA:
        raise ValueError(f"ELF machine must be {_EM_CUDA} (NVIDIA CUDA), but got {machine}")
    (flags,) = struct.unpack_from("<I", image, 48)
    if image[8] == 8:
        sm, accel = (flags >> 8) & 0xFF, bool(flags & 0x8)
    elif image[8] == 7:
        sm, accel = flags & 0xFF, bool(flags & 0x800)
    else:
        raise ValueError(f"CUDA ELF ABI version must be 7 or 8, but got {image[8]}")
    return f"sm_{sm}{'a' if accel else ''}"


_EIATTR_KPARAM_INFO = 0x17
_EIATTR_FRAME_SIZE = 0x11
_EIFMT_SVAL = 4  # attribute with a u16 length and a value; the other formats take 4 bytes


def _sections(image: bytes) -> dict[str, tuple[int, int, int]]:
    """Section name -> (type, file offset, size) of an ELF64 file (ValueError if malformed)."""
    try:
        (shoff,) = struct.unpack_from("<Q", image, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
        if shnum == 0:
            return {}
        if shentsize < 64 or shstrndx >= shnum or shoff + shnum * shentsize > len(image):
            raise ValueError("section header table out of bounds")
        heads = [struct.unpack_from("<IIQQQQ", image, shoff + i * shentsize)
                 for i in range(shnum)]
        _, _, _, _, str_off, str_size = heads[shstrndx]
        if str_off + str_size > len(image):
            raise ValueError("section name table out of bounds")
        out = {}
        for name_off, typ, _, _, off, size in heads:
            end = image.find(b"\0", str_off + name_off, str_off + str_size)
            if end < 0 or (typ != 8 and off + size > len(image)):  # 8: SHT_NOBITS
                raise ValueError("section out of bounds")
            out[image[str_off + name_off:end].decode("ascii", "replace")] = (typ, off, size)
        return out
    except struct.error as exc:
        raise ValueError(f"truncated ELF headers ({exc})") from exc


def _nv_attributes(data: bytes, where: str) -> Iterator[tuple[int, bytes]]:
    """(attribute, value) of each valued (EIFMT_SVAL) attribute of a .nv.info section."""
    at = 0
    while at + 4 <= len(data):
        fmt, attr = data[at], data[at + 1]
        if fmt == _EIFMT_SVAL:
            (length,) = struct.unpack_from("<H", data, at + 2)
            value = data[at + 4:at + 4 + length]
            if len(value) != length:
                raise ValueError(f"{where}: attribute {attr:#x} runs past the section")
            at += 4 + length
            yield attr, value
        elif fmt in (1, 2, 3):
            at += 4
        else:
            raise ValueError(f"{where}: unknown attribute format {fmt} at byte {at}")


def cubin_frame_size(image: bytes, symbol: str) -> int | None:
    """Bytes of per-thread stack frame ptxas gave kernel `symbol`: local memory for register
    spills or stack arrays (EIATTR_FRAME_SIZE in the cubin's .nv.info, per symbol-table index).
    None for an image with no section table (synthetic test cubins); ValueError when the
    symbol or its attribute is missing."""
    sections = _sections(image)
    if not sections:
        return None
    index = _symbol_index(image, sections, symbol)
    info = sections.get(".nv.info")
    if info is None:
        raise ValueError("it has no section .nv.info")
    _, off, size = info
    for attr, value in _nv_attributes(image[off:off + size], ".nv.info"):
        if attr == _EIATTR_FRAME_SIZE and len(value) >= 8:
            sym, frame = struct.unpack_from("<II", value)
            if sym == index:
                return frame
    raise ValueError(f".nv.info has no EIATTR_FRAME_SIZE for {symbol!r}")


def _symbol_index(image: bytes, sections: dict[str, tuple[int, int, int]], symbol: str) -> int:
    """Index of `symbol` in the ELF symbol table (.symtab, names in .strtab)."""
    if ".symtab" not in sections or ".strtab" not in sections:
        raise ValueError("it has no symbol table")
    _, sym_off, sym_size = sections[".symtab"]
    _, str_off, str_size = sections[".strtab"]
    name = symbol.encode()
    for i in range(sym_size // 24):  # Elf64_Sym: u32 name, u8 info, u8 other, u16 shndx, ...
        (name_off,) = struct.unpack_from("<I", image, sym_off + 24 * i)
        start = str_off + name_off
        if image[start:start + len(name) + 1] == name + b"\0" and name_off < str_size:
            return i
    raise ValueError(f"its symbol table has no {symbol!r}")


def cubin_param_layout(image: bytes, symbol: str) -> list[tuple[int, int]] | None:
    """(offset, size) of each parameter of `symbol`, read from the cubin on the CPU.

    ptxas records every kernel parameter in the kernel's `.nv.info.<symbol>` section as an
    EIATTR_KPARAM_INFO attribute: u32 index, u16 ordinal, u16 offset, u32 flags with the size
    in bits 18-31. The offsets are the ones cuFuncGetParamInfo reports (device-side, from the
    parameter base: 48 for a first CUtensorMap on sm_90a, see `device_offsets`), checked on
    the sm_90a and sm_100a cubins of nvidia-cutlass-dsl 4.8.1. So the manifest's ABI can be
    checked against the cubin itself with no GPU.

    None when the image has no section table at all (the synthetic cubins of the CPU tests;
    the driver cannot load such a file). ValueError when the symbol has no info section or an
    attribute is malformed.
    """
    sections = _sections(image)
    if not sections:
        return None
    info = sections.get(f".nv.info.{symbol}")
    if info is None:
        raise ValueError(f"it has no section .nv.info.{symbol}, so no kernel {symbol!r}")
    _, off, size = info
    params: dict[int, tuple[int, int]] = {}
    for attr, value in _nv_attributes(image[off:off + size], f".nv.info.{symbol}"):
        if attr == _EIATTR_KPARAM_INFO:
            if len(value) < 12:
                raise ValueError(f".nv.info.{symbol}: EIATTR_KPARAM_INFO must have 12 "
                                 f"bytes, but has {len(value)}")
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", value)
            if ordinal in params:
                raise ValueError(f".nv.info.{symbol}: parameter {ordinal} is listed twice")
            params[ordinal] = (offset, flags >> 18)
    if sorted(params) != list(range(len(params))):
        raise ValueError(f".nv.info.{symbol}: parameter ordinals {sorted(params)} have gaps")
    return [params[i] for i in range(len(params))]


def cubin_path(directory: Path, entry: KernelEntry) -> Path:
    """`directory / entry.cubin`, or ArtifactError when it resolves outside the directory (a
    symlinked cubin or cubins/): an artifact directory must be self-contained, since verify,
    package and swap-in treat it as one unit (issue 28)."""
    path = directory / entry.cubin
    root, real = directory.resolve(), path.resolve()
    if not real.is_relative_to(root):
        raise ArtifactError(
            f"cubin {path} of kernel {entry.name!r} must be inside the artifact directory "
            f"{root}, but it resolves to {real} (a symlink out of it); copy the file in or "
            "rebuild the artifacts")
    return path


def check_device(entry: KernelEntry, capability: tuple[int, int], label: str) -> None:
    """ArtifactError unless `entry` (by its manifest arch) runs on a device of `capability`.

    Pure, so the arch refusal is tested without a GPU; `label` names the device."""
    want = ARCH_CAPABILITY[entry.arch]
    if tuple(capability) != want:
        raise ArtifactError(
            f"kernel {entry.name!r} is built for {entry.arch}, which needs compute capability "
            f"{want[0]}.{want[1]}, but it was asked to run on {label}"
        )


def check_cubin_for_device(image: bytes, capability: tuple[int, int], label: str,
                           what: str = "cubin") -> str:
    """The cubin's ELF arch, or ArtifactError unless it runs on a device of `capability`.

    Reads only the ELF header: a manifest that lies about a cubin's arch is caught too.
    'a' targets (sm_90a, sm_100a) run on exactly one compute capability.
    """
    try:
        arch = cubin_arch(image)
    except ValueError as exc:
        raise ArtifactError(f"{what} is not a CUDA cubin: {exc}") from exc
    want = ARCH_CAPABILITY.get(arch)
    cap = tuple(capability)
    if want != cap:
        runs_on = (f"compute capability {want[0]}.{want[1]}" if want is not None
                   else f"no device this runtime serves ({', '.join(ARCH_CAPABILITY)})")
        raise ArtifactError(
            f"{what} targets {arch}, which runs on {runs_on}, but the device is {label} "
            f"(compute capability {cap[0]}.{cap[1]})"
        )
    return arch


@dataclass(frozen=True)
class LoadedKernel:
    """A kernel bound to one device: the CUfunction to launch and what the driver reported."""

    entry: KernelEntry
    device: Any  # runtime.cuda.Device
    function: Any  # driver.CUfunction, valid in device.context
    num_regs: int
    static_smem: int


def _fmt_shapes(params: list[tuple[int, int]]) -> str:
    return ", ".join(f"({o}, {s})" for o, s in params)


def device_offsets(sizes_aligns: list[tuple[int, int]], residue: int) -> list[int]:
    """Offsets the driver reports for parameters packed from an address `residue` mod 128.

    cuFuncGetParamInfo gives offsets in the device-side layout, which starts at the constant
    bank's parameter base, and that base is not 64-byte aligned on every arch: on the H200
    (sm_90a) a first parameter with align 64 (a CUtensorMap) is reported at offset 48, not 0,
    because the base sits 16 bytes past a 64-byte boundary. The PTX layout (and the
    manifest's offsets) is the same (size, align) sequence packed from 0. kernelParams is
    unaffected: it passes one pointer per parameter and the driver places each value.
    """
    out, at = [], residue
    for size, align in sizes_aligns:
        at = (at + align - 1) // align * align
        out.append(at - residue)
        at += size
    return out


def check_param_layout(entry: KernelEntry, actual: list[tuple[int, int]]) -> None:
    """Compare the loaded kernel's (offset, size) per parameter with the manifest's ABI.

    Checks that the manifest's offsets are its (size, align) sequence packed from 0, that the
    count and every size agree with the cubin, and that the cubin's offsets are that same
    sequence packed from some parameter-base residue (see `device_offsets`).
    """
    sa = [(p.size, p.align) for p in entry.params]
    for i, (p, want) in enumerate(zip(entry.params, device_offsets(sa, 0), strict=True)):
        if p.offset != want:
            raise ArtifactError(
                f"kernel {entry.name!r}: parameter {i} {p.name!r} must be at offset {want} "
                f"(its size and alignment after the previous parameters), but the manifest "
                f"records offset {p.offset}; the manifest is inconsistent, rebuild the artifacts"
            )
    for i, p in enumerate(entry.params):
        if i >= len(actual):
            raise ArtifactError(
                f"kernel {entry.name!r}: the manifest records {len(entry.params)} parameters but "
                f"the cubin's {entry.symbol} has {len(actual)}; first missing: params[{i}] "
                f"{p.name!r} (offset {p.offset}, size {p.size}). Rebuild the artifacts."
            )
    if len(actual) > len(entry.params):
        extra = actual[len(entry.params):]
        raise ArtifactError(
            f"kernel {entry.name!r}: the cubin's {entry.symbol} has {len(actual)} parameters but "
            f"the manifest records {len(entry.params)}; extra (offset, size): {_fmt_shapes(extra)}."
            " Rebuild the artifacts."
        )
    # Counts agree from here on.
    got = [o for o, _ in actual]
    best, best_prefix = 0, -1
    for residue in range(0, 128, 4):
        offsets = device_offsets(sa, residue)
        prefix = next((i for i, (x, y) in enumerate(zip(offsets, got, strict=True)) if x != y),
                      len(got))
        if prefix > best_prefix:
            best, best_prefix = residue, prefix
    want = device_offsets(sa, best)
    for i, (p, (offset, size)) in enumerate(zip(entry.params, actual, strict=True)):
        if (want[i], p.size) != (offset, size):
            raise ArtifactError(
                f"kernel {entry.name!r}: parameter {i} {p.name!r} must be at offset {want[i]} "
                f"with size {p.size} (manifest layout from a parameter base at {best} mod 128), "
                f"but the cubin has offset {offset} and size {size}. The manifest's ABI does "
                "not match the cubin; rebuild."
            )


class ArtifactStore:
    """The manifest of an artifact directory and lazily loaded, verified kernels.

    Thread-safe: first loads run under one lock and are re-checked after taking it; later
    lookups are lock-free dict reads.
    """

    def __init__(self, artifact_dir: str | Path) -> None:
        self.dir = Path(artifact_dir)
        self.manifest: Manifest = load_manifest(self.dir)
        self._lock = threading.RLock()
        # kernel key -> (CUlibrary, CUkernel): sets served by one kernel share one load.
        self._kernels: dict[str, Any] = {}
        self._bound: dict[tuple[str, int], LoadedKernel] = {}

    @property
    def kernels(self) -> tuple[KernelEntry, ...]:
        """The served entries (one per set, arch, acc stages, out dtype), as dispatched."""
        return self.manifest.sets

    # ---------------------------------------------------------------- CPU-only checks

    def read_cubin(self, entry: KernelEntry) -> bytes:
        """The cubin's bytes after checking presence, size, sha256 and ELF arch."""
        path = cubin_path(self.dir, entry)
        if not path.is_file():
            raise ArtifactError(
                f"cubin of kernel {entry.name!r} is missing: {path}; rebuild the artifacts with "
                "`python build_kernels.py build` or restore the directory"
            )
        image = path.read_bytes()
        digest = hashlib.sha256(image).hexdigest()
        if digest != entry.sha256:
            size = (f"; it has {len(image)} bytes, the manifest records {entry.cubin_bytes}"
                    f"{' (truncated)' if len(image) < entry.cubin_bytes else ''}"
                    if len(image) != entry.cubin_bytes else "")
            raise ArtifactError(
                f"cubin {path} of kernel {entry.name!r} has sha256 {digest}, but the manifest "
                f"records {entry.sha256}{size}; the file is altered or truncated, rebuild it"
            )
        try:
            arch = cubin_arch(image)
        except ValueError as exc:
            raise ArtifactError(f"cubin {path} of kernel {entry.name!r} is not a CUDA cubin: "
                                f"{exc}") from exc
        if arch != entry.arch:
            raise ArtifactError(
                f"cubin {path} of kernel {entry.name!r} must target {entry.arch} (manifest), "
                f"but its ELF header says {arch}"
            )
        try:
            layout = cubin_param_layout(image, entry.symbol)
        except ValueError as exc:
            raise ArtifactError(f"cubin {path} of kernel {entry.name!r}: {exc}; the manifest "
                                "does not describe this cubin, rebuild the artifacts") from exc
        if layout is not None:  # the same check cuFuncGetParamInfo feeds at bind time
            check_param_layout(entry, layout)
        return image

    def read_cubin_for_device(self, entry: KernelEntry, capability: tuple[int, int],
                              label: str) -> bytes:
        """`read_cubin` after checking that the entry and its cubin's ELF header both target
        a device of `capability` ((9, 0) for the H200). Needs no GPU."""
        check_device(entry, capability, label)
        image = self.read_cubin(entry)
        check_cubin_for_device(image, capability, label, f"cubin {self.dir / entry.cubin}")
        return image

    # ---------------------------------------------------------------- driver side

    def _library_kernel(self, entry: KernelEntry) -> Any:
        """CUkernel of the entry: one context-independent library load serves every device."""
        from cuda.bindings import driver

        from . import cuda

        k = self._kernels.get(entry.key)
        if k is None:
            image = self.read_cubin(entry)
            cuda.init()
            lib = cuda.check(driver.cuLibraryLoadData(image, None, None, 0, None, None, 0),
                             f"cuLibraryLoadData({entry.cubin})")
            try:
                kernel = cuda.check(driver.cuLibraryGetKernel(lib, entry.symbol.encode()),
                                    f"cuLibraryGetKernel({entry.symbol})")
            except CudaError as exc:
                raise ArtifactError(f"kernel {entry.name!r}: symbol {entry.symbol!r} is not in "
                                    f"{self.dir / entry.cubin} ({exc})") from exc
            # The library handle is kept with the kernel: unloading it would free the kernel.
            k = (lib, kernel)
            self._kernels[entry.key] = k
        return k[1]

    def kernel(self, entry: KernelEntry, device: Any) -> LoadedKernel:
        """The entry's kernel loaded on `device` (runtime.cuda.Device), verified once."""
        key = (entry.name, device.ordinal)
        bound = self._bound.get(key)
        if bound is not None:
            return bound
        with self._lock:
            bound = self._bound.get(key)
            if bound is None:
                bound = self._bind(entry, device)
                self._bound[key] = bound
        return bound

    def _bind(self, entry: KernelEntry, device: Any) -> LoadedKernel:
        from cuda.bindings import driver

        from . import cuda

        check_device(entry, device.capability, device.label)
        kernel = self._library_kernel(entry)
        fa = driver.CUfunction_attribute
        with cuda.current(device):
            func = cuda.check(driver.cuKernelGetFunction(kernel), "cuKernelGetFunction")

            def attr(a: Any) -> int:
                return int(cuda.check(driver.cuFuncGetAttribute(a, func),
                                      f"cuFuncGetAttribute({a.name})"))

            static_smem = attr(fa.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            total = entry.dynamic_smem + static_smem
            if total > device.max_smem_optin:
                raise ArtifactError(
                    f"kernel {entry.name!r} needs {entry.dynamic_smem} B dynamic + {static_smem} B "
                    f"static = {total} B of shared memory per block, but {device.label} allows "
                    f"at most {device.max_smem_optin} B (opt-in limit)"
                )
            if entry.dynamic_smem > 0:
                # Required above 48 KiB; harmless below. Set once per function (per device).
                cuda.check(driver.cuFuncSetAttribute(
                    func, fa.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, entry.dynamic_smem),
                    "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
            if entry.grid.ctas_per_sm > 1:
                # Several CTAs per SM only fit with the whole of L1 carved out as shared memory;
                # the driver's default may carve less, and a cooperative launch then fails.
                cuda.check(driver.cuFuncSetAttribute(
                    func, fa.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100),
                    "cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)")
            threads = entry.block[0] * entry.block[1] * entry.block[2]
            max_threads = attr(fa.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
            if threads > max_threads:
                raise ArtifactError(
                    f"kernel {entry.name!r} launches {threads} threads per block "
                    f"(block {entry.block}), but the loaded function allows at most {max_threads}"
                )
            cluster = entry.cluster[0] * entry.cluster[1] * entry.cluster[2]
            if cluster > 8:  # portable cluster size limit
                cuda.check(driver.cuFuncSetAttribute(
                    func, fa.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                    "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")
            check_param_layout(entry, param_layout(func))
            num_regs = attr(fa.CU_FUNC_ATTRIBUTE_NUM_REGS)
        return LoadedKernel(entry=entry, device=device, function=func, num_regs=num_regs,
                            static_smem=static_smem)


def param_layout(func: Any) -> list[tuple[int, int]]:
    """(offset, size) of each parameter of a loaded function.

    cuFuncGetParamCount is missing on driver 580, so walk cuFuncGetParamInfo until it reports
    an invalid index (CUDA_ERROR_INVALID_VALUE). Any other error on the first index means the
    driver cannot answer at all, which is reported rather than read as "no parameters".
    """
    from cuda.bindings import driver

    from . import cuda

    out: list[tuple[int, int]] = []
    for i in range(_MAX_PARAMS):
        err, offset, size = driver.cuFuncGetParamInfo(func, i)
        if err != driver.CUresult.CUDA_SUCCESS:
            if err != driver.CUresult.CUDA_ERROR_INVALID_VALUE:
                raise CudaError(f"cuFuncGetParamInfo(index {i})", int(err), cuda.error_name(err))
            break
        out.append((int(offset), int(size)))
    return out
