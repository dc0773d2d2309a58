"""A tiny fake kernel-family package for builder tests, written into a temporary directory.

Two variants share one config per arch:
- `<pkg>.families`: synthetic compilers (no DSL): a minimal CUDA ELF with the right e_flags and
  the symbol in its string table, plus a matching PTX `.entry`. Fast; used by most tests.
- `<pkg>.dsl_families`: compilers that build a trivial `@cute.kernel` with the real DSL, its ABI
  recorded through kernels.abi.KernelArgs (tests marked `dsl`).

Config knob `fail` (a test hook, reachable from shapes.yaml options):
    1 raise in compile_kernel   2 record a wrong ABI   3 kill the worker (os._exit)
    4 return a cubin for the other arch                5 return the cubin as a path string
    6 write the worker's pid to $FAKE_COMPILE_LOG.pid and hang
    7 record a parameter of a kind the manifest schema does not know
    8 the disk fills up: every later Path.write_bytes / write_text in the worker fails (ENOSPC)
Every compile appends "<family> <arch> acc<n> <groups>" to $FAKE_COMPILE_LOG, so tests can count
compiles that happened in worker subprocesses.

`<pkg>.quant_families` is `<pkg>.families` with synthetic activation quantizers (layouts experts
and masked) on sm_90a; each of their compiles appends "quant <arch> <layout>" to the log.
"""

from __future__ import annotations

import uuid
from pathlib import Path

CONFIG = '''\
from dataclasses import dataclass

K_TILE = 256
K_MULTIPLE = K_TILE
N_MULTIPLE = 128
ACC_STAGES = {acc}


@dataclass(frozen=True)
class Config:
    acc_stages: int = 1
    out_dtype: str = "float16"
    tile_m: int = 128
    fail: int = 0


def check(config):
    reasons = []
    if config.acc_stages not in ACC_STAGES:
        reasons.append(f"acc_stages must be one of {{list(ACC_STAGES)}}, but got "
                       f"{{config.acc_stages}}")
    if config.tile_m not in (64, 128):
        reasons.append(f"tile_m must be one of [64, 128], but got {{config.tile_m}}")
    return reasons
'''

COMMON = '''\
import os
import struct
import time

from kernels.abi import CompiledKernel

ELF_FLAGS = {"sm_90a": (7, 0x005A0D5A), "sm_100a": (8, 0x0600640A)}


def log_compile(family, arch, config, groups):
    path = os.environ.get("FAKE_COMPILE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{family} {arch} acc{config.acc_stages} {groups}\\n")


def fail_early(config):
    if config.fail == 1:
        raise RuntimeError("fake compiler failure (fail=1)")
    if config.fail == 3:
        os._exit(17)
    if config.fail == 6:
        with open(os.environ["FAKE_COMPILE_LOG"] + ".pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)
    if config.fail == 8:
        import errno
        import pathlib

        def full(path, *args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        pathlib.Path.write_bytes = full
        pathlib.Path.write_text = full


def fake_elf(arch, symbol, payload):
    abi, flags = ELF_FLAGS[arch]
    ident = b"\\x7fELF" + bytes([2, 1, 1, 0x33 if abi == 7 else 0x41, abi]) + bytes(7)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, 0, flags, 64, 0, 0, 64, 0, 0)
    return header + b"\\0.strtab\\0" + symbol.encode() + b"\\0" + payload.encode()


def finish(config, arch, groups, symbol, cubin, ptx, params):
    if config.fail == 2:  # a deliberately wrong ABI: the scalar recorded as 8 bytes
        params = [dict(p) for p in params]
        params[-1].update(size=8, align=8)
    if config.fail == 4:
        other = "sm_100a" if arch == "sm_90a" else "sm_90a"
        cubin = fake_elf(other, symbol, "wrong arch")
    if config.fail == 5:
        cubin = "/tmp/dump/missing.cubin"
    if config.fail == 7:  # a parameter kind the runtime does not know
        params = [dict(p) for p in params]
        params[0]["kind"] = "pointer"
    return CompiledKernel(
        symbol=symbol, cubin=cubin, ptx=ptx, params=params, block=(128, 1, 1),
        cluster=(1, 1, 1), dynamic_smem=1024 * config.tile_m,
        grid={"policy": "persistent", "ctas_per_sm": 1},
        tile={"m": config.tile_m, "n": 128, "k": 256},
        tables={"problem_sizes": {"dtype": "int32", "columns": ["m", "n", "k", "l"]},
                "pointers": {"dtype": "int64", "columns": ["a", "b", "sfa", "sfb", "c"]},
                "cta_prefix": {"dtype": "int32"},
                "tensormap_workspace": {"bytes_per_cta": 512, "align": 128}},
        constraints={"groups": [list(g) for g in groups], "k_multiple": 256}, sm_count=None)
'''

