"""Every GPU check in one run, for the lent H200 (artifacts are built beforehand, on a CPU machine).

    PYTHONPATH=. python scripts/gpu_checks.py --artifacts artifacts [--seeds 3] [--pytest]
        [--recipe]

For each kernel of the device's arch in the manifest (a dynamic-m kernel gets fresh m per group
and seed, zeros included), a child process (so a hang or a sticky CUDA
error costs one kernel, not the run) draws fresh random inputs per seed (e2m1 codes over the full
range, scales 2^-6..2^6), poisons the outputs with NaN, launches through the runtime in the
kernel's output type (even seeds with a power-of-two alpha per group, odd seeds without) and
compares with the float64 reference (alpha included, rounded to that type) bit for bit.

--recipe (issue 24): the standard NVFP4 recipe on Gaussian data at the four benchmark sets'
shapes, as a real checkpoint is quantized (per-tensor global scale amax / (6 * 448), block
scales near the top of e4m3), through every kernel of those sets with the alpha
quantize_grouped returns: no non-finite output, and every element within the fp32-summation
bound of the float64 reference times alpha. Then, with --pytest, the GPU test suite. A short
table comes last.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.validate import OUT_TORCH_DTYPES


def check_kernel(artifacts: str, name: str, seeds: int) -> dict:
    """Runs in the child: correctness of one kernel over `seeds` fresh problems."""
    import torch

    import runtime
    from runtime.dispatch import dynamic_groups, exact_groups
    from runtime.nvfp4 import check_close, make_grouped_problem, reference_grouped_gemm

    gg = runtime.load(artifacts)
    entry = next(k for k in gg.kernels if k.name == name)
    dyn = dynamic_groups(entry)

    def groups_for(seed: int) -> list[tuple[int, int, int]]:
        """The exact set's shapes, or for a dynamic-m kernel fresh m per group and seed (zeros
        and m not a multiple of 8 included, at least one m > 0)."""
        if dyn is None:
            return list(exact_groups(entry))
        nk, max_m = dyn
        rng = random.Random(seed)
        top = min(max_m or 300, 300)
        ms = [rng.choice([0, 1, 13, rng.randint(0, top)]) for _ in nk]
        ms[rng.randrange(len(ms))] = rng.randint(1, top)
        return [(m, n, k) for m, (n, k) in zip(ms, nk)]

    rows = []
    # Fresh problems per seed with e2m1 codes over the full range and scales spanning 2^-6..2^6,
    # split so that every product is a multiple of 2^-8 and every partial sum stays below
    # 2^16: then fp32 accumulation in ANY order is exact, and a correct kernel's output equals
    # fp16(float64 reference) bit for bit (a rtol/atol check would also pass, more weakly; with
    # 2^-6..2^6 on both sides fp32 rounding of cancelling sums exceeds atol = 1e-3 at K = 7168
    # and |C| overflows fp16). Odd seeds swap which operand carries the large scales. A last
    # problem uses the public benchmark's value set.
    ranges = [((0, 6), (-6, -3)), ((-6, -3), (0, 6))]
    cases = [("full", seed, *ranges[seed % 2]) for seed in range(seeds)]
    cases.append(("benchmark", seeds, (0, 0), None))
    out_dtype = OUT_TORCH_DTYPES[entry.out_dtype]
    for values, seed, exp_a, exp_b in cases:
        groups = groups_for(seed)
        served_by = gg.select(groups, out_dtype=out_dtype).name
        if served_by != name:  # an exact set with these shapes would be preferred
            rows.append({"seed": f"{values}-{seed}", "ok": False, "ms": 0.0,
                         "report": f"shapes {groups} are served by {served_by}, not {name}"})
            continue
        prob = make_grouped_problem(groups, seed=1000 + seed, device="cuda", values=values,
                                    scale_exp=exp_a, scale_exp_b=exp_b)
        outs = [torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
                for m, n, _ in groups]
        # Powers of two keep the product exact: the output must still match bit for bit.
        alphas = [2.0 ** (g % 3 - 1) for g in range(len(groups))] if seed % 2 == 0 else None
        alpha = None if alphas is None else torch.tensor(alphas, device="cuda")
        t0 = time.perf_counter()
        gg.grouped_gemm(prob.a, prob.b, prob.sfa, prob.sfb, out=outs, alpha=alpha)
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t0) * 1e3
        ref = reference_grouped_gemm(prob.a, prob.b, prob.sfa, prob.sfb, groups, alpha=alphas,
                                     out_dtype=out_dtype)
        # rtol = atol = 1e-3 against the reference rounded to the output type: bf16's own
        # rounding (2^-9 relative) is coarser than that tolerance.
        ok, report = check_close(outs, [r.double() for r in ref])
        exact = all(torch.equal(o, r) for o, r in zip(outs, ref))
        ok = ok and exact
        report = (f"{entry.out_dtype}, alpha {'2^-1..2^1' if alphas else 'none'}: bit-exact vs "
                  f"reference: {exact}; " + report)
        if dyn is not None:
            report = f"m = {[g[0] for g in groups]}; " + report
        row = {"seed": f"{values}-{seed}", "ok": ok, "report": report, "ms": first_ms}
        if not ok:
            row["groups"] = [_diagnose(o, r.double()) for o, r in zip(outs, ref)]
        rows.append(row)
    return {"name": name, "ok": all(r["ok"] for r in rows), "rows": rows}


# The four benchmark sets (facts.md): the recipe check's shapes.
RECIPE_SETS = {
    "moe_gateup": [(m, 4096, 7168) for m in (80, 176, 128, 72, 64, 248, 96, 160)],
    "moe_down": [(m, 7168, 2048) for m in (40, 76, 168, 72, 164, 148, 196, 160)],
    "dense_a": [(192, 3072, 4096), (320, 3072, 4096)],
    "dense_b": [(128, 4096, 1536), (384, 4096, 1536)],
}
U_OUT = {"float16": 2.0**-11, "bfloat16": 2.0**-8}  # unit roundoff of the output types


def check_recipe(artifacts: str, name: str, seeds: int) -> dict:
    """Runs in the child: the standard recipe (see the module docstring) through kernel `name`.

    Bound per element: the kernel sums K products in fp32 in some order, so its error is at
    most gamma_K * sum|products| (gamma_K = K u / (1 - K u), u = 2^-24); alpha then scales it
    (one more fp32 rounding) and the cast adds half an ulp of the output type. With S = |A| @
    |B|^T in float64 (the dequantized operands): |out - alpha C| <= alpha gamma_K S
    + (u_out + 2^-23) |alpha C| + the output type's subnormal spacing.
    """
    import torch

    import runtime
    from runtime.nvfp4 import (
        dequantize_nvfp4,
        from_blocked,
        quantize_grouped,
        reference_grouped_gemm,
    )

    gg = runtime.load(artifacts)
    entry = next(k for k in gg.kernels if k.name == name)
    out_dtype = OUT_TORCH_DTYPES[entry.out_dtype]
    groups = RECIPE_SETS[entry.set]
    rows = []
    for seed in range(seeds):
        gen = torch.Generator(device="cuda").manual_seed(2024 + seed)
        xs = [torch.randn(m, k, device="cuda", generator=gen) for m, _, k in groups]
        ws = [torch.randn(n, k, device="cuda", generator=gen) * 0.02 for _, n, k in groups]
        q = quantize_grouped(xs, ws, global_scale=True)
        outs = [torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
                for m, n, _ in groups]
        gg.grouped_gemm(q.a, q.b, q.sfa, q.sfb, out=outs, alpha=q.alpha)
        torch.cuda.synchronize()
        alphas = q.alpha.tolist()
        ref = reference_grouped_gemm(q.a, q.b, q.sfa, q.sfb, groups, alpha=alphas)
        nonfinite, over, worst = 0, 0, 0.0
        for g, ((m, n, k), o, r) in enumerate(zip(groups, outs, ref)):
            a64 = dequantize_nvfp4(q.a[g], from_blocked(q.sfa[g], m, k)).double()
            b64 = dequantize_nvfp4(q.b[g], from_blocked(q.sfb[g], n, k)).double()
            s = a64.abs() @ b64.abs().t()
            gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
            fin = torch.finfo(out_dtype)
            tiny = fin.smallest_normal * fin.eps  # the output type's subnormal spacing
            bound = alphas[g] * gamma * s + (U_OUT[entry.out_dtype] + 2.0**-23) * r.abs() + tiny
            err = (o.double() - r).abs()
            nonfinite += int((~torch.isfinite(o)).sum())
            over += int((err > bound).sum())
            worst = max(worst, float((err / bound).nan_to_num(float("inf")).max()))
        # What a kernel without alpha gave (issue 24): the unscaled product cast to out_dtype.
        unscaled = [(r / a).to(out_dtype) for r, a in zip(ref, alphas)]
        inf_without = sum(int((~torch.isfinite(u)).sum()) for u in unscaled)
        total = sum(m * n for m, n, _ in groups)
        ok = nonfinite == 0 and over == 0
        rows.append({"seed": f"recipe-{seed}", "ok": ok, "ms": 0.0,
                     "report": f"{entry.out_dtype}, alpha ~{alphas[0]:.3g}: non-finite "
                               f"{nonfinite}/{total}, over the fp32 bound {over}, worst "
                               f"err/bound {worst:.3f}; unscaled (no alpha) would give "
                               f"{inf_without} non-finite"})
    return {"name": f"{name} (recipe)", "ok": all(r["ok"] for r in rows), "rows": rows}


def _diagnose(out, ref) -> str:
    """Where a group's output is wrong: NaN count, bad row/col span, max error, sample."""
    import torch

    o = out.double()
    bad = ~torch.isclose(o, ref, rtol=1e-3, atol=1e-3)
    if not bad.any():
        return "ok"
    rows = bad.any(1).nonzero().flatten()
    cols = bad.any(0).nonzero().flatten()
    err = (o - ref).abs().nan_to_num(float("inf"))
    i, j = divmod(int(err.argmax()), out.shape[1])
    return (f"{out.shape}: bad {int(bad.sum())} nan {int(torch.isnan(o).sum())} rows "
            f"{int(rows.min())}..{int(rows.max())} ({len(rows)}) cols {int(cols.min())}.."
            f"{int(cols.max())} ({len(cols)}) worst [{i},{j}] got {float(o[i, j]):.4g} "
            f"want {float(ref[i, j]):.4g}; ratio out/ref median "
            f"{float((o / ref).nan_to_num(0).median()):.4g}")


