"""The launch ABI checked against PTX `.entry` lists, and the SM arch read from cubin headers.

The PTX texts are the parameter forms nvidia-cutlass-dsl 4.8.1 emits (copied from real output,
symbols shortened): the original sm_100a kernel's by-value structs and TMA descriptors, and a
small kernel's pointer + Int32. The `dsl` tests compile real kernels in subprocesses.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, requires_dsl

from builder.elf import check_cubin_arch, cubin_arch
from builder.errors import BuildError
from builder.ptx import check_abi, entry_params
from runtime.manifest import pack_offsets

SM100_PTX = """\
.version 8.8
.target sm_100a
.address_size 64

	// .globl	kern_0

.visible .entry kern_0(
	.param .align 4 .b8 kern_0_param_0[12],
	.param .align 64 .b8 kern_0_param_1[128],
	.param .align 4 .b8 kern_0_param_2[12],
	.param .align 64 .b8 kern_0_param_3[128],
	.param .align 8 .b8 kern_0_param_4[8],
	.param .align 8 .b8 kern_0_param_5[16],
	.param .u32 kern_0_param_6
)
.reqntid 192, 1, 1
{
	ret;
}
"""

SMALL_PTX = """\
.version 8.8
.target sm_90a
.address_size 64

.visible .entry other_0(
	.param .u32 other_0_param_0
)
{
	ret;
}

.visible .entry tiny_0(
	.param .u64 .ptr .global .align 16 tiny_0_param_0,
	.param .u32 tiny_0_param_1,
	.param .u16 tiny_0_param_2,
	.param .u64 tiny_0_param_3
)
.reqntid 32, 1, 1
{
	ret;
}
"""


def abi(slots: list[tuple[int, int]], names: list[str] | None = None) -> list[dict]:
    """Manifest-form params for (size, align) slots, laid out as the CUDA ABI does."""
    names = names or [f"p{i}" for i in range(len(slots))]
    return [{"name": n, "kind": "zeros", "offset": o, "size": s, "align": a}
            for n, (s, a), o in zip(names, slots, pack_offsets(slots), strict=True)]


SM100_SLOTS = [(12, 4), (128, 64), (12, 4), (128, 64), (8, 8), (16, 8), (4, 4)]


def test_entry_params_reads_struct_tma_and_scalar_forms() -> None:
    got = [(p.size, p.align) for p in entry_params(SM100_PTX, "kern_0")]
    assert got == SM100_SLOTS


def test_pointer_align_is_the_pointees_and_scalars_are_naturally_aligned() -> None:
    got = [(p.size, p.align) for p in entry_params(SMALL_PTX, "tiny_0")]
    assert got == [(8, 8), (4, 4), (2, 2), (8, 8)]


def test_entry_is_found_by_exact_symbol() -> None:
    assert [(p.size, p.align) for p in entry_params(SMALL_PTX, "other_0")] == [(4, 4)]
    with pytest.raises(BuildError) as info:
        entry_params(SMALL_PTX, "tiny")
    assert str(info.value) == ("the PTX has no .entry named 'tiny'; its entries: "
                               "['other_0', 'tiny_0']")


def test_matching_abi_passes() -> None:
    check_abi(abi(SM100_SLOTS), SM100_PTX, "kern_0")


def test_wrong_size_names_the_parameter() -> None:
    slots = list(SM100_SLOTS)
    slots[3] = (8, 8)  # a pointer recorded where the PTX passes a CUtensorMap by value
    names = ["mma", "a_tma", "a_coord", "b_tma", "sizes", "ptrs", "num_groups"]
    with pytest.raises(BuildError) as info:
        check_abi(abi(slots, names), SM100_PTX, "kern_0")
    assert str(info.value) == (
        "launch ABI mismatch at parameter 3 ('b_tma'): recorded size 8, align 8, but the PTX "
        ".entry kern_0 has size 128, align 64 (.param .align 64 .b8 kern_0_param_3[128])")


def test_wrong_alignment_names_the_parameter() -> None:
    slots = list(SM100_SLOTS)
    slots[5] = (16, 16)
    with pytest.raises(BuildError, match=r"^launch ABI mismatch at parameter 5 \('p5'\): "
                                         r"recorded size 16, align 16, but the PTX .entry kern_0 "
                                         r"has size 16, align 8 "):
        check_abi(abi(slots), SM100_PTX, "kern_0")


def test_missing_and_extra_parameters_are_count_mismatches() -> None:
    with pytest.raises(BuildError) as info:
        check_abi(abi(SM100_SLOTS[:-1]), SM100_PTX, "kern_0")
    assert str(info.value) == ("launch ABI mismatch: 6 parameters recorded, but the PTX .entry "
                               "kern_0 has 7 (first unrecorded: .param .u32 kern_0_param_6)")
    with pytest.raises(BuildError) as info:
        check_abi(abi(SM100_SLOTS + [(4, 4)], None), SM100_PTX, "kern_0")
    assert str(info.value) == ("launch ABI mismatch: 8 parameters recorded, but the PTX .entry "
                               "kern_0 has 7 (first extra recorded: 'p7')")


def test_inserted_parameter_is_reported_where_it_shifts_the_list() -> None:
    slots = SM100_SLOTS[:2] + [(4, 4)] + SM100_SLOTS[2:]
    with pytest.raises(BuildError, match=r"^launch ABI mismatch at parameter 2 \('p2'\): "
                                         r"recorded size 4, align 4, but .* size 12, align 4"):
        check_abi(abi(slots), SM100_PTX, "kern_0")


def test_hand_edited_offset_is_caught() -> None:
    params = abi(SM100_SLOTS)
    params[6]["offset"] += 4
    with pytest.raises(BuildError) as info:
        check_abi(params, SM100_PTX, "kern_0")
    assert str(info.value) == ("launch ABI mismatch at parameter 6 ('p6'): recorded offset 412, "
                               "but the PTX parameter list puts it at 408")


# --------------------------------------------------------------------------------------------
# ELF
# --------------------------------------------------------------------------------------------


def elf_header(abi_version: int, flags: int, machine: int = 190) -> bytes:
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x33, abi_version]) + bytes(7)
    return ident + struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, 0, flags, 64, 0, 0, 64, 0, 0)


@pytest.mark.parametrize("abi_version,flags,arch", [
    (7, 0x005A0D5A, "sm_90a"),  # e_flags of cubins compiled here, see builder/elf.py
    (7, 0x005A055A, "sm_90"),
    (8, 0x0600640A, "sm_100a"),
    (8, 0x06006402, "sm_100"),
])
def test_cubin_arch_reads_both_header_layouts(abi_version: int, flags: int, arch: str) -> None:
    assert cubin_arch(elf_header(abi_version, flags)) == arch


def test_cubin_arch_rejects_what_is_not_a_cuda_cubin() -> None:
    with pytest.raises(BuildError, match="^x is not an ELF file"):
        cubin_arch(b"/tmp/dump/kernel.cubin".ljust(64), "x")
    with pytest.raises(BuildError, match="^x is an ELF for machine 62, not a CUDA cubin"):
        cubin_arch(elf_header(7, 0x005A0D5A, machine=62), "x")
    with pytest.raises(BuildError, match="^x has CUDA ELF ABI version 6"):
        cubin_arch(elf_header(6, 0x5A), "x")


def test_arch_mismatch_message() -> None:
    with pytest.raises(BuildError) as info:
        check_cubin_arch(elf_header(8, 0x0600640A), "sm_90a", "cubins/k.cubin")
    assert str(info.value) == "cubin cubins/k.cubin is for sm_100a, manifest says sm_90a"


# --------------------------------------------------------------------------------------------
# Real DSL output: a tiny kernel whose ABI is recorded with kernels.abi.KernelArgs
# --------------------------------------------------------------------------------------------

COMPILE_SCRIPT = """
import json, os, sys
sys.path[:0] = [{root!r}, {repo!r}]
from {pkg}.families import FAMILIES
from {pkg}.dsl90 import config
arch = os.environ["CUTE_DSL_ARCH"]
from importlib import import_module
ck = import_module("{pkg}.dsl90.compile").compile_kernel(config.Config(), arch=arch,
                                                        groups=[[40, 1024, 512]])