SYNTH_COMPILE = '''\
from {pkg}.common import fake_elf, fail_early, finish, log_compile

PARAMS = [
    {{"name": "problem_sizes", "kind": "table", "table": "problem_sizes", "offset": 0,
     "size": 8, "align": 8}},
    {{"name": "num_groups", "kind": "scalar", "value": "num_groups", "offset": 8, "size": 4,
     "align": 4}},
]


def compile_kernel(config, *, arch, groups):
    log_compile("{family}", arch, config, groups)
    fail_early(config)
    symbol = "fake_gemm_0"
    ptx = (f".version 8.8\\n.target {{arch}}\\n.address_size 64\\n\\n"
           f".visible .entry {{symbol}}(\\n"
           f"\\t.param .u64 .ptr .global .align 16 {{symbol}}_param_0,\\n"
           f"\\t.param .u32 {{symbol}}_param_1\\n)\\n{{{{\\n\\tret;\\n}}}}\\n")
    # The config and arch only: a real family compiles shape-generic kernels, so one cubin
    # serves every set of its key (manifest schema 2) and shards agree on it.
    payload = f"{{arch}} {{config}}"
    return finish(config, arch, groups, symbol, fake_elf(arch, symbol, payload), ptx, PARAMS)
'''

DSL_COMPILE = '''\
import shutil
import tempfile

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_ptr

from kernels.abi import KernelArgs
from {pkg}.common import fail_early, finish, log_compile

_RECORDED = []


@cute.kernel
def fake_gemm(sizes: cute.Pointer, num_groups: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        t = cute.make_tensor(sizes, cute.make_layout(4))
        t[0] = num_groups


@cute.jit
def launch(sizes: cute.Pointer, num_groups: cutlass.Int32):
    args = KernelArgs()
    args.table("problem_sizes", sizes, "problem_sizes")
    args.scalar("num_groups", num_groups, "num_groups")
    _RECORDED.append(args)
    fake_gemm(*args.values()).launch(grid=[1, 1, 1], block=[128, 1, 1])


fake_gemm.set_name_prefix("fake_gemm", remove_cutlass_symbol=True, keep_mangled_name=False)


def compile_kernel(config, *, arch, groups):
    log_compile("{family}", arch, config, groups)
    fail_early(config)
    dump = tempfile.mkdtemp(prefix="fake_dsl_")  # must exist, or __cubin__ is a path string
    try:
        ptr = make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=16)
        _RECORDED.clear()
        compiled = cute.compile(launch, ptr, cutlass.Int32(len(groups)),
                                options=f"--gpu-arch {{arch}} --keep-ptx --keep-cubin "
                                        f"--dump-dir {{dump}}")
        (symbol,) = list(compiled.kernel_info)
        return finish(config, arch, groups, symbol, compiled.__cubin__, compiled.__ptx__,
                      _RECORDED[-1].params())
    finally:
        shutil.rmtree(dump, ignore_errors=True)
'''

