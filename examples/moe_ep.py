"""Expert-parallel NVFP4 mixture-of-experts layer over torch.distributed (NCCL), checked exactly.

    torchrun --nproc-per-node 2 examples/moe_ep.py --artifacts artifacts --seeds 3
    python examples/moe_ep.py --artifacts artifacts            # one GPU, one rank, unchanged

E experts are split evenly across the ranks. Each rank holds T tokens, already in NVFP4 (as the
previous layer of an NVFP4 model hands them over), routes each token to its top-k experts, and
then runs three phases:
  dispatch  all_to_all_single of the packed token rows and their plain scales to the ranks that
            own the chosen experts
  experts   gate-up GEMM and down GEMM through gg.scaled_grouped_mm (the serving contract):
            the received rows sorted by local expert, one stacked weight tensor per GEMM, and
            the int32 expert end offsets computed on the device (no host copy of the counts;
            runtime.nvfp4.to_blocked_grouped lays out the A scales from them); in between,
            relu(gate) * up in fp32 and requantization to NVFP4 in torch
  combine   all_to_all_single back, then sum over the k routing slots weighted by the router
Communication is torch.distributed's; nothing here is a communication layer of our own.
Each phase is timed in wall-clock after a barrier (so it excludes waiting for the other ranks);
the expert phase also reports the time between CUDA events around the two grouped GEMM calls
(the kernels plus any runtime host work the GPU waits on), since the phase's wall-clock is
mostly the small torch ops of the activation and requantization.

Exactness: inputs and weights use power-of-two block scales, chosen so that every fp32 partial
sum in both GEMMs is exact, and the requantizer also uses power-of-two scales (clamped to
2^-2..2^8). The float64 single-process reference of the same layer therefore yields the same
fp16 values, bit for bit. The check asks for rtol = atol = 1e-3 and also reports exact equality.
The reference uses no communication: every rank can regenerate all weights and all ranks' tokens
from the seed.

The runtime must have expert-set kernels for E / world_size experts of (2F, D) and of (D, F);
see the ep_e* sets in shapes.yaml. NCCL_NVLS_ENABLE=0 is set because NVLink multicast must
stay off on the lent machines.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runtime
from runtime.nvfp4 import (
    SF_VEC,
    _round_to_e2m1_codes,
    fp4_to_float,
    pack_fp4,
    to_blocked,
    to_blocked_grouped,
)

E, D, F, TOP_K = 8, 1024, 512, 2  # experts, hidden, ffn (gate and up are F each), slots


@dataclass
class Nvfp4:
    packed: torch.Tensor  # uint8 (rows, K // 2)
    scales: torch.Tensor  # uint8 e4m3 bytes, plain layout (rows, K // 16)

    def dequant(self) -> torch.Tensor:
        s = self.scales.view(torch.float8_e4m3fn).double().repeat_interleave(SF_VEC, dim=1)
        return fp4_to_float(self.packed).double() * s


def random_nvfp4_pow2(rows: int, k: int, exp: tuple[int, int], gen: torch.Generator,
                      device: torch.device) -> Nvfp4:
    """Full-range e2m1 codes with power-of-two block scales 2^exp[0]..2^exp[1]."""
    codes = torch.randint(0, 16, (rows, k), generator=gen, dtype=torch.uint8)
    e = torch.randint(exp[0], exp[1] + 1, (rows, k // SF_VEC), generator=gen)
    scales = (2.0 ** e.double()).to(torch.float8_e4m3fn).view(torch.uint8)
    return Nvfp4(pack_fp4(codes).to(device), scales.to(device))


def quantize_pow2(x: torch.Tensor, exp_min: int = -2, exp_max: int = 8) -> Nvfp4:
    """NVFP4 with power-of-two block scales 2^ceil(log2(amax / 6)), clamped to the range.

    Deterministic IEEE arithmetic (frexp, float64 division, round-to-nearest-even on the e2m1
    grid), so the same input gives the same bits on any device: the rank path and the reference
    requantize identical fp32 activations identically.
    """
    rows, k = x.shape
    blocks = x.double().reshape(rows, k // SF_VEC, SF_VEC)
    ratio = blocks.abs().amax(dim=-1) / 6.0
    mant, e = torch.frexp(ratio)  # ratio = mant * 2^e, mant in [0.5, 1)
    e = torch.where(mant == 0.5, e - 1, e)  # ceil(log2(ratio)) exactly
    e = torch.where(ratio == 0, torch.full_like(e, exp_min), e).clamp(exp_min, exp_max)
    scale = torch.ldexp(torch.ones_like(ratio), e)
    codes = _round_to_e2m1_codes(blocks / scale[..., None]).reshape(rows, k)
    return Nvfp4(pack_fp4(codes), scale.to(torch.float8_e4m3fn).view(torch.uint8))


@dataclass
class Problem:
    x: Nvfp4  # this rank's tokens (T, D)
    topk_ids: torch.Tensor  # (T, TOP_K) int64 expert ids
    topk_w: torch.Tensor  # (T, TOP_K) float32 routing weights
    w1: list[Nvfp4]  # per expert (2F, D): rows 0..F-1 gate, F..2F-1 up
    w2: list[Nvfp4]  # per expert (D, F)


def make_problem(seed: int, rank: int, tokens: int, device: torch.device) -> Problem:
    """Weights depend on the seed only (identical on every rank); tokens on seed and rank."""
    g = torch.Generator().manual_seed(seed)
    # Gate-up products are multiples of 2^-8 and |sum| <= D * 6 * 1.5 < 2^16: exact in fp32.
    w1 = [random_nvfp4_pow2(2 * F, D, (-4, -2), g, device) for _ in range(E)]
    # Down: activations carry >= 2^-2 scales, weights 2^-6..2^-5: products are multiples of
    # 2^-10 and the sums stay far below 2^14: exact in fp32 (checked in `reference`).
    w2 = [random_nvfp4_pow2(D, F, (-6, -5), g, device) for _ in range(E)]
    gt = torch.Generator().manual_seed(seed * 1000 + rank + 1)
    x = random_nvfp4_pow2(tokens, D, (-2, 0), gt, device)
    logits = torch.randn(tokens, E, generator=gt)
    top = logits.topk(TOP_K, dim=-1)
    weights = torch.softmax(top.values, dim=-1)
    return Problem(x, top.indices.to(device), weights.float().to(device), w1, w2)


def activation(h: torch.Tensor) -> torch.Tensor:
    """relu(gate) * up in fp32: exact, because both factors are fp16 values."""
    gate, up = h[:, :F].float(), h[:, F:].float()
    return torch.relu(gate) * up


def reference(p: Problem) -> torch.Tensor:
    """The layer for this rank's tokens, in float64 with the kernels' fp16 output roundings."""
    x = p.x.dequant()
    out = torch.zeros(x.shape[0], D, dtype=torch.float32, device=x.device)
    for j in range(TOP_K):
        y_slot = torch.empty(x.shape[0], D, dtype=torch.float16, device=x.device)
        for e in range(E):
            rows = (p.topk_ids[:, j] == e).nonzero().flatten()
            if rows.numel() == 0:
                continue
            h = (x[rows] @ p.w1[e].dequant().t()).half()
            a = quantize_pow2(activation(h))
            y = a.dequant() @ p.w2[e].dequant().t()
            assert y.abs().max() < 2**14, "down-proj sums left the exact fp32 range"
            y_slot[rows] = y.half()
        out += p.topk_w[:, j : j + 1] * y_slot.float()
    return out


def timed(fn, timings: dict, key: str):
    # Line the ranks up first, so a phase's time is its own and not the wait for a slower rank.
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    timings[key] = timings.get(key, 0.0) + (time.perf_counter() - t0) * 1e6
    return result


def moe_layer(p: Problem, gg: runtime.GroupedGemm, rank: int, world: int,
              timings: dict) -> torch.Tensor:
    dev = p.x.packed.device
    local = E // world
    tokens = p.x.packed.shape[0]

    def dispatch():
        flat_e = p.topk_ids.flatten()  # assignment i = token i // TOP_K, slot i % TOP_K
        order = torch.argsort(flat_e, stable=True)  # by expert, hence by destination rank
        send_counts = torch.bincount(flat_e // local, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        sc, rc = send_counts.tolist(), recv_counts.tolist()
        tok = order // TOP_K
        recv_rows = sum(rc)
        payload = torch.cat([p.x.packed[tok], p.x.scales[tok],
                             flat_e[order].to(torch.uint8)[:, None]], dim=1)
        recv = torch.empty(recv_rows, payload.shape[1], dtype=torch.uint8, device=dev)
        dist.all_to_all_single(recv, payload, rc, sc)
        return order, sc, rc, recv

    order, send_counts, recv_counts, recv = timed(dispatch, timings, "dispatch_us")

    events: list = []

    def gemm(a, b, sfa, sfb, offs):
        # GPU-timeline span of the grouped GEMM calls alone, apart from the torch work around them.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y = gg.scaled_grouped_mm(a, b, sfa, sfb, offs, out_dtype=torch.float16)
        end.record()
        events.append((start, end))
        return y

    def stacked(ws: list[Nvfp4]) -> tuple[torch.Tensor, torch.Tensor]:
        """One (E_local, N, K/2) weight tensor and its (E_local, blocked) scales."""
        return (torch.stack([w.packed for w in ws]),
                torch.stack([to_blocked(w.scales.view(torch.float8_e4m3fn)) for w in ws]))

    def experts():
        packed, scales = recv[:, : D // 2], recv[:, D // 2 : D // 2 + D // SF_VEC]
        expert = recv[:, -1].long() - rank * local
        by_expert = torch.argsort(expert, stable=True)
        # Expert end offsets, on the device: nothing of the routing goes to the host.
        offs = torch.cumsum(torch.bincount(expert, minlength=local), 0).to(torch.int32)
        a = packed[by_expert].contiguous()
        sfa = to_blocked_grouped(scales[by_expert].view(torch.float8_e4m3fn), offs)
        b1, sfb1 = stacked([p.w1[rank * local + e] for e in range(local)])
        b2, sfb2 = stacked([p.w2[rank * local + e] for e in range(local)])
        h = gemm(a, b1, sfa, sfb1, offs)  # (rows, 2F), rows still grouped by expert
        act = quantize_pow2(activation(h))
        y = gemm(act.packed, b2, to_blocked_grouped(act.scales.view(torch.float8_e4m3fn), offs),
                 sfb2, offs)
        out = torch.empty(recv.shape[0], D, dtype=torch.float16, device=dev)
        out[by_expert] = y
        return out

    y_recv = timed(experts, timings, "experts_us")
    timings["grouped_gemm_us"] = sum(s.elapsed_time(e) for s, e in events) * 1e3

    def combine():
        back = torch.empty(sum(send_counts), D, dtype=torch.float16, device=dev)
        dist.all_to_all_single(back, y_recv, send_counts, recv_counts)
        y_assign = torch.empty_like(back)
        y_assign[order] = back
        y_assign = y_assign.view(tokens, TOP_K, D).float()
        return (p.topk_w[:, :, None] * y_assign).sum(dim=1)

    return timed(combine, timings, "combine_us")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    args = ap.parse_args()

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511")):
        os.environ.setdefault(key, value)  # plain `python` = one rank
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if E % world:
        raise SystemExit(f"world size must divide the {E} experts, but got {world}")
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=dev)
    gg = runtime.load(args.artifacts)

    ok_all = True
    for seed in range(args.seeds):
        p = make_problem(seed, rank, args.tokens, dev)
        moe_layer(p, gg, rank, world, {})  # warm-up: kernel loads, NCCL setup
        timings: dict = {}
        out = moe_layer(p, gg, rank, world, timings)
        ref = reference(p)
        exact = torch.equal(out, ref)
        close = torch.allclose(out, ref, rtol=1e-3, atol=1e-3)
        ok_all &= close
        print(f"rank {rank}/{world} seed {seed}: {'ok' if close else 'MISMATCH'} "
              f"(bit-exact {exact}, max abs err {float((out - ref).abs().max()):.3g}) "
              f"dispatch {timings['dispatch_us']:.0f} us, experts {timings['experts_us']:.0f} us "
              f"(of which grouped GEMM calls {timings['grouped_gemm_us']:.0f} us), "
              f"combine {timings['combine_us']:.0f} us",
              flush=True)
    flag = torch.tensor([int(ok_all)], device=dev)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    if rank == 0:
        print(f"all ranks, all seeds: {'ok' if flag.item() else 'MISMATCH'}")
    return 0 if flag.item() else 1


if __name__ == "__main__":
    sys.exit(main())