open(os.path.join({out!r}, arch + ".cubin"), "wb").write(ck.cubin)
json.dump({{"symbol": ck.symbol, "ptx": ck.ptx, "params": ck.params}},
          open(os.path.join({out!r}, arch + ".json"), "w"))
"""


@pytest.mark.dsl
@requires_dsl
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_dsl_kernel_abi_matches_its_ptx_and_cubin_arch(fake, tmp_path: Path, arch: str) -> None:
    script = COMPILE_SCRIPT.format(root=str(fake.root), repo=str(REPO), pkg=fake.pkg,
                                   out=str(tmp_path))
    env = {**os.environ, "CUTE_DSL_ARCH": arch, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((tmp_path / f"{arch}.json").read_text())
    cubin = (tmp_path / f"{arch}.cubin").read_bytes()
    assert cubin_arch(cubin) == arch  # CUTE_DSL_ARCH before `import cutlass` took effect
    assert got["symbol"] == "fake_gemm_0"  # set_name_prefix gives a short symbol
    assert [(p["name"], p["size"], p["align"]) for p in got["params"]] == [
        ("problem_sizes", 8, 8), ("num_groups", 4, 4)]
    check_abi(got["params"], got["ptx"], got["symbol"])
    wrong = [dict(p) for p in got["params"]]
    wrong[1].update(size=8, align=8)
    with pytest.raises(BuildError, match=r"^launch ABI mismatch at parameter 1 \('num_groups'\)"
                                         r": recorded size 8, align 8, but the PTX .entry "
                                         r"fake_gemm_0 has size 4, align 4 \(.param .u32 "):
        check_abi(wrong, got["ptx"], got["symbol"])