SYNTH_QUANT = '''\\
import os

from {pkg}.common import fake_elf

# The shipped kernels' parameters (kernels/sm90/act_quant.py), pointers then 32-bit scalars.
ROLES = {{"experts": (["x", "offs", "scales", "a", "sfa"],
                     ["rows", "k", "experts", "blocks", "sfa_chunks"]),
         "masked": (["x", "scales", "masked_m", "a", "sfa"],
                    ["max_m", "k", "experts", "blocks", "sfa_chunks", "quant_ctas"])}}


def compile_quantizer(layout, *, arch):
    path = os.environ.get("FAKE_COMPILE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"quant {{arch}} {{layout}}\\n")
    symbol = f"fake_quant_{{layout}}"
    operands, scalars = ROLES[layout]
    params, decls = [], []
    for i, name in enumerate(operands + scalars):
        pointer = i < len(operands)
        size = 8 if pointer else 4
        offset = 8 * i if pointer else 8 * len(operands) + 4 * (i - len(operands))
        params.append({{"name": name, "kind": "operand" if pointer else "scalar",
                       ("operand" if pointer else "value"): name, "offset": offset,
                       "size": size, "align": size}})
        decls.append(f"\\t.param .u64 .ptr .global .align 16 {{symbol}}_param_{{i}}" if pointer
                     else f"\\t.param .u32 {{symbol}}_param_{{i}}")
    ptx = (f".version 8.8\\n.target {{arch}}\\n.address_size 64\\n\\n"
           f".visible .entry {{symbol}}(\\n" + ",\\n".join(decls)
           + "\\n)\\n{{\\n\\tret;\\n}}\\n")
    return {{"cubin": fake_elf(arch, symbol, layout), "ptx": ptx, "symbol": symbol,
            "params": params, "block": [256, 1, 1], "dynamic_smem": 0,
            "max_experts": 1024}}
'''

QUANT_FAMILIES = '''\
from kernels.families import Family
from {pkg}.fake90 import config as c90
from {pkg}.fake100 import config as c100

FAMILIES = {{
    "sm_90a": Family("fake90", c90, "{pkg}.fake90.compile", "{pkg}.fake90.quant",
                     ("experts", "masked")),
    "sm_100a": Family("fake100", c100, "{pkg}.fake100.compile"),
}}
'''

FAMILIES = '''\
from kernels.families import Family
from {pkg}.{f90} import config as c90
from {pkg}.{f100} import config as c100

FAMILIES = {{
    "sm_90a": Family("{f90}", c90, "{pkg}.{f90}.compile"),
    "sm_100a": Family("{f100}", c100, "{pkg}.{f100}.compile"),
}}
'''


def write_fake_package(root: Path) -> str:
    """Write a fresh fake package under `root` and return its (unique) name: a unique name per
    test keeps one test's modules, cached in sys.modules, out of the next."""
    pkg = f"fakefam_{uuid.uuid4().hex[:8]}"
    base = root / pkg
    files = {
        "__init__.py": "",
        "common.py": COMMON,
        "families.py": FAMILIES.format(pkg=pkg, f90="fake90", f100="fake100"),
        "dsl_families.py": FAMILIES.format(pkg=pkg, f90="dsl90", f100="dsl100"),
        "quant_families.py": QUANT_FAMILIES.format(pkg=pkg),
        "fake90/quant.py": SYNTH_QUANT.format(pkg=pkg),
    }
    for fam, acc, template in (("fake90", "(1,)", SYNTH_COMPILE), ("fake100", "(1, 2)",
                                SYNTH_COMPILE), ("dsl90", "(1,)", DSL_COMPILE),
                               ("dsl100", "(1, 2)", DSL_COMPILE)):
        files[f"{fam}/__init__.py"] = ""
        files[f"{fam}/config.py"] = CONFIG.format(acc=acc)
        files[f"{fam}/compile.py"] = template.format(pkg=pkg, family=fam)
    for rel, text in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg
