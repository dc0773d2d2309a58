"""Ahead-of-time compilation of the sm_90a kernel (the builder worker's entry, imports cutlass):
one config to a cubin with its launch record, after the build guards (no stack frame, no
serialized wgmma, the launcher's shared memory and block equal to the kernel's own)."""

from __future__ import annotations

import os
import tempfile

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8
from cutlass.cute.runtime import make_ptr

from kernels import tables
from kernels.abi import CompiledKernel
from kernels.introspect import (
    lowered_launch,
    ptx_cluster_dims,
    ptx_reqntid,
    require_async_wgmma,
    require_no_stack_frame,
)

from . import tma
from .config import K_TILE, N_MULTIPLE, Config, k_multiple
from .grouped_gemm import Sm90GroupedGemm
from .offsets import Sm90OffsetsGemm


def _check_dsl_arch(arch: str) -> None:
    """CUTE_DSL_ARCH is read once at `import cutlass`; a mismatch would silently target sm_100."""
    env_arch = os.environ.get("CUTE_DSL_ARCH")
    if env_arch != arch:
        raise RuntimeError(
            f"CUTE_DSL_ARCH must be {arch!r} before cutlass is imported, but got {env_arch!r}")


def compile_kernel(config: Config, *, arch: str, groups: list[tuple[int, int, int]],
                   kernel_class: type[Sm90GroupedGemm] | None = None) -> CompiledKernel:
    """Compile the kernel for `config` (shape-generic; `groups` is recorded as what it serves).
    `kernel_class`: a subclass overriding some roles or hooks, for diagnostic builds only
    (experiments/diag_build.py, experiments/trace_families.py); by default Sm90GroupedGemm, or
    Sm90OffsetsGemm for device_offsets: the shipped kernels."""
    if kernel_class is None:
        kernel_class = Sm90OffsetsGemm if config.device_offsets else Sm90GroupedGemm
    if arch != "sm_90a":
        raise ValueError(f"arch must be 'sm_90a' for the sm90 family, but got {arch!r}")
    _check_dsl_arch(arch)
    reasons = kernel_class.can_implement(config, groups)
    if reasons:
        raise ValueError("; ".join(reasons))
    gemm = kernel_class(config)
    i32 = make_ptr(Int32, 16, cute.AddressSpace.gmem, assumed_align=16)
    i64 = make_ptr(Int64, 16, cute.AddressSpace.gmem, assumed_align=16)
    ws = make_ptr(Int64, 128, cute.AddressSpace.gmem, assumed_align=128)
    f32 = make_ptr(Float32, 16, cute.AddressSpace.gmem, assumed_align=4)
    if config.device_offsets:  # offs, a, b, sfa, sfb, c, ..., num_groups, rows, n, k, grid
        offs = make_ptr(Int32, 16, cute.AddressSpace.gmem, assumed_align=4)
        u8 = make_ptr(Uint8, 16, cute.AddressSpace.gmem, assumed_align=16)
        call = (offs, u8, u8, u8, u8, u8, ws, ws, f32, *(Int32(1),) * 5)
    else:  # problem_sizes, pointers, cta_prefix, ..., num_groups, grid
        call = (i32, i64, i32, ws, ws, f32, Int32(1), Int32(1))
    with tempfile.TemporaryDirectory(prefix="nvfp4_sm90_") as dump:
        compiled = cute.compile(
            gemm, *call,
            options=f"--gpu-arch {arch} --keep-cubin --keep-ptx --dump-dir {dump}",
        )
        cubin, ptx = compiled.__cubin__, compiled.__ptx__
    if not isinstance(cubin, bytes) or not ptx:
        raise RuntimeError("the DSL returned no cubin/PTX (dump directory missing?)")
    symbols = list(compiled.kernel_info)
    if len(symbols) != 1:
        raise RuntimeError(f"expected exactly one kernel in the module, but got {symbols}")
    if gemm.REQUIRE_NO_STACK_FRAME:
        require_no_stack_frame(cubin, symbols[0],
                               "every role should fit its registers: check ptxas did not ignore "
                               "setmaxnreg ('ignored to maintain minimum register requirements')")
    if gemm.REQUIRE_ASYNC_WGMMA:
        require_async_wgmma(cubin, symbols[0], "fewer accumulators or fragments per thread")
    # Record what the DSL's own launcher would use, and check it against the kernel's own view.
    launch = lowered_launch(compiled)
    block = ptx_reqntid(ptx, symbols[0])
    if launch["dynamic_smem"] != gemm.smem_bytes or tuple(launch["block"]) != block:
        raise RuntimeError(f"launcher uses smem {launch['dynamic_smem']} and block "
                           f"{launch['block']}, the kernel expects {gemm.smem_bytes} and {block}")
    return CompiledKernel(
        symbol=symbols[0],
        cubin=cubin,
        ptx=ptx,
        params=gemm.args.params(),
        block=block,
        cluster=ptx_cluster_dims(ptx, symbols[0]),
        dynamic_smem=launch["dynamic_smem"],
        # A grid-wide barrier (phase 1): the launch must be cooperative (all CTAs resident).
        grid={"policy": "persistent", "ctas_per_sm": 1, "cooperative": True},
        tile={"m": config.tile_m, "n": config.tile_n, "k": K_TILE},
        tables=tables.tables_record(
            gemm.desc_sets * tma.MAPS_PER_SET,
            header_bytes=gemm.header_bytes,
            # Phase 1's fp16 copy of A; inline_a converts A into shared memory instead.
            bytes_per_a_element=0 if config.inline_a else 2,
            extra_bytes_per_cta=gemm.trace_bytes),
        constraints={"groups": [list(g) for g in groups], "k_multiple": k_multiple(config),
                     "n_multiple": N_MULTIPLE},
    )
