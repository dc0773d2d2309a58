"""Quick GPU check of the device-offsets kernels through gg.scaled_grouped_mm (issue 26):
bit-exact against the float64 reference for uniform, skewed (a quarter of the experts empty),
one-expert and all-empty routings at several T; bad offs (no fault, rows past the clamped
ends untouched); one graph captured once, replayed with new routings; host us per eager call;
GPU us per graph replay. Data drawn on the GPU.

    PYTHONPATH=. python experiments/offsets_quick.py --only qwen3_30b_down.sm_90a.acc1.bf16
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

import runtime
from runtime.dispatch import dynamic_groups
from runtime.formats import scale_cols
from runtime.nvfp4 import reference_grouped_gemm, to_blocked
from runtime.serving import sfa_rows_needed
from runtime.validate import OUT_TORCH_DTYPES


def e4m3_pow2(exps: torch.Tensor) -> torch.Tensor:
    return ((exps + 7) << 3).to(torch.uint8)  # e4m3 bits of 2^e, e in -6..8


def rand_operand(rows: int, k: int, lo: int, hi: int, gen: torch.Generator):
    data = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    exps = torch.randint(lo, hi + 1, (rows, k // 16), device="cuda", generator=gen)
    return data, e4m3_pow2(exps)


def routing(rng: random.Random, t: int, e: int, kind: str) -> list[int]:
    if kind == "empty":
        return [0] * e
    if kind == "one":
        counts = [0] * e
        counts[rng.randrange(e)] = t - rng.randrange(0, max(1, t // 8))
        return counts
    w = [rng.random() ** (4 if kind == "skewed" else 1) for _ in range(e)]
    for i in rng.sample(range(e), max(1, e // 4)):
        w[i] = 0.0
    used = t - rng.randrange(0, max(1, t // 8))
    s = sum(w) or 1.0
    return [int(used * x / s) for x in w]


class Layer:
    def __init__(self, e: int, n: int, k: int, t: int, seed: int) -> None:
        self.e, self.n, self.k, self.t = e, n, k, t
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        b, sfb = rand_operand(e * n, k, -6, -3, self.gen)
        self.b = b.view(e, n, k // 2)
        self.sfb_plain = sfb.view(e, n, k // 16)
        self.sfb = torch.stack([to_blocked(self.sfb_plain[g]) for g in range(e)])
        self.a = torch.zeros(t, k // 2, dtype=torch.uint8, device="cuda")
        self.sfa = torch.zeros(sfa_rows_needed(t, e) * scale_cols(k), dtype=torch.uint8,
                               device="cuda")
        self.offs = torch.zeros(e, dtype=torch.int32, device="cuda")

    def load(self, counts: list[int]):
        a, sfa_plain = rand_operand(self.t, self.k, 0, 6, self.gen)
        self.a.copy_(a)
        self.sfa.zero_()
        cols = scale_cols(self.k)
        row = srow = 0
        groups = []
        for g, m in enumerate(counts):
            if m:
                blk = to_blocked(sfa_plain[row:row + m])
                self.sfa[srow * cols:srow * cols + blk.numel()] = blk
                groups.append((g, row, m, blk))
            row += m
            srow += -(-m // 128) * 128
        self.offs.copy_(torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32))
        return groups

    def reference(self, groups, alpha, dtype):
        shapes = [(m, self.n, self.k) for _, _, m, _ in groups]
        return reference_grouped_gemm(
            [self.a[r:r + m] for _, r, m, _ in groups], [self.b[g] for g, _, _, _ in groups],
            [blk for *_, blk in groups], [self.sfb[g] for g, _, _, _ in groups], shapes,
            alpha=[alpha[g] for g, _, _, _ in groups], out_dtype=dtype)


def check(out, layer, groups, ref) -> str | None:
    end = 0
    for (g, r, m, _), want in zip(groups, ref):
        if not torch.equal(out[r:r + m], want):
            bad = (out[r:r + m] != want).sum().item()
            return f"expert {g} (m = {m}): {bad} elements differ"
        end = r + m
    end = max([end] + [r + m for _, r, m, _ in groups])
    if not torch.isnan(out[end:].float()).all():
        return f"rows {end}..{layer.t} past offs[-1] were written"
    return None


def run_entry(gg, entry, ts, reps, graph: bool, rng) -> list[dict]:
    nk, _ = dynamic_groups(entry)
    e, (n, k) = len(nk), nk[0]
    dtype = OUT_TORCH_DTYPES[entry.out_dtype]
    rows = []
    for t in ts:
        layer = Layer(e, n, k, t, seed=t)
        alpha_vals = [2.0 ** (g % 3 - 1) for g in range(e)]
        alpha = torch.tensor(alpha_vals, device="cuda")
        out = torch.full((t, n), float("nan"), dtype=dtype, device="cuda")
        fails, checks = [], 0
        for kind in ("uniform", "skewed", "one", "empty"):
            groups = layer.load(routing(rng, t, e, kind))
            out.fill_(float("nan"))
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs,
                                     alpha=alpha, out=out)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
            bad = check(out, layer, groups, layer.reference(groups, alpha_vals, dtype))
            checks += 1
            if bad:
                fails.append(f"eager {kind}: {bad}")
        # bad offs: decreasing and past T; must not fault; rows past T // 2... untouched
        layer.offs.copy_(torch.tensor([t * 3 if g % 2 else t // 2 for g in range(e)],
                                      dtype=torch.int32))
        out.fill_(float("nan"))
        gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs, alpha=alpha,
                             out=out)
        torch.cuda.synchronize()
        checks += 1
        graph_us = float("nan")
        if graph:
            layer.load(routing(rng, t, e, "uniform"))
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs,
                                     alpha=alpha, out=out)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs,
                                     alpha=alpha, out=out)
            for i in range(reps):
                groups = layer.load(routing(rng, t, e, ("uniform", "skewed", "one")[i % 3]))
                out.fill_(float("nan"))
                g.replay()
                torch.cuda.synchronize()
                bad = check(out, layer, groups, layer.reference(groups, alpha_vals, dtype))
                checks += 1
                if bad:
                    fails.append(f"replay {i}: {bad}")
            # GPU time per replay (skewed routing; inputs stay in L2 here: an upper bound on
            # speed, the model benchmark rotates inputs)
            layer.load(routing(rng, t, e, "skewed"))
            times = []
            for _ in range(30):
                a0, a1 = torch.cuda.Event(True), torch.cuda.Event(True)
                a0.record()
                g.replay()
                a1.record()
                torch.cuda.synchronize()
                times.append(a0.elapsed_time(a1) * 1000)
            graph_us = statistics.median(times)
        # host us per eager call
        torch.cuda.synchronize()
        host = []
        for _ in range(200):
            t0 = time.perf_counter()
            gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs, alpha=alpha,
                                 out=out)
            host.append((time.perf_counter() - t0) * 1e6)
            if len(host) % 50 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        rows.append({"kernel": entry.name, "t": t, "checks": checks, "fails": fails,
                     "host_us": statistics.median(host), "graph_us": graph_us})
        print(f"  {entry.name} T={t}: {checks} checks, {len(fails)} failed "
              f"{fails[:2]}, host {rows[-1]['host_us']:.1f} us, replay {graph_us:.1f} us",
              flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--t", action="append", type=int, default=[])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--no-graph", action="store_true")
    args = ap.parse_args()
    gg = runtime.load(args.artifacts)
    rng = random.Random(3)
    rows = []
    for entry in gg.kernels:
        if entry.name not in args.only:
            continue
        rows += run_entry(gg, entry, args.t or [64, 2048], args.reps, not args.no_graph, rng)
    print(f"\n{'kernel':40s} {'T':>6s} {'checks':>6s} {'host us':>8s} {'replay us':>9s} result")
    for r in rows:
        print(f"{r['kernel']:40s} {r['t']:6d} {r['checks']:6d} {r['host_us']:8.1f} "
              f"{r['graph_us']:9.1f} {'ok' if not r['fails'] else 'FAIL'}")
    ok = bool(rows) and all(not r["fails"] for r in rows)
    print(f"{sum(not r['fails'] for r in rows)}/{len(rows)} ok")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
