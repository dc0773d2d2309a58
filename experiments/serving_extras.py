"""GPU checks of the serving contract's remaining claims (issue 26), on the H200:
1. torch.ops.nvfp4.scaled_grouped_mm under torch.compile(fullgraph=True), default and
   "reduce-overhead" modes, new routing written into the same buffers every call: each output
   equal to the eager gg.scaled_grouped_mm on the same inputs;
2. runtime.compat.scaled_grouped_mm (torch's NVFP4 signature) equal to gg.scaled_grouped_mm with
   alpha = global_a * global_b;
3. host us per eager call at E = 128 and 256, new routing every call (a device-side copy into
   offs before each call): back to back, and isolated (a sync before each call).

    PYTHONPATH=. python experiments/serving_extras.py --artifacts artifacts
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offsets_quick import Layer, routing

import runtime
import runtime.torch_op as op
from runtime import compat
from runtime.dispatch import dynamic_groups


def layer_for(gg, name: str, t: int) -> Layer:
    e = next(x for x in gg.kernels if x.name == name)
    nk, _ = dynamic_groups(e)
    return Layer(len(nk), nk[0][0], nk[0][1], t, seed=5)


def valid_rows(layer: Layer) -> int:
    return int(layer.offs[-1].item())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default="artifacts")
    args = ap.parse_args()
    gg = runtime.load(args.artifacts)
    op.register(gg, "default")
    compat.use(gg)
    rng = random.Random(9)
    results = []

    # 1. torch.compile, default and reduce-overhead
    layer = layer_for(gg, "qwen3_30b_down.sm_90a.acc1.bf16", 512)
    alpha = torch.tensor([2.0 ** (g % 3 - 1) for g in range(layer.e)], device="cuda")

    def moe(a, b, sfa, sfb, offs, alpha):
        return torch.ops.nvfp4.scaled_grouped_mm(a, b, sfa, sfb, offs, "default", alpha,
                                                 torch.bfloat16) * 2.0

    for mode in ("default", "reduce-overhead"):
        f = torch.compile(moe, fullgraph=True, mode=mode)
        ok = True
        try:
            for i in range(6):
                layer.load(routing(rng, layer.t, layer.e, ("uniform", "skewed", "one")[i % 3]))
                got = f(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs, alpha).clone()
                want = gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs,
                                            alpha=alpha) * 2.0
                rows = valid_rows(layer)
                ok &= torch.equal(got[:rows], want[:rows])
            results.append((f"torch.compile fullgraph {mode}, 6 routings", "ok" if ok
                            else "MISMATCH"))
        except Exception as exc:
            results.append((f"torch.compile fullgraph {mode}",
                             f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
        torch._dynamo.reset()

    # 2. runtime.compat (torch's signature, NVFP4 form)
    from torch.nn.functional import ScalingType, SwizzleType

    ga = torch.tensor(0.5, device="cuda")
    gb = torch.tensor([2.0 ** (g % 4 - 2) for g in range(layer.e)], device="cuda")
    layer.load(routing(rng, layer.t, layer.e, "skewed"))
    recipe = [ScalingType.BlockWise1x16, ScalingType.TensorWise]
    try:
        got = compat.scaled_grouped_mm(
            layer.a.view(torch.float4_e2m1fn_x2),
            layer.b.view(torch.float4_e2m1fn_x2).transpose(-2, -1),
            [layer.sfa.view(torch.float8_e4m3fn), ga], recipe,
            [layer.sfb.view(torch.float8_e4m3fn), gb], recipe,
            swizzle_a=SwizzleType.SWIZZLE_32_4_4, swizzle_b=SwizzleType.SWIZZLE_32_4_4,
            offs=layer.offs, output_dtype=torch.bfloat16)
        want = gg.scaled_grouped_mm(layer.a, layer.b, layer.sfa, layer.sfb, layer.offs,
                                    alpha=(ga * gb).contiguous())
        rows = valid_rows(layer)
        results.append(("runtime.compat.scaled_grouped_mm == gg.scaled_grouped_mm",
                        "ok" if torch.equal(got[:rows], want[:rows]) else "MISMATCH"))
    except Exception as exc:
        results.append(("runtime.compat", f"FAILED {type(exc).__name__}: {exc}"[:200]))

    # 3. host us per eager call, new routing every call
    for name, t in (("qwen3_30b_down.sm_90a.acc1.bf16", 4096),
                    ("dsv3_down_e256.sm_90a.acc1.bf16", 4096)):
        layer = layer_for(gg, name, t)
        alpha = torch.ones(layer.e, device="cuda")
        out = torch.empty(t, layer.n, dtype=torch.bfloat16, device="cuda")
        routes = [torch.tensor(routing(rng, t, layer.e, "skewed"), dtype=torch.int64)
                  .cumsum(0).to(torch.int32).cuda() for _ in range(16)]
        layer.load(routing(rng, t, layer.e, "skewed"))
        call = (layer.a, layer.b, layer.sfa, layer.sfb, layer.offs)
        gg.scaled_grouped_mm(*call, alpha=alpha, out=out)  # validated once
        for isolated in (False, True):
            times = []
            torch.cuda.synchronize()
            for i in range(200):
                layer.offs.copy_(routes[i % 16])
                if isolated:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                gg.scaled_grouped_mm(*call, alpha=alpha, out=out)
                times.append((time.perf_counter() - t0) * 1e6)
                if not isolated and i % 20 == 19:
                    torch.cuda.synchronize()  # keep the queue short
            torch.cuda.synchronize()
            results.append((f"host us per call, {name.split('.')[0]} (E = {layer.e}), T = {t}, "
                            f"{'isolated (sync before)' if isolated else 'back to back'}",
                            f"median {statistics.median(times):.1f}, p10 "
                            f"{sorted(times)[20]:.1f}, p90 {sorted(times)[180]:.1f}"))
    print()
    for what, res in results:
        print(f"{what}: {res}")
    return 0 if all(not r.startswith(("FAILED", "MISMATCH")) for _, r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
