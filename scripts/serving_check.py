"""GPU check of gg.scaled_grouped_mm (issue 26, the serving contract), bit for bit.

    PYTHONPATH=. python scripts/serving_check.py --artifacts artifacts

For every dynamic-m kernel whose groups are E identical (N, K) (an expert layer), and each
output type built: routings with empty experts, skewed counts and all tokens on one expert, at a
decode-sized and a prefill-sized T; tokens laid out as torch's 2D x 3D contract (rows grouped by
expert, A scales padded to 128 rows per expert); a power-of-two alpha per expert (exact). The
output rows of every expert must equal the float64 reference rounded to the output type, and the
rows past offs[-1] must keep their poison. Then one CUDA graph is captured once and replayed with
10 new routings written into the same a, sfa and offs buffers; every replay must be exact. An
eager call runs under torch.cuda.set_sync_debug_mode("error"). Decreasing and out-of-range offs
must not fault (clamped). A short table comes last.
"""

from __future__ import annotations

import argparse
import faulthandler
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import runtime
from runtime.dispatch import dynamic_groups
from runtime.formats import scale_cols
from runtime.nvfp4 import EXACT_DATA, make_grouped_problem, reference_grouped_gemm
from runtime.serving import sfa_rows_needed
from runtime.validate import OUT_TORCH_DTYPES


