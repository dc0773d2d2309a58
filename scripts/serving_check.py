"""GPU check of gg.scaled_grouped_mm (issue 26, the serving contract), bit for bit.

    PYTHONPATH=. python scripts/serving_check.py --artifacts artifacts [--t 64 --t 2048]
        [--reps 10] [--only KERNEL ...] [--no-graph]

For every dynamic-m kernel whose groups are E identical (N, K) (an expert layer), and each
output type built: routings with empty experts, skewed counts and all tokens on one expert, at
each T of --t (default a small batch of 8, a decode-sized 64 and a prefill-sized 2048, capped
at the set's max_m);
tokens laid out as torch's 2D x 3D contract (rows grouped by expert, A scales padded to 128 rows
per expert); a power-of-two alpha per expert (exact). The output rows of every expert must equal
the float64 reference rounded to the output type, and the rows past offs[-1] must keep their
poison. Then one CUDA graph is captured once and replayed with --reps new routings written into
the same a, sfa and offs buffers; every replay must be exact (--no-graph skips this: under
PYTORCH_NO_CUDA_MEMORY_CACHING=1, as scripts/sanitize_gpu.sh runs, a capture that allocates
fails). An eager call runs under torch.cuda.set_sync_debug_mode("error"). Decreasing and
out-of-range offs must not fault (clamped). A short table comes last.

Data: drawn on the GPU with a CUDA torch.Generator, with the distributions of
runtime.nvfp4.random_nvfp4 under EXACT_DATA (all 16 e2m1 codes uniform; scales 2^e, e uniform in
0..6 for A and -6..-3 for B), so every fp32 partial sum is exact. The weights are drawn once per
layer (E, N, K) and shared by its output types and token counts; the float64 reference is
computed only for the experts that have tokens (E = 256 of (7168, 2048) is 1.9 GB of weights).
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
from runtime.formats import blocked_scale_numel, scale_cols
from runtime.nvfp4 import EXACT_DATA, pack_fp4, reference_grouped_gemm, to_blocked
from runtime.serving import select_serving, sfa_rows_needed
from runtime.validate import OUT_TORCH_DTYPES

SF_VEC = 16
KINDS = ("uniform", "skewed", "one")


def draw_nvfp4(rows: int, k: int, gen: torch.Generator,
               scale_exp: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """runtime.nvfp4.random_nvfp4(values="full") drawn on the generator's device: (packed uint8
    (rows, K/2), plain e4m3 scales (rows, K/16)), codes uniform over all 16 e2m1 codes, scales
    2^e with e uniform in scale_exp (both ends included)."""
    dev = gen.device
    codes = torch.randint(0, 16, (rows, k), dtype=torch.uint8, generator=gen, device=dev)
    exps = torch.randint(scale_exp[0], scale_exp[1] + 1, (rows, k // SF_VEC), generator=gen,
                         device=dev)
    return pack_fp4(codes), torch.pow(2.0, exps.to(torch.float32)).to(torch.float8_e4m3fn)


def padded_blocked_scales(plain: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """torch's 2D x 3D A-scale layout for rows grouped by expert (counts[g] rows for expert g):
    expert g's blocked scales start at row sum_{i<g} round_up(m_i, 128). `plain` holds the
    rows' plain scales (sum(counts), K/16) as uint8; returns the blocked bytes (1-D uint8,
    sum_g round_up(m_g, 128) * scale_cols(K)) on its device: the rows scattered to their padded
    places, then the whole column of 128-row atoms blocked at once (the blocked layout is
    M-block outer, so that is each expert's blocked scales in turn)."""
    padded = [-(-m // 128) * 128 for m in counts]
    starts = [sum(padded[:g]) for g in range(len(counts))]
    dest = torch.cat([torch.arange(s, s + m) for s, m in zip(starts, counts)]
                     + [torch.zeros(0, dtype=torch.int64)])
    out = torch.zeros(sum(padded), plain.shape[1], dtype=torch.uint8, device=plain.device)
    out[dest.to(plain.device)] = plain
    return to_blocked(out) if out.shape[0] else out.reshape(-1)


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


class Weights:
    """One expert layer's stacked weights (E, N, K/2) and blocked scales (E, ...), drawn once."""

    def __init__(self, e: int, n: int, k: int, seed: int = 11, dev: str = "cuda") -> None:
        self.key = (e, n, k)
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.b = torch.empty(e, n, k // 2, dtype=torch.uint8, device=dev)
        self.sfb = torch.empty(e, blocked_scale_numel(n, k), dtype=torch.uint8, device=dev)
        for g in range(e):  # one expert at a time: no multi-GB temporaries
            b, s = draw_nvfp4(n, k, gen, EXACT_DATA["scale_exp_b"])
            self.b[g] = b
            self.sfb[g] = to_blocked(s.view(torch.uint8))


class Layer:
    """One step's tokens in the serving layout over a layer's weights."""

    def __init__(self, w: Weights, t: int) -> None:
        self.w = w
        self.e, self.n, self.k = w.key
        self.t = t
        dev = w.b.device
        self.a = torch.zeros(t, self.k // 2, dtype=torch.uint8, device=dev)
        self.sfa = torch.zeros(sfa_rows_needed(t, self.e) * scale_cols(self.k),
                               dtype=torch.uint8, device=dev)
        self.offs = torch.zeros(self.e, dtype=torch.int32, device=dev)
        self.counts: list[int] = []

    def load(self, counts: list[int], seed: int) -> None:
        """Write one step's tokens (counts[g] rows for expert g) into the buffers in place."""
        used = sum(counts)
        gen = torch.Generator(device=self.a.device).manual_seed(seed)
        a, s = draw_nvfp4(used, self.k, gen, EXACT_DATA["scale_exp"])
        blocked = padded_blocked_scales(s.view(torch.uint8), counts)
        self.a.zero_()
        self.sfa.zero_()
        self.a[:used] = a
        self.sfa[:blocked.numel()] = blocked
        self.offs.copy_(torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32))
        self.counts = list(counts)

    def references(self, alpha: list[float], dtype: torch.dtype):
        """(expert g, m, first row, float64 reference rounded to dtype with alpha[g]) for every
        expert with tokens, in row order."""
        cols = scale_cols(self.k)
        row = srow = 0
        for g, m in enumerate(self.counts):
            if m:
                sfa = self.sfa[srow * cols:(srow + -(-m // 128) * 128) * cols]
                yield g, m, row, reference_grouped_gemm(
                    [self.a[row:row + m]], [self.w.b[g]], [sfa], [self.w.sfb[g]],
                    [(m, self.n, self.k)], alpha=[alpha[g]], out_dtype=dtype)[0]
            row += m
            srow += -(-m // 128) * 128

    def check(self, out: torch.Tensor, alpha: list[float], dtype: torch.dtype) -> str | None:
        """Every expert with tokens against the float64 reference (alpha, rounded to dtype);
        the rows past offs[-1] still NaN."""
        for g, m, row, ref in self.references(alpha, dtype):
            if not torch.equal(out[row:row + m], ref):
                return f"expert {g} (m = {m}) differs"
        row = sum(self.counts)
        if not torch.isnan(out[row:].float()).all():
            return f"rows {row}..{self.t} past offs[-1] were written"
        return None


def repeated_calls(gg: runtime.GroupedGemm, layer: Layer, reps: int):
    """Call scaled_grouped_mm `reps` times on one routing (alpha 1, bf16 out) and yield
    (call, expert, m, first row, got, reference) for every expert result that differs from
    the float64 reference: a race shows as results that differ between identical calls
    (experiments/repeat_check.py, tests/test_repeat_gpu.py)."""
    w = layer.w
    alpha = torch.ones(layer.e, device="cuda")
    out = torch.full((layer.t, layer.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    refs = list(layer.references([1.0] * layer.e, torch.bfloat16))
    for i in range(reps):
        out.fill_(float("nan"))
        gg.scaled_grouped_mm(layer.a, w.b, layer.sfa, w.sfb, layer.offs, alpha=alpha, out=out)
        torch.cuda.synchronize()
        for g, m, r0, ref in refs:
            got = out[r0:r0 + m]
            if not torch.equal(got, ref):
                yield i, g, m, r0, got.clone(), ref


def check_kernel(gg: runtime.GroupedGemm, entry, w: Weights, rng: random.Random,
                 tokens: list[int], reps: int, graph: bool) -> list:
    _, max_m = dynamic_groups(entry)
    e = w.key[0]
    dtype = OUT_TORCH_DTYPES[entry.out_dtype]
    rows = []
    for t in sorted({t if max_m is None else min(t, max_m) for t in tokens}):
        layer = Layer(w, t)
        alpha_vals = [2.0 ** (g % 3 - 1) for g in range(e)]
        alpha = torch.tensor(alpha_vals, device="cuda")
        out = torch.full((t, layer.n), float("nan"), dtype=dtype, device="cuda")

        def call() -> None:
            gg.scaled_grouped_mm(layer.a, w.b, layer.sfa, w.sfb, layer.offs, alpha=alpha,
                                 out=out)

        problems = []
        for i, kind in enumerate(KINDS):
            layer.load(routing(rng, t, e, kind), seed=100 + i)
            out.fill_(float("nan"))
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                call()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
            bad = layer.check(out, alpha_vals, dtype)
            problems.append(f"eager {kind} T={t}: {bad}" if bad else None)
        if graph:
            # One graph, captured once, replayed with new routings written in place.
            layer.load(routing(rng, t, e, "uniform"), seed=200)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                call()
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                call()
            for i in range(reps):
                layer.load(routing(rng, t, e, KINDS[i % 3]), seed=300 + i)
                out.fill_(float("nan"))
                g.replay()
                torch.cuda.synchronize()
                bad = layer.check(out, alpha_vals, dtype)
                problems.append(f"replay {i} T={t}: {bad}" if bad else None)
            del g
        # Bad offs: decreasing and past T. Clamped: no fault, nothing outside a / out touched.
        layer.offs.copy_(torch.tensor([t * 3 if g % 2 else t // 2 for g in range(e)],
                                      dtype=torch.int32))
        call()
        torch.cuda.synchronize()
        # Host time per eager call (new routing each call, outputs given).
        times = []
        for _ in range(20):
            layer.offs.copy_(torch.tensor(routing(rng, t, e, "skewed"),
                                          dtype=torch.int64).cumsum(0).to(torch.int32))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        host_us = sorted(times)[len(times) // 2]
        failed = [p for p in problems if p]
        # The set entry whose kernel ran: another set of the same (E, N, K) with a smaller
        # max_m covering T (a decode kernel) is preferred by scaled_grouped_mm.
        served = select_serving(gg.kernels, entry.arch, e, layer.n, layer.k, t,
                                entry.out_dtype).name
        rows.append({"kernel": entry.name, "t": t, "checks": len(problems),
                     "failed": failed, "host_us": host_us, "served_by": served})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--t", type=int, action="append", default=[], metavar="T",
                    help="tokens (rows of a) per call, repeatable (default: 8, 64 and 2048)")
    ap.add_argument("--reps", type=int, default=10, help="graph replays with new routings")
    ap.add_argument("--only", action="append", default=[], help="kernel name (repeatable)")
    ap.add_argument("--no-graph", action="store_true",
                    help="skip the CUDA-graph capture and replays (eager checks only)")
    ap.add_argument("--watchdog", type=float, default=0,
                    help="dump every thread's stack and exit after this many seconds")
    args = ap.parse_args()
    if any(t <= 0 for t in args.t):
        ap.error(f"--t must be positive, but got {args.t}")
    tokens = args.t or [8, 64, 2048]
    if args.watchdog:
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
    gg = runtime.load(args.artifacts)
    arch = gg.device_runtime(torch.cuda.current_device()).arch
    rng = random.Random(7)
    rows: list[dict] = []
    weights: Weights | None = None
    for entry in gg.kernels:
        dyn = dynamic_groups(entry)
        if (entry.arch != arch or dyn is None or len(set(dyn[0])) != 1 or len(dyn[0]) < 2
                or (args.only and entry.name not in args.only)):
            continue
        print(f"{entry.name} ...", flush=True)
        t0, before = time.perf_counter(), len(rows)
        try:
            key = (len(dyn[0]), *dyn[0][0])
            if weights is None or weights.key != key:
                weights = None  # free the last layer's weights first
                torch.cuda.empty_cache()
                weights = Weights(*key)
            rows += check_kernel(gg, entry, weights, rng, tokens, args.reps, not args.no_graph)
        except Exception as exc:
            rows.append({"kernel": entry.name, "t": 0, "checks": 0,
                         "failed": [f"{type(exc).__name__}: {exc}"], "host_us": 0.0})
        for r in rows[before:]:
            for f in r["failed"][:3]:
                print(f"  {r['kernel']} T={r['t']}: {f}")
        print(f"  {time.perf_counter() - t0:.1f} s", flush=True)
    width = max([36, *(len(r["kernel"]) for r in rows)])
    print(f"\n{'kernel':{width}s} {'T':>5s} {'checks':>6s} {'host us':>8s}  result")
    for r in rows:
        other = r.get("served_by", r["kernel"])
        print(f"{r['kernel']:{width}s} {r['t']:5d} {r['checks']:6d} {r['host_us']:8.1f}  "
              f"{'ok' if not r['failed'] else 'FAIL'}"
              f"{f' (run by {other})' if other != r['kernel'] else ''}")
    ok = rows and all(not r["failed"] for r in rows)
    print(f"{sum(not r['failed'] for r in rows)}/{len(rows)} ok")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
