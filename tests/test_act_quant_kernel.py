"""kernels/sm90/act_quant.py (the AOT activation quantizers): their algorithm, written here step
for step in torch, gives runtime.activations' bits on bf16 blocks built to hit every edge (ties
at every midpoint, saturation, zero and subnormal blocks, NaN and inf, tiny and huge decode
scales), and the experts kernel's shared-memory tables equal runtime.activations' (the build
and the cubins are checked in tests/test_shipped_kernels.py; the kernels' own bits on the
H200 by experiments/act_quant_check.py and tests/test_quantize_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from runtime.nvfp4 import (
    _E2M1_MIDPOINTS,
    _clamped_ends,
    _expert_starts,
    _pack_codes,
    _quantize_codes,
    blocked_scale_offset,
)

E4M3 = torch.float8_e4m3fn


def _directed(t: torch.Tensor, up: bool) -> torch.Tensor:
    """f64 -> f32 rounded down (up: up), as PTX cvt.rm / cvt.rp.f32.f64."""
    r = t.float()
    if up:
        return torch.where(r.double() < t, torch.nextafter(r, torch.tensor(float("inf"))), r)
    return torch.where(r.double() > t, torch.nextafter(r, torch.tensor(float("-inf"))), r)


def kernel_algorithm(x: torch.Tensor, gs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant.py's arithmetic on blocks x (B, 16) bf16 with decode scales gs (B,) float32:
    (packed codes (B, 8) uint8, scale bytes (B,) uint8)."""
    v = x.float()
    amax = v.abs().amax(dim=1)  # NaN if any NaN, as max.NaN.f32
    amax = torch.where((gs > 0) & (gs < float("inf")), amax, float("nan"))  # poison()
    q = torch.nan_to_num(amax.double() / 6.0 / gs.double(), nan=448.0).clamp(max=448.0)
    byte = q.float().to(E4M3).view(torch.uint8)
    denom = byte.view(E4M3).double() * gs.double()
    ok = (denom > 0) & ~torch.isnan(amax)
    mag = v.abs()
    # e2m1_code: a 3-step binary search of the round-downs, then an odd lo's tie by its
    # round-up (only midpoints 1, 3, 5; above lo = 7 none: NaN, which inf does not reach).
    down = torch.stack([_directed(m * denom, up=False) for m in _E2M1_MIDPOINTS], dim=1)
    up = {b: _directed(_E2M1_MIDPOINTS[b] * denom, up=True)[:, None] for b in (1, 3, 5)}
    d = [down[:, b:b + 1].expand_as(mag) for b in range(7)]
    p1 = mag > d[3]
    p2 = mag > torch.where(p1, d[5], d[1])
    p3 = mag > torch.where(p2, torch.where(p1, d[6], d[2]), torch.where(p1, d[4], d[0]))
    u = torch.where(p2, torch.where(p1, float("nan"), up[3]), torch.where(p1, up[5], up[1]))
    tie = p3 & (mag >= u)
    code = 4 * p1.int() + 2 * p2.int() + p3.int() + tie.int()
    code = code | torch.where((v < 0) & (code != 0), 8, 0)
    code = torch.where(ok[:, None], code, 0).to(torch.uint8)
    byte = torch.where(amax < float("inf"), byte, 0x7F)
    return _pack_codes(code), byte


