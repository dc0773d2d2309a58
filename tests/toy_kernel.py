"""A toy sm_90a kernel with the grouped launch ABI, to test runtime/ on a GPU without a GEMM.

It takes what the real kernels take (a TMA template as a 128-byte grid constant, the four
table pointers, num_groups), walks the CTA prefix table with a persistent grid like the real
scheduler, and writes every output element of every group:

    C_g[i, j] = s(a_g[i, 0]) + s(b_g[j, 0]) + s(sfa_g[0]) + s(sfb_g[0]),   s(byte) = int8 value

so each element proves the pointer, problem-size and prefix tables were built and read right.
(The bytes come out sign-extended: that is how this DSL version widens a Uint8 load to Int32
here, seen on the H200; `expected` models it rather than the toy working around it.)

Build (CPU machine with nvidia-cutlass-dsl; the GPU machine needs no DSL):
    CUTE_DSL_ARCH=sm_90a CUDA_VISIBLE_DEVICES= python tests/toy_kernel.py OUT_DIR
then on the GPU: NVFP4_ARTIFACTS=OUT_DIR python -m pytest tests/test_runtime_gpu.py
"""

# No `from __future__ import annotations`: the DSL reads the kernels' annotations as objects, and
# cute is imported inside build() so that importing this module needs no DSL.
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

TILE = 128
THREADS = 128
SETS: dict[str, dict[str, Any]] = {
    "toy_exact": {"groups": [[40, 256, 512], [300, 384, 256], [1, 128, 1024]]},
    "toy_dyn": {"dynamic_m": {"groups": [[256, 512], [128, 256]], "max_m": None}},
    "toy_dyn8": {"dynamic_m": {"groups": [[128, 256], [256, 512]] * 4, "max_m": None}},
}


def expected(shapes, a, b, sfa, sfb) -> list[torch.Tensor]:
    """What the toy kernel writes for these inputs (fp16, on the inputs' device)."""
    outs = []
    for (m, n, _), A, B, SA, SB in zip(shapes, a, b, sfa, sfb, strict=True):
        if m == 0:
            outs.append(torch.empty(0, n, dtype=torch.float16, device=B.device))
            continue
        av = A.view(torch.int8)[:, 0].long()
        bv = B.view(torch.int8)[:, 0].long()
        base = SA.view(torch.int8)[0].long() + SB.view(torch.int8)[0].long()
        outs.append((av[:, None] + bv[None, :] + base).half())
    return outs


