"""GPU tests of the runtime's driver side, against the artifacts in $NVFP4_ARTIFACTS
(default: <repo>/artifacts). Skipped without a GPU, a manifest, or a kernel for this GPU's arch.

These check loading (parameter ABI against cuFuncGetParamInfo, arch refusal, tampering), that
every kernel launches and writes every output element, graphs, streams, threads and devices,
and that no `cutlass` is imported. Value correctness against the float64 reference is tested
separately; here results are compared with the same kernel's eager results, bit for bit.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import runtime
from runtime.dispatch import dynamic_groups, exact_groups
from runtime.errors import ArtifactError, InputError, NoKernelError
from runtime.manifest import KernelEntry
from runtime.nvfp4 import reference_grouped_gemm
from runtime.validate import OUT_TORCH_DTYPES, blocked_scale_numel

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("NVFP4_ARTIFACTS", REPO / "artifacts"))
FP4 = torch.float4_e2m1fn_x2
E4M3_ONE_TWO = torch.tensor([0x38, 0x40], dtype=torch.uint8)  # e4m3 bytes of 1.0 and 2.0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def gg() -> runtime.GroupedGemm:
    if not (ARTIFACTS / "manifest.json").is_file():
        pytest.skip(f"no artifacts at {ARTIFACTS} (set NVFP4_ARTIFACTS)")
    return runtime.load(ARTIFACTS)


def nk_cost(e: KernelEntry) -> int:
    """sum(n * k) over an entry's groups: its weight bytes, what an input set of it costs."""
    dyn = dynamic_groups(e)
    return sum(n * k for n, k in dyn[0]) if dyn is not None else sum(
        n * k for _, n, k in exact_groups(e))


def once_per_kernel(entries: list[KernelEntry]) -> list[KernelEntry]:
    """Each distinct kernel (e.kernel.key) once, through its cheapest set entry (the least
    sum(n * k); the first by name on a tie), in name order. Sets of one kernel share its cubin
    and code; the model expert layers (E = 256 of (4096, 7168)) are GBs of inputs per call."""
    best: dict[str, KernelEntry] = {}
    for e in entries:
        cur = best.get(e.kernel.key)
        if cur is None or nk_cost(e) < nk_cost(cur):
            best[e.kernel.key] = e
    return sorted(best.values(), key=lambda e: e.name)


@pytest.fixture(scope="module")
def entries(gg: runtime.GroupedGemm) -> list[KernelEntry]:
    # The fp16 kernels the list API serves: these tests call grouped_gemm with fp16 outputs.
    # Every bf16 kernel is checked bit for bit by scripts/gpu_checks.py, and through every
    # launch path by the alpha test below. Device-offsets kernels (the expert layers' sets on
    # sm_90a) serve scaled_grouped_mm only: test_every_offsets_kernel_* below.
    arch = gg.device_runtime(0).arch
    found = [e for e in gg.kernels if e.arch == arch and e.out_dtype == "float16"
             and not e.takes_offsets]
    if not found:
        pytest.skip(f"no kernel in {ARTIFACTS} targets this GPU ({arch})")
    return found


@pytest.fixture(scope="module")
def every_kernel(entries: list[KernelEntry]) -> list[KernelEntry]:
    """The distinct fp16 list-API kernels, each through its cheapest set entry."""
    return once_per_kernel(entries)


def shapes_for(e: KernelEntry, rng: random.Random) -> tuple[tuple[int, int, int], ...]:
    dyn = dynamic_groups(e)
    if dyn is None:
        return exact_groups(e)
    nk, max_m = dyn
    top = min(max_m or 300, 300)
    return tuple((rng.choice([0, 1, 7, rng.randint(0, top)]), n, k) for n, k in nk)


def random_bytes(numel: int, gen: torch.Generator) -> torch.Tensor:
    """Random uint8 on the generator's device: fp4 bytes (every byte is two e2m1 codes)."""
    return torch.randint(0, 256, (numel,), dtype=torch.uint8, generator=gen, device=gen.device)


def random_scales(numel: int, gen: torch.Generator) -> torch.Tensor:
    """e4m3 scales of 1.0 or 2.0: random, and no sum overflows fp16 at these shapes."""
    one_two = E4M3_ONE_TWO.to(gen.device)
    idx = torch.randint(0, 2, (numel,), generator=gen, device=gen.device)
    return one_two[idx].view(torch.float8_e4m3fn)