def routing(rng: random.Random, t: int, e: int, kind: str) -> list[int]:
    """Token counts per expert summing to at most t (the rest are padding rows)."""
    if kind == "one":
        counts = [0] * e
        counts[rng.randrange(e)] = t
        return counts
    weights = [rng.random() ** 4 if kind == "skewed" else rng.random() for _ in range(e)]
    for i in rng.sample(range(e), max(1, e // 4)):
        weights[i] = 0.0  # empty experts
    total = sum(weights) or 1.0
    used = t - rng.randrange(0, max(1, t // 8))  # leave some padding rows
    counts = [int(used * w / total) for w in weights]
    return counts


class Layer:
    """Stacked expert weights and one step's tokens, in the serving layout."""

    def __init__(self, e: int, n: int, k: int, t: int, dev: str) -> None:
        self.e, self.n, self.k, self.t = e, n, k, t
        w = make_grouped_problem([(1, n, k)] * e, seed=11, device=dev, **EXACT_DATA)
        self.b_list, self.sfb_list = w.b, w.sfb
        self.b = torch.stack([x.view(torch.uint8) for x in w.b])
        self.sfb = torch.stack([x.view(torch.uint8).reshape(-1) for x in w.sfb])
        self.a = torch.zeros(t, k // 2, dtype=torch.uint8, device=dev)
        self.sfa = torch.zeros(sfa_rows_needed(t, e) * scale_cols(k), dtype=torch.uint8,
                               device=dev)
        self.offs = torch.zeros(e, dtype=torch.int32, device=dev)

    def load(self, counts: list[int], seed: int) -> tuple:
        """Write one step's tokens into the buffers in place; returns its reference inputs."""
        shapes = [(m, self.n, self.k) for m in counts]
        p = make_grouped_problem(shapes, seed=seed, device=self.a.device, **EXACT_DATA)
        self.a.zero_()
        self.sfa.zero_()
        row = srow = 0
        cols = scale_cols(self.k)
        for x, s, m in zip(p.a, p.sfa, counts):
            self.a[row:row + m] = x.view(torch.uint8)
            n_s = s.numel()
            self.sfa[srow * cols:srow * cols + n_s] = s.view(torch.uint8).reshape(-1)
            row += m
            srow += -(-m // 128) * 128
        ends = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
        self.offs.copy_(ends)
        return p.a, p.sfa, shapes


def check_out(layer: Layer, out: torch.Tensor, ref_in: tuple, alpha: list | None,
              dtype: torch.dtype) -> str | None:
    a_list, sfa_list, shapes = ref_in
    ref = reference_grouped_gemm(a_list, layer.b_list, sfa_list, layer.sfb_list, shapes,
                                 alpha=alpha, out_dtype=dtype)
    row = 0
    for g, (r, (m, _, _)) in enumerate(zip(ref, shapes)):
        if not torch.equal(out[row:row + m], r):
            return f"expert {g} (m = {m}) differs"
        row += m
    if not torch.isnan(out[row:].float()).all():
        return f"rows {row}..{layer.t} past offs[-1] were written"
    return None


def check_kernel(gg: runtime.GroupedGemm, entry, rng: random.Random, reps: int) -> list:
    nk, max_m = dynamic_groups(entry)
    e, (n, k) = len(nk), nk[0]
    dtype = OUT_TORCH_DTYPES[entry.out_dtype]
    rows = []
    for t in (64, 2048 if max_m is None else min(2048, max_m)):
        layer = Layer(e, n, k, t, "cuda")
        alpha_vals = [2.0 ** (g % 3 - 1) for g in range(e)]
        alpha = torch.tensor(alpha_vals, device="cuda")
        out = torch.full((t, n), float("nan"), dtype=dtype, device="cuda")
        problems = []
        for i, kind in enumerate(("uniform", "skewed", "one")):
            counts = routing(rng, t, e, kind)
            ref_in = layer.load(counts, seed=100 + i)
            out.fill_(float("nan"))
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs,
                                     alpha=alpha, out=out)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
            bad = check_out(layer, out, ref_in, alpha_vals, dtype)
            problems.append(f"eager {kind} T={t}: {bad}" if bad else None)
        # One graph, captured once, replayed with new routings written in place.
        layer.load(routing(rng, t, e, "uniform"), seed=200)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs,
                                 alpha=alpha, out=out)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs,
                                 alpha=alpha, out=out)
        for i in range(reps):
            counts = routing(rng, t, e, ("uniform", "skewed", "one")[i % 3])
            ref_in = layer.load(counts, seed=300 + i)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            bad = check_out(layer, out, ref_in, alpha_vals, dtype)
            problems.append(f"replay {i} T={t}: {bad}" if bad else None)
        # Bad offs: decreasing and past T. Clamped: no fault, nothing outside a / out touched.
        layer.offs.copy_(torch.tensor([t * 3 if g % 2 else t // 2 for g in range(e)],
                                      dtype=torch.int32))
        gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs, alpha=alpha,
                             out=out)
        torch.cuda.synchronize()
        # Host time per eager call (new routing each call, outputs given).
        times = []
        for _ in range(20):
            layer.offs.copy_(torch.tensor(routing(rng, t, e, "skewed"),
                                          dtype=torch.int64).cumsum(0).to(torch.int32))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs,
                                 alpha=alpha, out=out)
            times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        host_us = sorted(times)[len(times) // 2]
        failed = [p for p in problems if p]
        rows.append({"kernel": entry.name, "t": t, "checks": len(problems),
                     "failed": failed, "host_us": host_us})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--watchdog", type=float, default=0,
                    help="dump every thread's stack and exit after this many seconds")
    args = ap.parse_args()
    if args.watchdog:
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
    gg = runtime.load(args.artifacts)
    arch = gg.device_runtime(torch.cuda.current_device()).arch
    rng = random.Random(7)
    rows = []
    for entry in gg.kernels:
        dyn = dynamic_groups(entry)
        if (entry.arch != arch or dyn is None or len(set(dyn[0])) != 1 or len(dyn[0]) < 2
                or (args.only and entry.name not in args.only)):
            continue
        print(f"{entry.name} ...", flush=True)
        try:
            rows += check_kernel(gg, entry, rng, args.reps)
        except Exception as exc:
            rows.append({"kernel": entry.name, "t": 0, "checks": 0,
                         "failed": [f"{type(exc).__name__}: {exc}"], "host_us": 0.0})
        for r in rows[-2:]:
            for f in r["failed"][:3]:
                print(f"  {r['kernel']} T={r['t']}: {f}")
        sys.stdout.flush()
    print(f"\n{'kernel':36s} {'T':>5s} {'checks':>6s} {'host us':>8s}  result")
    for r in rows:
        print(f"{r['kernel']:36s} {r['t']:5d} {r['checks']:6d} {r['host_us']:8.1f}  "
              f"{'ok' if not r['failed'] else 'FAIL'}")
    ok = rows and all(not r["failed"] for r in rows)
    print(f"{sum(not r['failed'] for r in rows)}/{len(rows)} ok")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
