"""Host launch cost: steady-state host microseconds per `grouped_gemm` call, with a breakdown.

    PYTHONPATH=. python bench/host_cost.py --artifacts artifacts [--json out.json]   # GPU
    PYTHONPATH=. python bench/host_cost.py --artifacts artifacts --mock             # CPU

Protocol: G = 2 and G = 8 groups of tiny shapes (the `tiny2_any_m` / `tiny8_any_m` sets: one
128-column tile and one K step per group, m = 8), so each kernel runs for a few microseconds and
the GPU is never the bottleneck. Stable pointers: the same input and `out` tensors every call.
Calls run in batches of --batch back to back (the host never waits on the GPU inside a batch);
the device is synchronized between batches, outside the timed region. Reported: the median over
batches of host time per call, minus the cost of an empty Python call in the same loop.

Rows:
- total: `gg.grouped_gemm(a, b, sfa, sfb, out=out)`, the fast path (runtime/api.py);
- bound call: `bound = gg.bind(a, b, sfa, sfb, out)` once, then `bound()` (runtime/bound.py:
  no guard check and no data_ptr reads, the caller promises the tensors stay as bound);
- full path: the same call through validation, dispatch, planning and the launch path
  (`gg._call`), i.e. what every call cost before the fast path;
- the fast path's parts, each timed alone on the same objects: guard check (one C++ call that
  checks type, dtype, device, shape and strides of all 5G tensors), data pointer reads, pointer
  table lookup, current stream, context check (cuCtxGetCurrent), capture check
  (cuStreamIsCapturing), table readiness, per-stream workspace lookup, parameter patch
  (per-thread slot, 4 table addresses, stream), cuLaunchKernelEx;
- the full path's extra parts: input checks (check_inputs), kernel selection, plan lookup, and
  the old per-call workspace `torch.empty`.

--mock runs everything but the GPU on a machine without one: CPU tensors, the real manifest
entry (its ABI), and a do-nothing libcuda.so.1 (compiled here with gcc, so cuda.bindings' own
per-call cost is included) or, without gcc, Python stand-ins for the four driver calls. It
measures all host work except what the driver itself does in cuCtxGetCurrent,
cuStreamIsCapturing and cuLaunchKernelEx; add those from a GPU run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GOAL_US = 10.0
SETS = {2: "tiny2_any_m", 8: "tiny8_any_m"}
M = 8

FAKE_LIBCUDA = r"""
/* A do-nothing libcuda.so.1: cuda.bindings resolves entry points through cuGetProcAddress. */
#define _GNU_SOURCE
#include <dlfcn.h>
typedef int CUresult;
static void *self_handle(void) {
  static void *h = 0;
  if (!h) {
    Dl_info i;
    dladdr((void *)self_handle, &i);
    h = dlopen(i.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  }
  return h;
}
CUresult cuInit(unsigned f) { (void)f; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, int *st) {
  (void)v; (void)f; *p = dlsym(self_handle(), s); if (st) *st = *p ? 0 : 1; return *p ? 0 : 500;
}
CUresult cuGetProcAddress(const char *s, void **p, int v, unsigned long long f) {
  return cuGetProcAddress_v2(s, p, v, f, 0);
}
CUresult cuGetErrorName(int e, const char **s) { (void)e; *s = "CUDA_ERROR_FAKE"; return 0; }
CUresult cuCtxGetCurrent(void **c) { *c = (void *)0x1000; return 0; }
CUresult cuCtxSetCurrent(void *c) { (void)c; return 0; }
CUresult cuStreamIsCapturing(void *s, int *st) { (void)s; *st = 0; return 0; }
CUresult cuLaunchKernelEx(const void *c, void *f, void **p, void **e) {
  (void)c; (void)f; (void)p; (void)e; return 0;
}
"""


def per_call_us(fn: Callable[[], object], batch: int, batches: int,
                sync: Callable[[], object] | None = None) -> float:
    """Median over batches of host microseconds per call of `fn` (loop included)."""
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter_ns() - t0) / batch / 1e3)
        if sync is not None:
            sync()
    return statistics.median(samples)


# --------------------------------------------------------------------------------------------
# problems
# --------------------------------------------------------------------------------------------


def make_args(shapes, device: str, seed: int):
    import torch

    from runtime.nvfp4 import EXACT_DATA, make_grouped_problem

    prob = make_grouped_problem(shapes, seed=seed, device=device, **EXACT_DATA)
    out = [torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
           for m, n, _ in shapes]
    return prob.a, prob.b, prob.sfa, prob.sfb, out


def entry_for(gg, count: int, arch: str):
    """The kernel and shapes used for G = count: the tiny set, else the smallest match."""
    from runtime.dispatch import dynamic_groups, exact_groups

    cands = []
    for e in gg.kernels:
        if e.arch != arch:
            continue
        dyn = dynamic_groups(e)
        shapes = (tuple((M, n, k) for n, k in dyn[0]) if dyn is not None else exact_groups(e))
        if len(shapes) == count:
            cands.append((e.set != SETS[count], sum(m * n * k for m, n, k in shapes), e, shapes))
    if not cands:
        raise SystemExit(f"no {arch} kernel with {count} groups in the artifacts")
    _, _, e, shapes = min(cands, key=lambda c: c[:2])
    return e, shapes


# --------------------------------------------------------------------------------------------
# the measurement, shared by the GPU and mock modes
# --------------------------------------------------------------------------------------------


def measure(gg, rt, args, batch: int, batches: int, sync, real_launch: bool) -> dict:
    """Host cost rows for one problem whose fast path is already warm."""
    import torch

    from runtime import api
    from runtime.validate import _fast, check_inputs

    a, b, sfa, sfb, out = args
    count = len(a)
    tensors = (*a, *b, *sfa, *sfb, *out)
    sig = gg._signatures[(count, False)][0]  # (group count, alpha given)
    dp = sig.dp
    assert sig.guard.check(*tensors), "the fast path's signature does not match this call"
    ptrs = tuple(map(api._DATA_PTR, tensors))
    ordinal = rt.device.ordinal
    stream = rt._stream(ordinal)
    table = rt._pointers.get((dp.serial, ptrs))
    assert table is not None, "no cached pointer table: the fast path would not be taken"
    slot = dp.slot()
    device = rt.torch_device
    from runtime import device as device_mod

    drv = device_mod.driver

    def t(fn):
        return per_call_us(fn, batch, batches, sync)

    empty = t(lambda: None)
    rows = {}

    def row(key, fn):
        rows[key] = max(0.0, t(fn) - empty)

    row("total", lambda: gg.grouped_gemm(a, b, sfa, sfb, out=out))
    bound = gg.bind(a, b, sfa, sfb, out)
    bound()  # builds nothing new: the fast path's pointer table is the same (dp, pointers)
    row("bound", bound)
    if real_launch:
        row("full_path", lambda: gg._call(a, b, sfa, sfb, out))
    row("guard", lambda: sig.guard.check(*(*a, *b, *sfa, *sfb, *out)))
    row("data_ptrs", lambda: tuple(map(api._DATA_PTR, tensors)))
    last = dp.last
    assert last is not None and last[0] == ptrs
    row("pointer_lookup", lambda: dp.last[0] == ptrs)
    row("pointer_lru", lambda: rt._pointers.get((dp.serial, ptrs)))
    row("stream", lambda: rt._stream(ordinal))
    row("context", rt._enter)
    row("capture_check", lambda: rt._capturing(stream))
    row("tables_ready", lambda: (table.ready_on(stream, device),
                                 dp.eager_tables(device, stream)))
    row("workspace", lambda: rt._workspace(stream, dp.workspace_bytes, dp.workspace_header))

    tab = dp.eager_tables(device, stream)
    ws = rt._workspace(stream, dp.workspace_bytes, dp.workspace_header)

    def patch():  # what a repeated launch does: compare, nothing to rewrite
        s = dp.slot()
        s.set(table.address, tab.address, dp.plan.cta_prefix_offset, ws[2], ws[2],
              tab.address + dp.plan.ones_offset)
        if s.stream != stream:
            s.config.hStream = stream

    row("params", patch)
    row("params_rewrite", lambda: slot.params.set_tables(
        table.address, tab.address, tab.address + dp.plan.cta_prefix_offset, ws[2], ws[2],
        tab.address + dp.plan.ones_offset))
    row("launch", lambda: drv.cuLaunchKernelEx(slot.config, dp.function,
                                               slot.params.kernel_params, 0))
    # Full path only.
    if real_launch:
        row("check_inputs", lambda: check_inputs(a, b, sfa, sfb, out))
    else:  # the CPU stand-in: the same one-pass checks without the device test
        row("check_inputs", lambda: _fast(a, b, sfa, sfb, out, cuda=False))
    shapes = tuple((x.shape[0], y.shape[0], 2 * x.shape[1]) for x, y in zip(a, b, strict=True))
    row("select", lambda: gg.index.select(shapes, rt.arch, rt.label))
    row("plan", lambda: rt._plans.get((dp.plan.entry.name, shapes)))
    row("workspace_alloc_old",
        lambda: torch.empty(dp.workspace_bytes, dtype=torch.uint8, device=device))
    rows["empty_call"] = empty
    parts = ("guard", "data_ptrs", "pointer_lookup", "stream", "context", "capture_check",
             "tables_ready", "workspace", "params", "launch")
    rows["sum_of_parts"] = sum(rows[k] for k in parts)
    return rows


def measure_dynamic(gg, nk: tuple[tuple[int, int], ...], device: str, batch: int,
                    batches: int, sync) -> float:
    """Host us per call when every call brings a new m vector (MoE serving with a dynamic-m
    kernel): new plan, new pointer table, one upload per call. m in 0..64 per group, row
    prefixes of fixed buffers, `out` given; the vectors never repeat within the run."""
    import random

    from runtime.formats import blocked_scale_numel

    top = 64
    full = [(top, n, k) for n, k in nk]
    a, b, sfa, sfb, out = make_args(full, device, seed=11)
    rng = random.Random(0)
    seen, calls = set(), []
    while len(calls) < batch * batches:
        ms = tuple(rng.randint(0, top) for _ in nk)
        if ms in seen or not any(ms):
            continue
        seen.add(ms)
        calls.append(([t[:m] for t, m in zip(a, ms, strict=True)], b,
                      [t.view(-1)[:blocked_scale_numel(m, k)]
                       for t, m, (_, k) in zip(sfa, ms, nk, strict=True)], sfb,
                      [t[:m] for t, m in zip(out, ms, strict=True)]))
    it = iter(calls)
    del seen

    def one():
        x = next(it)
        gg.grouped_gemm(x[0], x[1], x[2], x[3], out=x[4])

    # The prebuilt calls are tens of thousands of live objects that a serving process would
    # not hold: keep the collector from scanning them inside the timed loop.
    gc.collect()
    gc.freeze()
    try:
        return per_call_us(one, batch, batches, sync)
    finally:
        gc.unfreeze()


LABELS = [
    ("total", "TOTAL grouped_gemm(out=...) (fast path)"),
    ("bound", "TOTAL bound call (gg.bind(...) once, then bound())"),
    ("full_path", "  for comparison: full path (validate, select, plan, launch)"),
    ("guard", "  guard check, 5G tensors (C++)"),
    ("data_ptrs", "  data_ptr reads, 5G tensors"),
    ("pointer_lookup", "  pointer table: same pointers as the last launch"),
    ("stream", "  current stream"),
    ("context", "  context check (cuCtxGetCurrent)"),
    ("capture_check", "  capture check (cuStreamIsCapturing)"),
    ("tables_ready", "  tables ready on this stream"),
    ("workspace", "  per-stream workspace lookup"),
    ("params", "  parameter slot (repeat: addresses and stream unchanged)"),
    ("launch", "  cuLaunchKernelEx"),
    ("sum_of_parts", "  sum of the parts above"),
    ("pointer_lru", "  (other pointers than the last launch: LRU lookup instead)"),
    ("params_rewrite", "  (a changed pointer set rewrites 4 addresses: +this)"),
    ("check_inputs", "  full path only: input checks"),
    ("select", "  full path only: kernel selection"),
    ("plan", "  full path only: plan lookup"),
    ("workspace_alloc_old", "  before: workspace torch.empty per call"),
    ("empty_call", "  (subtracted from every row: empty call in the loop)"),
    ("dynamic_new_m", "dynamic m: a new m vector every call (plan + 1 upload + launch)"),
]


def print_rows(results: dict[int, dict], title: str) -> None:
    counts = sorted(results)
    print(f"\n{title}")
    print(f"{'us per call':60s}" + "".join(f"{'G = ' + str(g):>10s}" for g in counts))
    for key, label in LABELS:
        if all(key in results[g] for g in counts):
            print(f"{label:60s}" + "".join(f"{results[g][key]:10.2f}" for g in counts))


# --------------------------------------------------------------------------------------------
# GPU mode
# --------------------------------------------------------------------------------------------


def run_gpu(args) -> dict:
    import torch

    import runtime
    from runtime.dispatch import dynamic_groups

    gg = runtime.load(args.artifacts)
    rt = gg.device_runtime(torch.cuda.current_device())
    results, meta = {}, {}
    for count in (2, 8):
        e, shapes = entry_for(gg, count, rt.arch)
        call = make_args(shapes, "cuda", seed=count)
        expect = gg.grouped_gemm(*call[:4])
        for _ in range(5):  # plan, signature, pointer table: the fast path from the 3rd call
            gg.grouped_gemm(*call[:4], out=call[4])
        torch.cuda.synchronize()
        assert all(torch.equal(o, x) for o, x in zip(call[4], expect, strict=True))
        results[count] = measure(gg, rt, call, args.batch, args.batches,
                                 torch.cuda.synchronize, real_launch=True)
        dyn = dynamic_groups(e)
        if dyn is not None:
            results[count]["dynamic_new_m"] = measure_dynamic(
                gg, dyn[0], "cuda", args.batch, args.batches, torch.cuda.synchronize) \
                - results[count]["empty_call"]
        torch.cuda.synchronize()
        meta[count] = {"kernel": e.name, "shapes": shapes}
        print(f"G = {count}: {e.name}, (m, n, k) = {shapes[0]} x {count}")
    print_rows(results, f"host cost, {torch.cuda.get_device_name()}, torch {torch.__version__}"
                        f", batches of {args.batch}")
    for count in (2, 8):
        for key, what in (("total", "grouped_gemm"), ("bound", "bound call")):
            took = results[count][key]
            print(f"G = {count}, {what}: {took:.2f} us per call: goal <= {GOAL_US:.0f} us "
                  f"{'met' if took <= GOAL_US else 'NOT met'}")
    return {"results": results, "meta": meta, "device": torch.cuda.get_device_name()}


# --------------------------------------------------------------------------------------------
# mock mode (no GPU)
# --------------------------------------------------------------------------------------------


def build_fake_libcuda() -> Path | None:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None
    d = Path(tempfile.mkdtemp(prefix="fake_libcuda_"))
    (d / "fake.c").write_text(FAKE_LIBCUDA)
    res = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(d / "libcuda.so.1"),
                          str(d / "fake.c"), "-ldl"], capture_output=True, text=True,
                         check=False)
    return d if res.returncode == 0 else None


class PyDriver:
    """Python stand-ins for the driver calls of the launch path (when no fake libcuda)."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        self.CUresult, self.CUcontext = driver.CUresult, driver.CUcontext
        self._ok = (driver.CUresult.CUDA_SUCCESS,)
        self._ctx = (driver.CUresult.CUDA_SUCCESS, driver.CUcontext(0x1000))
        self._cap = (driver.CUresult.CUDA_SUCCESS,
                     driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)

    def cuCtxGetCurrent(self):
        return self._ctx

    def cuCtxSetCurrent(self, ctx):
        return self._ok

    def cuStreamIsCapturing(self, stream):
        return self._cap

    def cuLaunchKernelEx(self, config, f, params, extra):
        return self._ok


def run_mock(args) -> dict:
    import torch
    from cuda.bindings import driver

    import runtime
    from runtime import api, device_tables
    from runtime import device as device_mod
    from runtime import launch as launch_mod
    from runtime.dispatch import dynamic_groups
    from runtime.validate import _fast

    if os.environ.get("NVFP4_FAKE_LIBCUDA"):
        driver_kind = "cuda.bindings over a do-nothing libcuda.so.1 (bindings cost included)"
        driver.cuInit(0)
    else:
        device_mod.driver = pydrv = PyDriver()

        def launch_stub(function, config, stream, kernel_params):
            config.hStream = stream
            pydrv.cuLaunchKernelEx(config, function, kernel_params, 0)

        launch_mod.launch = launch_stub  # the runtime's one launch point
        driver_kind = "Python stand-ins (no gcc: cuda.bindings cost NOT included)"
    gg = runtime.load(args.artifacts)
    rt = object.__new__(device_mod.DeviceRuntime)
    rt.device = types.SimpleNamespace(ordinal=0, context=driver.CUcontext(0x1000), sm_count=132)
    rt.torch_device = torch.device("cpu")
    rt.arch, rt.label = "sm_90a", "cpu (mock)"
    rt._plans = device_tables.LruCache(device_mod.PLAN_CACHE)
    rt._pointers = device_tables.LruCache(device_mod.POINTER_CACHE)
    rt._lock = threading.Lock()
    rt._workspaces = {}
    rt._stream = lambda ordinal: 7  # the real getter is torch._C._cuda_getCurrentRawStream
    rt._prepared = {}
    gg._runtimes[0] = rt

    def cpu_upload(image: bytes, device, stream: int):  # no pinned memory, copy or event here
        t = torch.frombuffer(bytearray(image), dtype=torch.uint8)
        return device_tables.DeviceTable(t, t, None, stream)

    device_tables.upload = cpu_upload

    def cpu_check_inputs(*call):  # the one-pass checks without the device test
        shapes, _, ptrs = _fast(*call, cuda=False)
        return shapes, 0, ptrs

    api.check_inputs = cpu_check_inputs
    guard_type = api.tensor_guard_type()
    if guard_type is None:
        raise SystemExit("this torch has no usable TensorGuards: the fast path is off")
    results, meta = {}, {}
    for count in (2, 8):
        e, shapes = entry_for(gg, count, "sm_90a")
        call = make_args(shapes, "cpu", seed=count)
        tensors = (*call[0], *call[1], *call[2], *call[3], *call[4])
        prepared = device_mod.PreparedKernel(
            loaded=types.SimpleNamespace(function=driver.CUfunction(0x5000)),
            templates={p.name: bytes(128) for p in e.params if p.kind == "tma_template"})
        rt._prepared[e.name] = prepared
        dp = device_mod.DevicePlan(runtime.plan.make_plan(e, shapes, 132), prepared)
        rt._plans.put((e.name, shapes), dp)

        def table(nbytes: int):
            t = torch.empty(max(nbytes, 1), dtype=torch.uint8)
            return device_tables.DeviceTable(t, t, None, 7)

        dp.tables = table(len(dp.plan.plan_tables))
        ptrs = tuple(map(api._DATA_PTR, tensors))
        rt._pointers.put((dp.serial, ptrs), table(8 * len(ptrs)))
        gg._signatures[(count, False)] = (api._Signature(
            guard_type(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None), rt, dp),)
        for _ in range(3):
            gg.grouped_gemm(*call[:4], out=call[4])  # the fast path, end to end
        results[count] = measure(gg, rt, call, args.batch, args.batches, None,
                                 real_launch=False)
        dyn = dynamic_groups(e)
        if dyn is not None:
            results[count]["dynamic_new_m"] = measure_dynamic(
                gg, dyn[0], "cpu", args.batch, args.batches, None) - results[count]["empty_call"]
        meta[count] = {"kernel": e.name, "shapes": shapes}
    print(f"mock run on {os.uname().nodename} ({os.cpu_count()} CPUs), torch "
          f"{torch.__version__}; driver: {driver_kind}")
    print_rows(results, "host cost without a GPU (driver work excluded), batches of "
                        f"{args.batch}")
    print("Not included: the driver's own work in cuCtxGetCurrent, cuStreamIsCapturing and "
          "cuLaunchKernelEx; the real current-stream getter (here a Python lambda); input "
          "checks' device tests; for dynamic m, the pinned staging buffer, H2D copy and event "
          "of the one upload per call.")
    return {"results": results, "meta": meta, "driver": driver_kind}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--mock", action="store_true", help="no GPU: fake driver, CPU tensors")
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.mock and not os.environ.get("NVFP4_FAKE_LIBCUDA") \
            and not os.environ.get("NVFP4_NO_FAKE_LIBCUDA"):
        lib = build_fake_libcuda()
        if lib is not None:  # re-run with the fake driver first on the loader's path
            env = dict(os.environ, NVFP4_FAKE_LIBCUDA="1", LD_LIBRARY_PATH=os.pathsep.join(
                filter(None, [str(lib), os.environ.get("LD_LIBRARY_PATH")])))
            try:
                return subprocess.run([sys.executable, *sys.argv], env=env,
                                      check=False).returncode
            finally:
                shutil.rmtree(lib, ignore_errors=True)
    report = run_mock(args) if args.mock else run_gpu(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