def make_inputs(shapes, device, seed: int):
    """Random operands for (m, n, k) per group, drawn on `device` (a CPU draw of the weights
    cost seconds per set: bench_large is 150 MB a call)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    a, b, sfa, sfb = [], [], [], []
    for m, n, k in shapes:
        a.append(random_bytes(m * k // 2, gen).view(m, k // 2).view(FP4))
        b.append(random_bytes(n * k // 2, gen).view(n, k // 2).view(FP4))
        sfa.append(random_scales(blocked_scale_numel(m, k), gen))
        sfb.append(random_scales(blocked_scale_numel(n, k), gen))
    return a, b, sfa, sfb


def serving_inputs(e: KernelEntry, counts: list[int], device, seed: int, pad: int = 0):
    """(a, b, sfa, sfb, offs) of a scaled_grouped_mm call on entry e's layer (E identical
    (n, k) groups) with counts[g] rows for expert g and `pad` rows past offs[-1]: random
    bytes, scales 1.0 or 2.0, sfa with room for any routing (runtime.serving.sfa_rows_needed)."""
    from runtime.formats import scale_cols
    from runtime.serving import sfa_rows_needed

    nk, _ = dynamic_groups(e)
    experts, (n, k) = len(nk), nk[0]
    t = sum(counts) + pad
    gen = torch.Generator(device=device).manual_seed(seed)
    a = random_bytes(t * k // 2, gen).view(t, k // 2).view(FP4)
    b = random_bytes(experts * n * k // 2, gen).view(experts, n, k // 2).view(FP4)
    sfa = random_scales(sfa_rows_needed(t, experts) * scale_cols(k), gen)
    sfb = random_scales(experts * blocked_scale_numel(n, k), gen).view(experts, -1)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    return a, b, sfa, sfb, offs


def serving_counts(gg: runtime.GroupedGemm, e: KernelEntry, pad: int = 0) -> list[int]:
    """Rows per expert (empty experts included) of a scaled_grouped_mm call with `pad` rows past
    offs[-1] that entry e's kernel serves: T within e's max_m, and past the max_m of a set of
    the same (E, N, K) that scaled_grouped_mm would prefer (the smallest bound covering T: a
    decode set's)."""
    from runtime.serving import select_serving

    nk, max_m = dynamic_groups(e)
    experts, (n, k) = len(nk), nk[0]
    if max_m is not None and pad >= max_m:  # the scaling below would go negative
        raise ValueError(f"pad {pad} leaves none of {e.name}'s max_m {max_m} rows")
    counts = [(0, 1, 37, 130, 0, 5)[g % 6] for g in range(experts)]
    if max_m is not None and sum(counts) + pad > max_m:
        counts = [c * (max_m - pad) // sum(counts) for c in counts]
        if not any(counts):  # a one-token set's few rows: two experts with rows
            counts[min(1, experts - 1)] += 1
            counts[min(2, experts - 1)] += max_m - pad - 1
    arch = gg.device_runtime(0).arch
    chosen = select_serving(gg.kernels, arch, experts, n, k, sum(counts) + pad, e.out_dtype)
    bound = dynamic_groups(chosen)[1]
    if chosen.kernel.key != e.kernel.key and bound is not None:
        counts[2 % experts] += bound + 1 - sum(counts) - pad
        chosen = select_serving(gg.kernels, arch, experts, n, k, sum(counts) + pad,
                                e.out_dtype)
    assert chosen.kernel.key == e.kernel.key, f"no T runs {e.name}'s kernel: {chosen.name}"
    return counts


def launch_once(gg: runtime.GroupedGemm, e: KernelEntry, seed: int = 0) -> None:
    """One call served by entry e in its output type: the list API, or scaled_grouped_mm for a
    device-offsets kernel (for the no-cutlass subprocess)."""
    dtype = OUT_TORCH_DTYPES[e.out_dtype]
    if e.takes_masked:
        nk, _ = dynamic_groups(e)
        (n, k), experts, max_m = nk[0], len(nk), 16
        u8 = {"dtype": torch.uint8, "device": "cuda"}
        gg.masked_grouped_mm(torch.zeros(experts, max_m, k // 2, **u8),
                             torch.zeros(experts, n, k // 2, **u8),
                             torch.zeros(experts, blocked_scale_numel(max_m, k), **u8),
                             torch.zeros(experts, blocked_scale_numel(n, k), **u8),
                             torch.full((experts,), 3, dtype=torch.int32, device="cuda"),
                             out_dtype=dtype)
        return
    if e.takes_offsets:
        gg.scaled_grouped_mm(*serving_inputs(e, serving_counts(gg, e), "cuda", seed),
                             out_dtype=dtype)
        return
    shapes = shapes_for(e, random.Random(seed))
    assert gg.select(shapes, out_dtype=dtype).kernel.key == e.kernel.key, e.name
    gg.grouped_gemm(*make_inputs(shapes, "cuda", seed), out_dtype=dtype)


def poisoned(shapes, device):
    return [torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
            for m, n, _ in shapes]


def same_bits(x: list[torch.Tensor], y: list[torch.Tensor]) -> bool:
    return all(torch.equal(p.view(torch.int16), q.view(torch.int16)) for p, q in zip(x, y,
                                                                                    strict=True))


# ------------------------------------------------------------------ loading



def replay_with_fresh_inputs(gg, graph, static, out, shapes, seeds) -> None:
    """Copy fresh inputs into the captured buffers, poison the outputs, replay, and compare
    bit for bit with an eager call on the same inputs."""
    for seed in seeds:
        fresh = make_inputs(shapes, "cuda", seed)
        for dst, src in zip(static, fresh, strict=True):
            for d, s in zip(dst, src, strict=True):
                d.copy_(s)
        for c in out:
            c.fill_(float("nan"))
        graph.replay()
        expect = gg.grouped_gemm(*fresh)
        torch.cuda.synchronize()
        assert same_bits(out, expect), f"seed {seed}"

def test_preload_checks_every_kernel_abi_with_param_info(gg, entries) -> None:
    from runtime.loader import check_param_layout, param_layout

    rt = gg.device_runtime(0)
    every = [e for e in gg.kernels if e.arch == rt.arch]  # both output types
    assert gg.preload() == [e.name for e in every]
    assert {e.name for e in entries} < {e.name for e in every}
    for e in every:
        layout = param_layout(rt.prepared(e).loaded.function)
        assert [size for _, size in layout] == [p.size for p in e.params]
        check_param_layout(e, layout)


def test_tampered_abi_is_an_artifact_error(gg, entries, tmp_path: Path) -> None:
    shutil.copytree(ARTIFACTS, tmp_path / "art")
    path = tmp_path / "art" / "manifest.json"
    obj = json.loads(path.read_text())
    key = next(s["kernel"] for s in obj["sets"] if s["name"] == entries[0].name)  # schema 2
    k = next(k for k in obj["kernels"] if k["key"] == key)
    last = k["params"][-1]
    last["offset"] += last["align"]  # still a valid slot, no longer the cubin's
    path.write_text(json.dumps(obj))
    with pytest.raises(ArtifactError, match=rf"parameter {len(k['params']) - 1} "
                                            rf"'{last['name']}' must be at offset"):
        runtime.load(tmp_path / "art").preload()


def test_kernel_for_another_arch_is_refused(gg, entries) -> None:
    rt = gg.device_runtime(0)
    other = "sm_100a" if rt.arch == "sm_90a" else "sm_90a"
    e = entries[0].replace(name="other-arch", arch=other)
    with pytest.raises(ArtifactError, match=f"is built for {other}, which needs compute "
                                            "capability"):
        gg.store.kernel(e, rt.device)


# ------------------------------------------------------------------ launching


def test_every_kernel_writes_every_output_deterministically(gg, every_kernel) -> None:
    rng = random.Random(0)
    for e in every_kernel:
        shapes = shapes_for(e, rng)
        assert gg.select(shapes).kernel.key == e.kernel.key, e.name
        a, b, sfa, sfb = make_inputs(shapes, "cuda", seed=1)
        out1 = gg.grouped_gemm(a, b, sfa, sfb, out=poisoned(shapes, "cuda"))
        out2 = gg.grouped_gemm(a, b, sfa, sfb)
        torch.cuda.synchronize()
        for g, c in enumerate(out1):
            assert not c.isnan().any(), f"{e.name}: out[{g}] has unwritten (NaN) elements"
        assert same_bits(out1, out2), e.name


def assert_rows_written_alike_twice(gg: runtime.GroupedGemm, e: KernelEntry, counts: list[int],
                                    seed: int, pad: int, label: str) -> None:
    """Two scaled_grouped_mm calls on entry e's layer with counts[g] rows for expert g and `pad`
    rows past offs[-1], into NaN-filled outputs of e's type: every routed row written, the
    rows past offs[-1] untouched, the same bits both times."""
    a, b, sfa, sfb, offs = serving_inputs(e, counts, "cuda", seed=seed, pad=pad)
    used = sum(counts)
    dtype = OUT_TORCH_DTYPES[e.out_dtype]
    outs = []
    for _ in range(2):
        out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=dtype, device="cuda")
        outs.append(gg.scaled_grouped_mm(a, b, sfa, sfb, offs, out=out))
    torch.cuda.synchronize()
    assert not outs[0][:used].isnan().any(), f"{label}: unwritten (NaN) rows"
    assert outs[0][used:].isnan().all(), f"{label}: rows past offs[-1] were written"
    assert torch.equal(outs[0][:used].view(torch.int16), outs[1][:used].view(torch.int16)), label


def test_every_offsets_kernel_writes_every_row_deterministically(gg) -> None:
    """Each device-offsets kernel (scaled_grouped_mm only), through its cheapest set entry, in
    its output type: a routing with empty experts and rows past offs[-1]; every row of an
    expert written (no NaN left), the rows past offs[-1] untouched, the same bits twice."""
    arch = gg.device_runtime(0).arch
    kernels = once_per_kernel([e for e in gg.kernels if e.arch == arch and e.takes_offsets
                               and not e.takes_masked])
    if not kernels:
        pytest.skip(f"no device-offsets kernel in {ARTIFACTS} for this GPU ({arch})")
    for e in kernels:
        # 19 rows past offs[-1], fewer for the one-token sets (max_m 4 and 8): with 19 their
        # rows scaled to max_m - 19 went negative, decreasing offs (thirty-second session).
        max_m = dynamic_groups(e)[1]
        pad = 19 if max_m is None or max_m >= 32 else max_m // 2
        assert_rows_written_alike_twice(gg, e, serving_counts(gg, e, pad=pad), seed=3, pad=pad,
                                        label=e.name)


def test_sparse_routings_write_every_row_deterministically(gg) -> None:
    """Small batches on the smallest expert layer of each E >= 8 (scaled_grouped_mm picks the
    kernel), where each CTA's binary search for its first tile's group lands far from group 0
    (twentieth session): one row on every fourth expert; and 17 rows on the last expert alone
    with 64 rows past offs[-1]. Every routed row written, the rows past offs[-1] untouched,
    the same bits twice."""
    def weights(e: KernelEntry) -> int:
        n, k = dynamic_groups(e)[0][0]
        return n * k

    arch = gg.device_runtime(0).arch
    smallest: dict[tuple, KernelEntry] = {}
    for e in gg.kernels:
        if e.arch != arch or not e.takes_offsets or e.takes_masked:
            continue
        key = (len(dynamic_groups(e)[0]), e.out_dtype)
        if key[0] >= 8 and (key not in smallest or weights(e) < weights(smallest[key])):
            smallest[key] = e
    if not smallest:
        pytest.skip(f"no expert layer of 8 or more experts in {ARTIFACTS} for this GPU ({arch})")
    for e in smallest.values():
        experts = len(dynamic_groups(e)[0])
        assert_rows_written_alike_twice(gg, e, [int(g % 4 == 3) for g in range(experts)],
                                        seed=7, pad=3, label=f"{e.set} E = {experts}")
        assert_rows_written_alike_twice(gg, e, [0] * (experts - 1) + [17], seed=8, pad=64,
                                        label=f"{e.set} E = {experts}, last expert only")


def test_toy_kernel_values(gg, entries) -> None:
    """With the toy artifacts (tests/toy_kernel.py), every element is checked exactly: the
    tables, pointers and persistent tile walk are right for exact and dynamic-m sets, m = 0,
    m not a multiple of the tile, and more tiles than CTAs."""
    from toy_kernel import expected

    toys = [e for e in entries if e.family == "toy"]
    if not toys:
        pytest.skip("not the toy artifacts")
    rng = random.Random(6)
    cases = []
    for e in toys:
        if dynamic_groups(e) is not None:
            nk = dynamic_groups(e)[0]
            cases += [tuple((m, n, k) for m, (n, k) in zip(ms, nk, strict=True)) for ms in (
                [rng.choice([0, 1, 5, 129, rng.randint(0, 700)]) for _ in nk] for _ in range(6))]
            cases.append(tuple((2000 + 37 * i, n, k) for i, (n, k) in enumerate(nk)))
        else:
            cases.append(shapes_for(e, rng))
    for i, shapes in enumerate(cases):
        args = make_inputs(shapes, "cuda", 50 + i)
        got = gg.grouped_gemm(*args, out=poisoned(shapes, "cuda"))
        want = expected(shapes, *args)
        torch.cuda.synchronize()
        assert same_bits(got, want), shapes


def test_launch_imports_no_cutlass() -> None:
    """Every distinct kernel of this GPU's arch (both output types, device-offsets kernels
    through scaled_grouped_mm) launched in a fresh process: no cutlass module is imported."""
    code = f"""
import sys, torch, runtime
sys.path.insert(0, {str(REPO / 'tests')!r})
from test_runtime_gpu import launch_once, once_per_kernel
gg = runtime.load({str(ARTIFACTS)!r})
arch = gg.device_runtime(0).arch
for e in once_per_kernel([e for e in gg.kernels if e.arch == arch]):
    launch_once(gg, e)
torch.cuda.synchronize()
bad = [m for m in sys.modules if m == "cutlass" or m.startswith("cutlass.")]
assert not bad, bad
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok")


def test_unbuilt_shapes_raise_and_launch_nothing(gg, entries) -> None:
    shapes = ((8, 128, 256),)
    a, b, sfa, sfb = make_inputs(shapes, "cuda", 0)
    out = poisoned(shapes, "cuda")
    with pytest.raises(NoKernelError, match=r"Built kernels"):
        gg.grouped_gemm(a, b, sfa, sfb, out=out)
    torch.cuda.synchronize()
    assert out[0].isnan().all()


def test_bad_inputs_on_gpu_raise_before_launch(gg, entries) -> None:
    e = entries[0]
    shapes = shapes_for(e, random.Random(1))
    a, b, sfa, sfb = make_inputs(shapes, "cuda", 0)
    with pytest.raises(InputError, match=r"^b_list\[0\] must be a CUDA tensor, but got a tensor "
                                         r"on cpu$"):
        gg.grouped_gemm(a, [b[0].cpu()] + b[1:], sfa, sfb)
    m, n, k = shapes[0]
    if m > 0:
        raw = torch.empty(m * k // 2 + 16, dtype=torch.uint8, device="cuda")
        shifted = raw[8:8 + m * k // 2].view(m, k // 2).view(FP4)
        with pytest.raises(InputError, match=r"^a_list\[0\] must start at a 16-byte aligned"):
            gg.grouped_gemm([shifted] + a[1:], b, sfa, sfb)
        alias = b[0].view(torch.uint8).view(-1)[: m * n * 2].view(torch.float16).view(m, n) \
            if n * (k // 2) >= m * n * 2 else None
        if alias is not None:
            out = poisoned(shapes, "cuda")
            out[0] = alias
            with pytest.raises(InputError, match=r"^out\[0\] must not overlap any other "
                                                 r"argument, but it overlaps b_list\[0\]$"):
                gg.grouped_gemm(a, b, sfa, sfb, out=out)
        if e.takes_alpha and m * n >= 2 * len(shapes):
            # alpha read by the epilogue that writes out[0]: refused too.
            out = poisoned(shapes, "cuda")
            alpha = out[0].view(-1)[: 2 * len(shapes)].view(torch.float32)
            with pytest.raises(InputError, match=r"^out\[0\] must not overlap any other "
                                                 r"argument, but it overlaps alpha$"):
                gg.grouped_gemm(a, b, sfa, sfb, out=out, alpha=alpha)


def test_all_m_zero_launches_nothing(gg, entries) -> None:
    dyn = [e for e in entries if dynamic_groups(e) is not None]
    if not dyn:
        pytest.skip("no dynamic-m kernel in the artifacts")
    shapes = tuple((0, n, k) for n, k in dynamic_groups(dyn[0])[0])
    out = gg.grouped_gemm(*make_inputs(shapes, "cuda", 0))
    assert [tuple(c.shape) for c in out] == [(0, n) for _, n, _ in shapes]


def test_context_and_current_device_are_preserved(gg, entries) -> None:
    from cuda.bindings import driver

    shapes = shapes_for(entries[0], random.Random(2))
    args = make_inputs(shapes, "cuda", 0)
    before = (torch.cuda.current_device(), int(driver.cuCtxGetCurrent()[1]))
    gg.grouped_gemm(*args)
    assert (torch.cuda.current_device(), int(driver.cuCtxGetCurrent()[1])) == before


# ------------------------------------------------------------------ graphs, streams, threads


def test_graph_replay_matches_eager_with_new_data(gg, entries) -> None:
    e = entries[0]
    shapes = shapes_for(e, random.Random(3))
    static = make_inputs(shapes, "cuda", 10)
    out = poisoned(shapes, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gg.grouped_gemm(*static, out=out)  # warm-up (loads, plans, tables) off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gg.grouped_gemm(*static, out=out)
    replay_with_fresh_inputs(gg, graph, static, out, shapes, (11, 12))


def test_threads_and_streams_do_not_share_launch_state(gg, entries) -> None:
    e = entries[0]
    n_threads, n_streams, iters = 8, 4, 3
    rng = random.Random(4)
    jobs = []
    for t in range(n_threads):
        shapes = shapes_for(e, rng)
        args = make_inputs(shapes, "cuda", 100 + t)
        jobs.append((shapes, args, gg.grouped_gemm(*args)))
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in range(n_streams)]
    results: dict[int, list] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def work(t: int) -> None:
        try:
            shapes, args, _ = jobs[t]
            s = streams[t % n_streams]
            outs = []
            barrier.wait()
            with torch.cuda.stream(s):
                for _ in range(iters):
                    outs.append(gg.grouped_gemm(*args, out=poisoned(shapes, "cuda")))
            s.synchronize()
            results[t] = outs
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t, (_, _, expect) in enumerate(jobs):
        for i, got in enumerate(results[t]):
            assert same_bits(got, expect), f"thread {t} iteration {i}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device_launches_there(gg, entries) -> None:
    shapes = shapes_for(entries[0], random.Random(5))
    args0 = make_inputs(shapes, "cuda:0", 7)
    args1 = tuple([t.to("cuda:1") for t in part] for part in args0)
    expect = gg.grouped_gemm(*args0)
    assert torch.cuda.current_device() == 0
    got = gg.grouped_gemm(*args1)
    assert all(c.device == torch.device("cuda:1") for c in got)
    assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert same_bits([c.to("cuda:0") for c in got], expect)
    mixed = list(args0[1])
    mixed[0] = args1[1][0]
    with pytest.raises(InputError, match=r"^b_list\[0\] must be on cuda:0 \(the device of "
                                         r"a_list\[0\]\), but got cuda:1$"):
        gg.grouped_gemm(args0[0], mixed, args0[2], args0[3])


# ------------------------------------------------------------------ dynamic m (issue 5)

# Scale ranges that make every fp32 partial sum exact (scripts/gpu_checks.py explains): a correct
# kernel's output equals fp16(float64 reference) exactly.
EXACT = {"values": "full", "scale_exp": (0, 6), "scale_exp_b": (-6, -3)}


def dynamic_entries(entries: list[KernelEntry]) -> list[KernelEntry]:
    return [e for e in entries if dynamic_groups(e) is not None]


def m_vectors(count: int, groups: int, seed: int, top: int = 300) -> list[list[int]]:
    """`count` m vectors: the first ones pin the edge cases (zeros, m = 1, m not a multiple of
    8, one past a 128-row tile), then random ones, each with m = 0 somewhere half the time."""
    rng = random.Random(seed)
    fixed = [[0] * groups, [1] * groups, [(13, 0, 129, 300, 7)[i % 5] for i in range(groups)],
             [(0, 127, 128, 255)[i % 4] for i in range(groups)]]
    out = [v for v in fixed][:count]
    while len(out) < count:
        v = [rng.choice([0, rng.randint(1, top), rng.randint(1, top) | 1]) for _ in range(groups)]
        out.append(v)
    return out


def test_dynamic_m_kernel_serves_20_random_m_vectors_bit_exact(gg, entries) -> None:
    """One dynamic-m cubin, 20 m vectors (zeros, m not a multiple of 8, m up to 300), each a
    fresh problem, every output element equal to fp16 of the float64 reference."""
    from runtime.nvfp4 import make_grouped_problem, reference_grouped_gemm

    dyn = dynamic_entries(entries)
    if not dyn:
        pytest.skip("no dynamic-m kernel in the artifacts")
    # The small mixed set when built (per-group n and k), else the smallest dynamic kernel.
    e = next((e for e in dyn if e.set == "mixed_any_m"),
             min(dyn, key=lambda e: sum(n * k for n, k in dynamic_groups(e)[0])))
    nk, _ = dynamic_groups(e)
    vectors = m_vectors(20, len(nk), seed=5)
    assert any(0 in v for v in vectors) and any(m % 8 for v in vectors for m in v)
    for i, ms in enumerate(vectors):
        shapes = tuple((m, n, k) for m, (n, k) in zip(ms, nk, strict=True))
        assert gg.select(shapes).name == e.name, shapes
        prob = make_grouped_problem(shapes, seed=300 + i, device="cuda", **EXACT)
        out = poisoned(shapes, "cuda")
        got = gg.grouped_gemm(prob.a, prob.b, prob.sfa, prob.sfb, out=out)
        ref = reference_grouped_gemm(prob.a, prob.b, prob.sfa, prob.sfb, shapes)
        torch.cuda.synchronize()
        assert [tuple(c.shape) for c in got] == [(m, n) for m, n, _ in shapes]
        for g, (c, r) in enumerate(zip(got, ref, strict=True)):
            assert torch.equal(c, r.half()), f"{e.name} m = {ms}: group {g} differs"


def test_dynamic_m_moe_kernels_match_the_reference_on_row_prefixes(gg, entries) -> None:
    """The moe (n, k) lists: one problem at m = 300 per group, then calls on row prefixes of it
    (a[:m], and the first blocked_scale_numel(m, k) scale bytes: the blocked layout is M-block
    outer), each compared with the same prefix of the reference. An m vector equal to an exact
    set's shapes is served by the exact kernel instead, with the same results."""
    from runtime.nvfp4 import make_grouped_problem, reference_grouped_gemm

    moe = [e for e in dynamic_entries(entries) if e.set.startswith("moe")]
    if not moe:
        pytest.skip("no moe dynamic-m kernel in the artifacts")
    exact_by_nk = {tuple((n, k) for _, n, k in exact_groups(x)): x for x in entries
                   if dynamic_groups(x) is None}
    for e in moe:
        nk, _ = dynamic_groups(e)
        top = 300
        full = tuple((top, n, k) for n, k in nk)
        prob = make_grouped_problem(full, seed=17, device="cuda", **EXACT)
        ref = reference_grouped_gemm(prob.a, prob.b, prob.sfa, prob.sfb, full)
        vectors = m_vectors(6, len(nk), seed=9, top=top)
        twin = exact_by_nk.get(nk)
        if twin is not None:
            vectors.append([m for m, _, _ in exact_groups(twin)])
        for ms in vectors:
            shapes = tuple((m, n, k) for m, (n, k) in zip(ms, nk, strict=True))
            want = twin.name if twin is not None and shapes == exact_groups(twin) else e.name
            assert gg.select(shapes).name == want, ms
            a = [t[:m] for t, m in zip(prob.a, ms, strict=True)]
            sfa = [t.view(-1)[:blocked_scale_numel(m, k)]
                   for t, (m, _, k) in zip(prob.sfa, shapes, strict=True)]
            got = gg.grouped_gemm(a, prob.b, sfa, prob.sfb, out=poisoned(shapes, "cuda"))
            torch.cuda.synchronize()
            for g, (c, r, m) in enumerate(zip(got, ref, ms, strict=True)):
                assert torch.equal(c, r[:m].half()), f"{want} m = {ms}: group {g} differs"


# ------------------------------------------------------------------ host fast path (issue 5)


def test_fast_path_repeats_skip_validation_and_stay_exact(gg, entries, monkeypatch) -> None:
    from runtime import api

    if api.tensor_guard_type() is None:
        pytest.skip("this torch has no usable TensorGuards: no fast path")
    dyn = dynamic_entries(entries)
    e = dyn[0] if dyn else entries[0]
    shapes = shapes_for(e, random.Random(21))
    if all(m == 0 for m, _, _ in shapes):
        shapes = tuple((5, n, k) for _, n, k in shapes)
    args = make_inputs(shapes, "cuda", 21)
    expect = gg.grouped_gemm(*args)
    out = poisoned(shapes, "cuda")
    for _ in range(2):  # plan, then signature
        gg.grouped_gemm(*args, out=out)
    calls = []
    real = api.check_inputs

    def counting(*a):
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(api, "check_inputs", counting)
    for c in out:
        c.fill_(float("nan"))
    gg.grouped_gemm(*args, out=out)
    torch.cuda.synchronize()
    assert calls == [] and same_bits(out, expect)
    # Same shapes, new storage for out[0] through set_ (same object, shape, dtype, strides):
    # the pointer set is new, so the full path validates it.
    fresh = torch.full_like(out[0], float("nan"))
    out[0].set_(fresh)
    gg.grouped_gemm(*args, out=out)
    torch.cuda.synchronize()
    assert calls == [1] and same_bits(out, expect)
    # A bad input with the signature of a good one cannot exist (the guard pins dtype, shape,
    # strides, device), and an unaligned pointer set was never validated: the full path says so.
    m, _, k = shapes[0]
    if m > 0:
        raw = torch.empty(m * k // 2 + 16, dtype=torch.uint8, device="cuda")
        shifted = raw[8:8 + m * k // 2].view(m, k // 2).view(FP4)
        with pytest.raises(InputError, match=r"^a_list\[0\] must start at a 16-byte aligned"):
            gg.grouped_gemm([shifted] + list(args[0][1:]), *args[1:], out=out)


def test_bound_call_is_exact_follows_in_place_updates_and_captures(gg, entries) -> None:
    """gg.bind: one validation, then calls with no checks. New values written into the bound
    tensors in place give the new results, eagerly and from a captured graph."""
    e = entries[0]
    shapes = shapes_for(e, random.Random(31))
    if all(m == 0 for m, _, _ in shapes):
        shapes = tuple((5, n, k) for _, n, k in shapes)
    first, second = make_inputs(shapes, "cuda", 31), make_inputs(shapes, "cuda", 32)
    expect = [gg.grouped_gemm(*first), gg.grouped_gemm(*second)]
    static = tuple([t.clone() for t in part] for part in first)
    out = poisoned(shapes, "cuda")
    bound = gg.bind(*static, out)
    assert bound.kernel == gg.select(shapes).name
    for _ in range(2):  # the first call builds the pointer table, the second is cached
        for c in out:
            c.fill_(float("nan"))
        got = bound()
        torch.cuda.synchronize()
        assert same_bits(got, expect[0]) and all(g is c for g, c in zip(got, out, strict=True))

    def load(src) -> None:
        for dst_part, src_part in zip(static, src, strict=True):
            for dst, s in zip(dst_part, src_part, strict=True):
                dst.copy_(s)
        for c in out:
            c.fill_(float("nan"))

    load(second)
    bound()
    torch.cuda.synchronize()
    assert same_bits(out, expect[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bound()
    for i in (0, 1):
        load((first, second)[i])
        graph.replay()
        torch.cuda.synchronize()
        assert same_bits(out, expect[i]), f"replay {i}"


def small_entry(entries: list[KernelEntry]) -> KernelEntry:
    """The kernel with the least work per call (a tiny dynamic-m set when built)."""
    def work(e: KernelEntry) -> int:
        dyn = dynamic_groups(e)
        shapes = exact_groups(e) if dyn is None else [(64, n, k) for n, k in dyn[0]]
        return sum(m * n * k for m, n, k in shapes)

    return min(entries, key=work)


def test_fast_path_from_threads_and_streams(gg, entries) -> None:
    """8 threads x 4 streams, each thread repeating one call with the same tensors (the fast
    path after two calls): launches on one stream share that stream's workspace in stream
    order, other streams use their own."""
    e = small_entry(entries)
    n_threads, n_streams, iters = 8, 4, 6
    jobs = []
    for t in range(n_threads):
        shapes = shapes_for(e, random.Random(40 + t))
        args = make_inputs(shapes, "cuda", 400 + t)
        jobs.append((shapes, args, gg.grouped_gemm(*args)))
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in range(n_streams)]
    outs = [poisoned(shapes, "cuda") for shapes, _, _ in jobs]
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def work(t: int) -> None:
        try:
            _, args, _ = jobs[t]
            s = streams[t % n_streams]
            barrier.wait()
            with torch.cuda.stream(s):
                for _ in range(iters):
                    gg.grouped_gemm(*args, out=outs[t])
            s.synchronize()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t, (_, _, expect) in enumerate(jobs):
        assert same_bits(outs[t], expect), f"thread {t}"


def test_graph_capture_after_fast_path_warmup(gg, entries) -> None:
    """Capturing a call whose signature and pointers are cached (fast path) still records a
    launch with graph-owned tables and workspace, and eager calls on the capture stream keep
    working afterwards."""
    e = small_entry(entries)
    shapes = shapes_for(e, random.Random(31))
    static = make_inputs(shapes, "cuda", 31)
    out = poisoned(shapes, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            gg.grouped_gemm(*static, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gg.grouped_gemm(*static, out=out)
    replay_with_fresh_inputs(gg, graph, static, out, shapes, (32, 33))
    eager = poisoned(shapes, "cuda")
    for _ in range(3):
        gg.grouped_gemm(*static, out=eager)
    torch.cuda.synchronize()
    assert same_bits(eager, out)


def test_alpha_and_bf16_through_every_launch_path(gg, entries) -> None:
    """Issue 24: the epilogue's alpha and output type, through the full path, the fast path
    (a new alpha tensor each call: its address is not part of the cached pointer table), a
    bound call whose alpha is rewritten in place, and a captured graph. Powers of two keep the
    products exact, so every result must equal the float64 reference rounded to bf16."""
    arch = gg.device_runtime(0).arch
    bf16 = [e for e in gg.kernels if e.arch == arch and e.out_dtype == "bfloat16"
            and e.takes_alpha and not e.takes_offsets]
    if not bf16:
        pytest.skip("no bf16 kernel with alpha built")
    e = small_entry(bf16)
    shapes = shapes_for(e, random.Random(41))
    if all(m == 0 for m, _, _ in shapes):
        shapes = tuple((5, n, k) for _, n, k in shapes)
    a, b, sfa, sfb = make_inputs(shapes, "cuda", 41)
    g = len(shapes)
    alphas = [[2.0 ** ((i + j) % 5 - 2) for i in range(g)] for j in range(3)]

    def expect(al):
        return reference_grouped_gemm(a, b, sfa, sfb, shapes, alpha=al, out_dtype=torch.bfloat16)

    out = [torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
           for m, n, _ in shapes]
    for j in (0, 1, 2, 0):  # full, full (plan hit: remembered), fast, fast
        alpha = torch.tensor(alphas[j], device="cuda")
        for c in out:
            c.fill_(float("nan"))
        got = gg.grouped_gemm(a, b, sfa, sfb, out=out, alpha=alpha)
        torch.cuda.synchronize()
        assert all(torch.equal(o, r) for o, r in zip(got, expect(alphas[j]))), f"alpha {j}"
    fresh = gg.grouped_gemm(a, b, sfa, sfb, out_dtype=torch.bfloat16)  # alpha None: ones
    assert all(torch.equal(o, r) for o, r in zip(fresh, expect(None)))
    assert fresh[0].dtype == torch.bfloat16
    alpha = torch.tensor(alphas[0], device="cuda")
    bound = gg.bind(a, b, sfa, sfb, out, alpha=alpha)
    graph = torch.cuda.CUDAGraph()
    bound()
    with torch.cuda.graph(graph):
        bound()
    for j in (1, 2):
        alpha.copy_(torch.tensor(alphas[j]))  # in place: the bound and captured address
        bound()
        torch.cuda.synchronize()
        assert all(torch.equal(o, r) for o, r in zip(out, expect(alphas[j]))), f"bound {j}"
        for c in out:
            c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(o, r) for o, r in zip(out, expect(alphas[j]))), f"replay {j}"


def test_serving_out_overlapping_an_input_is_refused_on_both_paths(gg) -> None:
    """An out sharing bytes with a, offs or alpha raises InputError naming it, with nothing
    launched, also after a validated call of the same shapes (the fast path's span check sends
    it to the full path, whose check_out_overlap names the input)."""
    arch = gg.device_runtime(0).arch
    kernels = [e for e in gg.kernels if e.arch == arch and e.takes_offsets and not e.takes_masked
               and e.out_dtype == "bfloat16" and e.takes_alpha]
    if not kernels:
        pytest.skip(f"no bf16 device-offsets kernel with alpha in {ARTIFACTS} ({arch})")
    e = kernels[0]
    a, b, sfa, sfb, offs = serving_inputs(e, serving_counts(gg, e), "cuda", seed=5)
    t, n = a.shape[0], b.shape[1]
    alpha = torch.ones(b.shape[0], dtype=torch.float32, device="cuda")
    out = torch.empty(t, n, dtype=torch.bfloat16, device="cuda")
    gg.scaled_grouped_mm(a, b, sfa, sfb, offs, alpha=alpha, out=out)  # the fast path's signature
    torch.cuda.synchronize()
    # One buffer holding out, with a's bytes, offs' and alpha's placed inside it in turn.
    store = torch.zeros(t * n * 2 + a.numel(), dtype=torch.uint8, device="cuda")
    aliased_out = store[:t * n * 2].view(torch.bfloat16).view(t, n)
    a_in = store[-a.numel() - 16:-16].view(a.shape).view(a.dtype)
    offs_in = aliased_out.view(-1)[: 2 * offs.numel()].view(torch.int32)
    alpha_in = aliased_out.view(-1)[64: 64 + 2 * alpha.numel()].view(torch.float32)
    for name, args in (("a", (a_in, offs, alpha)), ("offs", (a, offs_in, alpha)),
                       ("alpha", (a, offs, alpha_in))):
        x, o, al = args
        with pytest.raises(InputError, match=f"out must not overlap any other argument, but it "
                                             f"overlaps {name}$"):
            gg.scaled_grouped_mm(x, b, sfa, sfb, o, alpha=al, out=aliased_out)
