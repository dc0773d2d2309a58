"""Read the target SM of a cubin from its ELF header.

CUDA cubins are ELF64 with e_machine EM_CUDA (190) and two layouts of e_flags, told apart by
e_ident[EI_ABIVERSION] (names from LLVM's llvm/BinaryFormat/ELF.h):

    ABI version 7 (up to sm_90):  SM number in bits 0-7 (EF_CUDA_SM),
                                  'a' variant = bit 11 (EF_CUDA_ACCELERATORS_V1, 0x800)
    ABI version 8 (sm_100 on):    SM number in bits 8-15 (EF_CUDA_SM_MASK, offset 8),
                                  'a' variant = bit 3 (EF_CUDA_ACCELERATORS, 0x8)

Checked on cubins compiled here with nvidia-cutlass-dsl 4.8.1: sm_90a 0x005a0d5a (sm_90:
0x005a055a), sm_100a 0x0600640a (sm_100: 0x06006402). Reading bits 8-15 of an old-layout
cubin gives its texture/addressing flags (5 for sm_90a), so the layout must be picked first.
"""

from __future__ import annotations

import struct

from .errors import BuildError

EM_CUDA = 190
_ABI_V1, _ABI_V2 = 7, 8
_ACCEL_V1, _ACCEL_V2 = 0x800, 0x8


def cubin_arch(data: bytes, label: str = "cubin") -> str:
    """'sm_90a', 'sm_100a', 'sm_90', ... from the ELF header; BuildError if not a CUDA ELF."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise BuildError(f"{label} is not an ELF file (no ELF magic)")
    if data[4] != 2 or data[5] != 1:
        raise BuildError(f"{label} is not a little-endian ELF64 file, as cubins are")
    (machine,) = struct.unpack_from("<H", data, 18)
    if machine != EM_CUDA:
        raise BuildError(f"{label} is an ELF for machine {machine}, not a CUDA cubin "
                         f"(EM_CUDA = {EM_CUDA})")
    (flags,) = struct.unpack_from("<I", data, 48)
    abi = data[8]
    if abi == _ABI_V1:
        sm, accel = flags & 0xFF, bool(flags & _ACCEL_V1)
    elif abi == _ABI_V2:
        sm, accel = (flags >> 8) & 0xFF, bool(flags & _ACCEL_V2)
    else:
        raise BuildError(f"{label} has CUDA ELF ABI version {abi}; this builder reads "
                         f"versions {_ABI_V1} and {_ABI_V2}")
    return f"sm_{sm}{'a' if accel else ''}"


def check_cubin_arch(data: bytes, arch: str, label: str) -> None:
    """BuildError 'cubin X is for sm_NN, manifest says sm_90a' when the header disagrees."""
    got = cubin_arch(data, f"cubin {label}")
    if got != arch:
        raise BuildError(f"cubin {label} is for {got}, manifest says {arch}")