def reference(x: torch.Tensor, gs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """runtime.activations' bits for the same blocks (each block its own row), its bad decode
    scales made NaN as runtime.activations._decode_scales does."""
    gs = torch.where((gs > 0) & torch.isfinite(gs), gs.double(), float("nan"))
    codes, scale = _quantize_codes(x, gs[:, None])
    byte = torch.where(torch.isfinite(x.float()).all(dim=1), scale.view(torch.uint8)[:, 0], 0x7F)
    return _pack_codes(codes), byte


def edge_blocks(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = 4096
    gs = (2.0 ** torch.randint(-30, 20, (n,), generator=gen)).float()
    gs[n // 2:] *= 1 + torch.rand(n - n // 2, generator=gen)  # not powers of two
    kind = torch.arange(n) % 6
    x = torch.randn(n, 16, generator=gen) * 10.0 ** torch.randint(-8, 8, (n, 1), generator=gen)
    # Ties: every value a midpoint (or a grid value) of a power-of-two block scale times gs.
    grid = torch.tensor(list(_E2M1_MIDPOINTS) + [0.5, 1.0, 3.0, 6.0])
    pick = grid[torch.randint(0, len(grid), (n, 16), generator=gen)]
    sign = torch.where(torch.rand(n, 16, generator=gen) < 0.5, -1.0, 1.0)
    pow2 = 2.0 ** torch.randint(-9, 8, (n, 1), generator=gen)
    x = torch.where((kind == 1)[:, None], pick * sign * pow2 * gs[:, None].double().float(), x)
    x = torch.where((kind == 2)[:, None], torch.full_like(x, 1e-40), x)  # subnormal bf16
    x = torch.where((kind == 3)[:, None], x * 0, x)  # zero blocks (some -0.0)
    x = torch.where((kind == 4)[:, None], x * 1e30, x)  # saturating scales
    x = x.to(torch.bfloat16)
    # Near-ties: decode scale r = p/q rounded to f32 and values m * r exactly (a midpoint m of
    # the block scale times p/q, a dyadic number), so that m * denom lies within an f32
    # rounding of the value without equalling it. A threshold rounded to nearest would call
    # that a tie; the directed roundings do not (the first element sets the block scale 1).
    near = (kind == 5).nonzero()[:, 0]
    ratios = torch.tensor([[2 / 3, 0.75], [4 / 5, 1.25], [8 / 7, 1.75], [4 / 5, 2.5],
                           [8 / 7, 3.5], [4 / 5, 5.0], [4 / 3, 0.75], [8 / 5, 1.25]],
                          dtype=torch.float64)
    which = ratios[torch.randint(0, len(ratios), (len(near),), generator=gen)]
    gs[near] = which[:, 0].float()
    values = (which[:, 1:] * which[:, :1]).expand(-1, 16).clone()
    values[:, 0] = 6 * which[:, 0]
    values *= torch.where(torch.rand(len(near), 16, generator=gen) < 0.5, -1.0, 1.0)
    x[near] = values.to(torch.bfloat16)
    gs[5::211] = torch.tensor([0.0, -1.0, float("nan"), float("inf")]).repeat(5)[
        :len(gs[5::211])]  # bad decode scales: the block poisoned
    x[::37, 3] = float("inf")
    x[::53, 7] = float("-inf")
    x[::41, 11] = float("nan")
    return x, gs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_kernels_algorithm_is_runtime_activations_bit_for_bit(seed) -> None:
    x, gs = edge_blocks(seed)
    got_codes, got_bytes = kernel_algorithm(x, gs)
    want_codes, want_bytes = reference(x, gs)
    assert torch.equal(got_bytes, want_bytes)
    assert torch.equal(got_codes, want_codes)


def test_edge_blocks_hit_ties_and_non_finite_blocks() -> None:
    """The cases above are not vacuous: some values sit exactly on a midpoint, some blocks
    saturate, and some are NaN / inf."""
    x, gs = edge_blocks(0)
    _, byte = reference(x, gs)
    codes, _ = _quantize_codes(x, gs.double()[:, None])
    assert (byte == 0x7F).sum() > 100
    assert (byte == 0x7E).sum() > 10  # scale 448: saturated
    denom = byte.view(E4M3).double() * gs.double()
    v = x.double() / denom[:, None]
    ties = torch.isin(v.abs(), torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float64))
    assert ties.sum() > 1000
    # And the near-ties: a value within an f32 rounding of m * denom but not on it.
    t = torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float64)[None, None, :] * denom[:, None, None]
    near = (x.double().abs()[:, :, None] == t.float().double()) & (t.float().double() != t)
    assert near.sum() > 100
    assert (codes == 7).any() and (codes == 15).any()


def block_scan(values: list[int], op, threads: int = 256) -> list[int]:
    """_block_scan, step for step: the exclusive prefix (op) of each thread's value, a shuffle
    scan in each warp (a lane below the distance keeps its value), then the totals of the
    warps before."""
    scan = list(values)
    for d in (1, 2, 4, 8, 16):
        scan = [op(scan[i], scan[i - d]) if i % 32 >= d else scan[i] for i in range(threads)]
    totals = [scan[w * 32 + 31] for w in range(threads // 32)]
    out = []
    for i in range(threads):
        prefix = scan[i - 1] if i % 32 else 0
        for w in range(i // 32):
            prefix = op(prefix, totals[w])
        out.append(prefix)
    return out


def masked_table(masked: list[int], max_m: int, kb: int, threads: int = 256,
                 per_thread: int = 4) -> list[int]:
    """ActQuantMasked's vend, step for step: each thread's running sum of clamp(masked_m, 0,
    max_m) * kb over its experts, plus a sum scan of the threads' totals."""
    vend, runs = [0] * (threads * per_thread), []
    for tid in range(threads):
        run = 0
        for j in range(per_thread):
            i = tid * per_thread + j
            if i < len(masked):
                run += min(max(masked[i], 0), max_m) * kb
            vend[i] = run
        runs.append(run)
    carries = block_scan(runs, lambda a, b: a + b, threads)
    return [v + carries[i // per_thread] for i, v in enumerate(vend)][:len(masked)]


def kernel_tables(offs: list[int], t: int, threads: int = 256,
                  per_thread: int = 4) -> tuple[list[int], list[int]]:
    """ActQuantExperts' shared-memory tables, step for step: each thread's clamped running max
    over its experts, a max scan of the threads' totals, then the padded rows' thread-local
    exclusive sums and a sum scan. Each scan (_block_scan) is a shuffle scan in each warp (a
    lane below the distance keeps its value), then the totals of the warps before."""
    n = threads * per_thread
    ends, pstart = [0] * n, [0] * n

    runs = []
    for tid in range(threads):
        run = 0
        for j in range(per_thread):
            i = tid * per_thread + j
            v = min(max(offs[i], 0), t) if i < len(offs) else 0
            run = max(run, v)
            ends[i] = run
        runs.append(run)
    carries = block_scan(runs, max, threads)
    totals = []
    for tid in range(threads):
        before, total = carries[tid], 0
        for j in range(per_thread):
            i = tid * per_thread + j
            ends[i] = max(ends[i], carries[tid])
            pstart[i] = total
            total += (ends[i] - before + 127) // 128 * 128
            before = ends[i]
        totals.append(total)
    sums = block_scan(totals, lambda a, b: a + b, threads)
    for tid in range(threads):
        for j in range(per_thread):
            pstart[tid * per_thread + j] += sums[tid]
    return ends[:len(offs)], pstart[:len(offs)]


@pytest.mark.parametrize("experts", [1, 3, 4, 5, 37, 255, 256, 257, 777, 1024])
def test_the_masked_kernels_table_is_each_experts_valid_blocks_summed(experts) -> None:
    """vend[e] = the sum over experts g <= e of clamp(masked_m[g], 0, max_m) * K/16, across the
    4-per-thread and 256-thread boundaries, for masked_m below 0 and past max_m."""
    gen = torch.Generator().manual_seed(experts)
    masked = torch.randint(-5, 70, (experts,), generator=gen).tolist()
    want = torch.tensor(masked).clamp(0, 64).mul(28).cumsum(0).tolist()
    assert masked_table(masked, 64, 28) == want


@pytest.mark.parametrize("experts", [1, 3, 4, 5, 255, 256, 257, 777, 1024])
def test_the_kernels_expert_tables_are_runtime_activations(experts) -> None:
    """The tables the experts kernel derives in shared memory equal runtime.activations' own
    (clamped, non-decreasing ends; 128-padded first scale rows), for valid and bad offs and
    expert counts across the 4-per-thread and 256-thread boundaries."""
    gen = torch.Generator().manual_seed(experts)
    t = 3000
    for offs in (torch.randint(0, 40, (experts,), generator=gen).cumsum(0).to(torch.int32),
                 torch.randint(-60, t + 60, (experts,), generator=gen, dtype=torch.int32)):
        ends, pstart = kernel_tables(offs.tolist(), t)
        want_ends = _clamped_ends(offs, t)
        assert ends == want_ends.tolist()
        assert pstart == _expert_starts(want_ends)[1].tolist()


def fill_writes(chunks: int, k: int, owner_rows, sms: int = 132) -> list[tuple[int, int]]:
    """_fill_chunks, step for step, over the filling CTAs runtime.quantize launches on `sms`
    SMs: the (offset, width) of each zero store; owner_rows(row0) -> (row0 relative to its
    owner, the owner's real rows)."""
    from runtime.quantize import fill_ctas

    threads = 256
    ctas = fill_ctas(chunks, threads, sms)
    per_cta = -(-chunks // (ctas * threads)) * threads
    order = [c for f in range(ctas) for tid in range(threads)
             for c in range(f * per_cta + tid, min(f * per_cta + per_cta, chunks), threads)]
    rest_k, kb, out = (k // 16 + 3) // 4, k // 16, []
    for c in order:
        atom, o = divmod(c, 32)
        rb, jg = divmod(atom, rest_k)
        rel, m = owner_rows(rb * 128)
        if rel + o >= m:
            out.append((c * 16, 16))
            continue
        for i in range(4):
            if rel + i * 32 + o >= m:
                out.append((c * 16 + i * 4, 4))
            else:
                out += [(c * 16 + i * 4 + jj, 1) for jj in range(1, 4) if jg * 4 + jj >= kb]
    return out


def covered_once(nbytes: int, quantized: list[int], zeros: list[tuple[int, int]]) -> bool:
    """Whether the quantizing threads' scale bytes and the fill's zero stores write every byte
    of sfa exactly once (no byte left to a memset, none written by both)."""
    count = torch.zeros(nbytes, dtype=torch.int32)
    count[torch.tensor(quantized, dtype=torch.long)] += 1
    for off, width in zeros:
        count[off:off + width] += 1
    return bool((count == 1).all())


@pytest.mark.parametrize("k", [16, 48, 64, 112, 256])
@pytest.mark.parametrize("experts", [1, 5, 37])
def test_the_experts_fill_writes_exactly_what_the_quantizing_threads_do_not(experts, k) -> None:
    """ActQuantExperts with no memset: for valid, skewed (empty experts), bad (decreasing, past
    T, negative) offs and rows past offs[-1], the real rows' scale bytes and the fill's zeros
    cover sfa once (sfa_rows_needed(T, E) rows); K / 16 not a multiple of 4 leaves padding
    columns in real rows."""
    from runtime.formats import scale_cols, sfa_rows_needed

    gen = torch.Generator().manual_seed(experts * 1000 + k)
    t = 300
    counts = torch.randint(0, 3, (experts,), generator=gen) * torch.randint(0, 140, (experts,),
                                                                             generator=gen)
    for offs in (counts.cumsum(0).clamp(max=t - 7).to(torch.int32),
                 torch.randint(-60, t + 60, (experts,), generator=gen, dtype=torch.int32)):
        ends, pstart = kernel_tables(offs.tolist(), t)
        kb = k // 16
        quantized = []
        for r in range(t):
            g = next((i for i, e in enumerate(ends) if e > r), None)
            if g is not None:
                prow = pstart[g] + r - (ends[g - 1] if g else 0)
                quantized += [blocked_scale_offset(prow, j, k) for j in range(kb)]

        def owner_rows(row0: int) -> tuple[int, int]:
            g = sum(1 for p in pstart if p <= row0) - 1
            return row0 - pstart[g], ends[g] - (ends[g - 1] if g else 0)

        nbytes = sfa_rows_needed(t, experts) * scale_cols(k)
        assert covered_once(nbytes, quantized, fill_writes(nbytes // 16, k, owner_rows))


def masked_walk(experts: int, max_m: int, k: int, valid: list[int] | None,
                quant_ctas: int) -> tuple[list[int], int]:
    """ActQuantMasked's quantizing loop, step for step, over quant_ctas CTAs of 256 threads:
    (the blocks quantized, as (e * max_m + row) * K/16 + j, the most iterations of a thread).
    valid: masked_m (the kernel's vend table is built from it, clamped), None without it."""
    kb = k // 16
    vend = [] if valid is None else masked_table(valid, max_m, kb)
    total = experts * max_m * kb if valid is None else vend[-1]
    out, most = [], 0
    for first in range(quant_ctas * 256):
        v, steps = first, 0
        while v < total:
            if valid is None:
                e, off = divmod(v, max(max_m * kb, 1))
            else:
                e = next(g for g in range(experts) if vend[g] > v)
                off = v - (vend[e - 1] if e else 0)
            row, j = divmod(off, kb)
            out.append((e * max_m + row) * kb + j)
            v += quant_ctas * 256
            steps += 1
        most = max(most, steps)
    return out, most


@pytest.mark.parametrize("max_m", [1, 31, 128, 130])
@pytest.mark.parametrize("k", [16, 80, 256])
@pytest.mark.parametrize("masked,sms", [(None, 132), ((0, 1, 10**6), 132), ((-3, 129, 30), 132),
                                        ((-3, 129, 30), 1)])  # 1 SM: capped, long runs
def test_the_masked_fill_writes_exactly_what_the_quantizing_threads_do_not(max_m, k, masked,
                                                                          sms) -> None:
    """ActQuantMasked with no memset: the valid rows' scale bytes (every row without masked_m;
    those below masked_m[e], clamped to [0, max_m], with it) and the fill's zeros cover sfa
    (E, round_up(max_m, 128) * scale_cols(k)) once."""
    from runtime.formats import blocked_scale_numel

    experts, kb = 3, k // 16
    valid = [max_m] * experts if masked is None else [min(max(m, 0), max_m) for m in masked]
    per_expert = blocked_scale_numel(max_m, k)
    expert_rows = (max_m + 127) // 128 * 128
    quantized = [e * per_expert + blocked_scale_offset(r, j, k)
                 for e in range(experts) for r in range(valid[e]) for j in range(kb)]
    zeros = fill_writes(experts * per_expert // 16, k,
                        lambda row0: (row0 % expert_rows, valid[row0 // expert_rows]), sms)
    assert covered_once(experts * per_expert, quantized, zeros)


@pytest.mark.parametrize("max_m,k", [(1, 16), (31, 80), (130, 256), (700, 48)])
@pytest.mark.parametrize("masked", [None, (0, 1, 10**6, 5), (-3, 129, 30, 0), (0, 0, 0, 0)])
@pytest.mark.parametrize("quant_ctas", [1, 3, None])
def test_the_masked_quantizing_walk_takes_each_valid_block_once(max_m, k, masked,
                                                                quant_ctas) -> None:
    """The grid-stride loop over the valid blocks, for any quantizing CTA count (None: one per
    256 blocks, the plan without masked_m): every block of a valid row exactly once, none of a
    masked row, and no thread more iterations than the valid blocks need (a masked row costs
    nothing)."""
    experts = 4
    valid = None if masked is None else [min(max(m, 0), max_m) for m in masked]
    rows = [max_m] * experts if valid is None else valid
    kb = k // 16
    ctas = quant_ctas or -(-experts * max_m * kb // 256)
    got, most = masked_walk(experts, max_m, k, valid, ctas)
    want = [(e * max_m + r) * kb + j for e in range(experts) for r in range(rows[e])
            for j in range(kb)]
    assert sorted(got) == want and len(got) == len(want)
    assert most == -(-len(want) // (ctas * 256))
