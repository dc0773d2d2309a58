"""Where a serving call's host time goes (issue 26's 10 us goal): the pieces of the fast path of
gg.scaled_grouped_mm (runtime/serving.py _fast, runtime/device.py launch_offsets) timed one by
one in tight loops on the H200, beside the whole call.

    PYTHONPATH=. python experiments/host_breakdown.py --artifacts artifacts

Each line: mean us per iteration over N iterations (after a warm-up); launches in blocks of
100 enqueued behind a spin kernel (the host's time, not the GPU's). The machine's speed drifts
by up to 2x between leases and within a process: compare pieces of one run, and A/B anything
in interleaved blocks (runs 14-16 of the seventeenth session: cuLaunchKernelEx through ctypes
looked 1.3 us cheaper measured after cuda-python's, and was 6.68 against 6.59 us interleaved;
docs/lab_notebook.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from cuda.bindings import driver

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offsets_quick import routing
from serving_extras import layer_for

import runtime
from runtime import launch

N = 3000


def per_iter(fn, n: int = N, sync_every: int = 0) -> float:
    """Mean host us of fn. With sync_every (launches): blocks of that many calls, each enqueued
    behind a spin kernel that holds the GPU longer than the block takes to enqueue, so the time
    is the host's and not the GPU's; the syncs and spins are outside the timed spans."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    if not sync_every:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6
    total = 0.0
    for _ in range(n // sync_every):
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)  # about 10 ms of GPU time
        t0 = time.perf_counter()
        for _ in range(sync_every):
            fn()
        total += time.perf_counter() - t0
    torch.cuda.synchronize()
    return total / (n // sync_every * sync_every) * 1e6


def main() -> int:
    import random

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--entry", default="qwen3_30b_down.sm_90a.acc1.bf16")
    ap.add_argument("--t", type=int, default=4096)
    args = ap.parse_args()
    gg = runtime.load(args.artifacts)
    layer = layer_for(gg, args.entry, args.t)
    layer.load(routing(random.Random(1), args.t, layer.e, "skewed"))
    alpha = torch.ones(layer.e, device="cuda")
    out = torch.empty(args.t, layer.n, dtype=torch.bfloat16, device="cuda")
    call = (layer.a, layer.b, layer.sfa, layer.sfb, layer.offs)
    gg.scaled_grouped_mm(*call, alpha=alpha, out=out)  # validated: the fast path from now on
    torch.cuda.synchronize()

    rt = gg.device_runtime()
    sig = gg._serving_signatures[(id(layer.b), False, False)][0]
    tensors = (*call, out, alpha)
    stream = rt._stream(rt.device.ordinal)
    op = sig.op
    addrs = (layer.offs.data_ptr(), layer.a.data_ptr(), layer.b.data_ptr(),
             layer.sfa.data_ptr(), layer.sfb.data_ptr(), out.data_ptr())
    ws = rt._workspaces[(stream, op.header)]
    # What the launch primitive costs: the same launch through cuLaunchKernelEx with and without
    # the cooperative attribute, and through the plain-argument cuLaunchCooperativeKernel and
    # cuLaunchKernel (no config struct to marshal), in interleaved blocks (the grid fits on the
    # SMs and nothing else runs, so every form completes).
    params, coop = op._slot()
    plain = launch.make_config(op.grid, op.entry.block, op.entry.dynamic_smem, op.entry.cluster,
                               False)
    op._pack(params.buffer, (*addrs, ws[2], ws[2], alpha.data_ptr()))
    f, kp, smem = op.function, params.kernel_params, op.entry.dynamic_smem
    bx, by, bz = op.entry.block
    forms = {
        "cuLaunchKernelEx, cooperative": lambda: launch.launch(f, coop, stream, kp),
        "cuLaunchKernelEx, not cooperative": lambda: launch.launch(f, plain, stream, kp),
        "cuLaunchCooperativeKernel": lambda: driver.cuLaunchCooperativeKernel(
            f, op.grid, 1, 1, bx, by, bz, smem, stream, kp),
        "cuLaunchKernel, not cooperative": lambda: driver.cuLaunchKernel(
            f, op.grid, 1, 1, bx, by, bz, smem, stream, kp, 0),
    }
    for name, fn in forms.items():  # each form must launch cleanly before it is timed
        r = fn()
        if r is not None and r[0] != driver.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"{name}: {r[0]}")
        torch.cuda.synchronize()
    timed: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(3):
        for name, fn in forms.items():
            timed[name].append(per_iter(fn, n=1000, sync_every=100))
    lines = [*[(f"{name} (median of 3 blocks)", sorted(v)[1])
               for name, v in timed.items()],
        ("whole call (out, alpha given)",
         per_iter(lambda: gg.scaled_grouped_mm(*call, alpha=alpha, out=out), sync_every=100)),
        ("guard.check of 7 tensors", per_iter(lambda: sig.guard.check(*tensors))),
        ("7 data_ptr()", per_iter(lambda: [t.data_ptr() for t in tensors])),
        ("current raw stream", per_iter(lambda: rt._stream(rt.device.ordinal))),
        ("cuCtxGetCurrent", per_iter(lambda: driver.cuCtxGetCurrent())),
        ("cuStreamIsCapturing", per_iter(lambda: driver.cuStreamIsCapturing(stream))),
        ("torch.cuda.is_current_stream_capturing",
         per_iter(torch.cuda.is_current_stream_capturing)),
        ("launch_offsets", per_iter(lambda: rt.launch_offsets(op, addrs, alpha.data_ptr()),
                                    sync_every=100)),
        ("op.launch (pack + cuLaunchKernelEx)",
         per_iter(lambda: op.launch(stream, (*addrs, ws[2], ws[2], alpha.data_ptr())),
                  sync_every=100)),
        ("torch.empty((1,), cuda)", per_iter(lambda: torch.empty(1, device="cuda"))),
    ]
    print(f"{torch.cuda.get_device_name()}, {args.entry}, T = {args.t}")
    for name, us in lines:
        print(f"  {name:45s} {us:7.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