def run_child(artifacts: str, name: str, seeds: int, timeout: float,
              recipe: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--artifacts", artifacts, "--child", name,
           "--seeds", str(seeds), *(["--recipe"] if recipe else [])]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"name": name, "ok": False, "error": f"timed out after {timeout:.0f} s (hang?)"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-3000:]
        return {"name": name, "ok": False, "error": f"exit {proc.returncode}: {tail}"}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--only", action="append", default=[], help="kernel name (repeatable)")
    ap.add_argument("--pytest", action="store_true", help="also run the GPU test suite")
    ap.add_argument("--recipe", action="store_true",
                    help="also run the standard-recipe check on the benchmark sets' kernels")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        check = check_recipe if args.recipe else check_kernel
        res = check(args.artifacts, args.child, args.seeds)
        print("RESULT " + json.dumps(res))
        return 0

    import torch

    from runtime.manifest import ARCH_CAPABILITY, load_manifest

    cap = torch.cuda.get_device_capability()
    print(f"device: {torch.cuda.get_device_name()} cc {cap}, torch {torch.__version__}")
    manifest = load_manifest(args.artifacts)
    # Device-offsets kernels serve scaled_grouped_mm only: scripts/serving_check.py checks them.
    names = [k.name for k in manifest.sets if ARCH_CAPABILITY[k.arch] == cap
             and not k.takes_offsets and (not args.only or k.name in args.only)]
    jobs = [(name, False) for name in names]
    if args.recipe:
        jobs += [(k.name, True) for k in manifest.sets if k.set in RECIPE_SETS
                 and ARCH_CAPABILITY[k.arch] == cap and k.name in names]
    results = []
    for name, recipe in jobs:
        res = run_child(args.artifacts, name, args.seeds, args.timeout, recipe)
        results.append(res)
        for r in res.get("rows", []):
            print(f"  {name} seed {r['seed']}: {'ok ' if r['ok'] else 'BAD'} {r['report']}")
            for g, d in enumerate(r.get("groups", [])):
                print(f"    group {g}: {d}")
        if "error" in res:
            print(f"  {name}: ERROR {res['error']}")
        sys.stdout.flush()

    rc = 0 if results and all(r["ok"] for r in results) else 1
    if args.pytest:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests"],
                              cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        rc = rc or proc.returncode
    print("\nkernel                                            seeds  result")
    for r in results:
        status = "ok" if r["ok"] else ("ERROR" if "error" in r else "WRONG")
        print(f"{r['name']:50s} {len(r.get('rows', [])):5d}  {status}")
    print(f"{sum(r['ok'] for r in results)}/{len(results)} kernels correct")
    return rc


if __name__ == "__main__":
    sys.exit(main())