def build(out_dir: str) -> Path:
    """Compile the toy and write an artifact directory (manifest + one cubin) for SETS."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import cpasync
    from cutlass.cute.runtime import make_ptr

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels import abi, tables
    from runtime.manifest import SCHEMA_VERSION

    class Toy:
        def __init__(self) -> None:
            self.abi = abi.KernelArgs()

        @cute.jit
        def __call__(self, problem_sizes: cute.Pointer, pointers: cute.Pointer,
                     cta_prefix: cute.Pointer, workspace: cute.Pointer,
                     num_groups: cutlass.Int32):
            placeholder = cute.make_tensor(
                cute.make_ptr(cutlass.Uint8, 0, cute.AddressSpace.gmem, assumed_align=16),
                cute.make_layout((128, 256), stride=(256, 1)))
            tma_atom, tma_tensor = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), placeholder,
                cute.make_layout((64, 128), stride=(128, 1)), (64, 128))
            args = self.abi
            args.tma_template("tma_a", tma_atom, "a", {
                "dtype": "UINT8", "dims": [256, 128], "strides": [256], "box": [128, 64],
                "element_strides": [1, 1], "swizzle": "NONE", "interleave": "NONE",
                "l2_promotion": "NONE", "oob_fill": "NONE"})
            args.static("coords_a", tma_tensor)
            args.table("problem_sizes", problem_sizes, "problem_sizes")
            args.table("pointers", pointers, "pointers")
            args.table("cta_prefix", cta_prefix, "cta_prefix")
            args.table("tensormap_workspace", workspace, "tensormap_workspace")
            args.scalar("num_groups", num_groups, "num_groups")
            self.kernel(*args.values()).launch(grid=(1, 1, 1), block=(THREADS, 1, 1))

        @cute.kernel
        def kernel(self, tma_a: cute.CopyAtom, coords_a: cute.Tensor,
                   problem_sizes: cute.Pointer, pointers: cute.Pointer,
                   cta_prefix: cute.Pointer, workspace: cute.Pointer,
                   num_groups: cutlass.Int32):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            gdim, _, _ = cute.arch.grid_dim()
            if tidx == 0:
                cpasync.prefetch_descriptor(tma_a)
            sizes = cute.make_tensor(problem_sizes,
                                     cute.make_layout((num_groups, 4), stride=(4, 1)))
            ptrs = cute.make_tensor(pointers, cute.make_layout((num_groups, 5), stride=(5, 1)))
            prefix = cute.make_tensor(cta_prefix, cute.make_layout(num_groups + 1))
            ws = cute.make_tensor(workspace, cute.make_layout(gdim * 16))  # 128 B per CTA
            total = prefix[num_groups]
            per = (total + gdim - 1) // gdim
            tile = bidx * per
            end = tile + per
            if end > total:
                end = total
            if tidx == 0:
                ws[bidx * 16] = cutlass.Int64(bidx)
            while tile < end:
                g = cutlass.Int32(0)
                while prefix[g + 1] <= tile:
                    g = g + 1
                m = sizes[g, 0]
                n = sizes[g, 1]
                k = sizes[g, 2]
                tiles_m = (m + TILE - 1) // TILE
                rest = tile - prefix[g]
                tn = rest // tiles_m
                tm = rest - tn * tiles_m
                gmem = cute.AddressSpace.gmem
                a = cute.make_tensor(cute.make_ptr(cutlass.Uint8, ptrs[g, 0], gmem),
                                     cute.make_layout(m * (k // 2)))
                b = cute.make_tensor(cute.make_ptr(cutlass.Uint8, ptrs[g, 1], gmem),
                                     cute.make_layout(n * (k // 2)))
                sfa = cute.make_tensor(cute.make_ptr(cutlass.Uint8, ptrs[g, 2], gmem),
                                       cute.make_layout(1))
                sfb = cute.make_tensor(cute.make_ptr(cutlass.Uint8, ptrs[g, 3], gmem),
                                       cute.make_layout(1))
                c = cute.make_tensor(cute.make_ptr(cutlass.Float16, ptrs[g, 4], gmem),
                                     cute.make_layout(m * n))
                base = cutlass.Int32(sfa[0]) + cutlass.Int32(sfb[0])
                e = tidx
                while e < TILE * TILE:
                    i = tm * TILE + e // TILE
                    j = tn * TILE + e % TILE
                    if i < m and j < n:
                        v = cutlass.Int32(a[i * (k // 2)]) + cutlass.Int32(b[j * (k // 2)]) + base
                        c[i * n + j] = cutlass.Float32(v).to(cutlass.Float16)
                    e = e + THREADS
                tile = tile + 1

    out = Path(out_dir)
    (out / "cubins").mkdir(parents=True, exist_ok=True)
    toy = Toy()
    i32 = make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=16)
    i64 = make_ptr(cutlass.Int64, 0, cute.AddressSpace.gmem, assumed_align=16)
    with tempfile.TemporaryDirectory() as d:
        compiled = cute.compile(toy, i32, i64, i32, i64, cutlass.Int32(1),
                                options=f"--gpu-arch sm_90a --keep-cubin --dump-dir {d}")
        cubin = compiled.__cubin__
    (symbol,) = list(compiled.kernel_info.keys())
    (out / "cubins" / "toy.cubin").write_bytes(cubin)
    digest = hashlib.sha256(cubin).hexdigest()
    key = digest  # one kernel serves every toy set (manifest schema 2)
    kernels = [{
        "key": key, "name": f"toy.sm_90a.acc1.f16.{key[:12]}", "arch": "sm_90a",
        "family": "toy", "acc_stages": 1, "out_dtype": "float16", "options": {},
        "symbol": symbol, "cubin": "cubins/toy.cubin",
        "sha256": digest, "cubin_bytes": len(cubin), "block": [THREADS, 1, 1],
        "cluster": [1, 1, 1], "dynamic_smem": 0, "sm_count": None,
        "grid": {"policy": "persistent", "ctas_per_sm": 1},
        "tile": {"m": TILE, "n": TILE, "k": 256}, "limits": {},
        "tables": tables.tables_record(1), "params": toy.abi.params(),
    }]
    sets = [{"name": f"{name}.sm_90a.acc1.f16", "set": name, "arch": "sm_90a", "acc_stages": 1,
             "out_dtype": "float16", "kernel": key,
             "serves": {k: v for k, v in constraints.items()
                        if k in ("groups", "dynamic_m")}} for name, constraints in SETS.items()]
    manifest = {"schema_version": SCHEMA_VERSION, "builder_version": "toy",
                "dsl_version": cutlass.__version__ if hasattr(cutlass, "__version__") else "",
                "kernels": kernels, "sets": sets}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    print(build(sys.argv[1]))
