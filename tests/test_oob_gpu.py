"""Out-of-bounds by construction (issue 6): for every exact-shape kernel of this GPU's arch whose
sets have an m that is not a multiple of the kernel's M tile, each tensor of the call lives
inside a larger buffer between guard regions filled with a sentinel pattern. After the launch:
- the guards around every output are untouched (no write outside C, e.g. by the rows of the
  last M tile past m), and so are those around the inputs;
- the inputs (A, B, SFA, SFB) are byte-identical (nothing writes them);
- every output element was written, and equals the float64 reference rounded to the entry's
  output type (bf16 or fp16) bit for bit, although the scale padding rows (past m in the last 128-row atom) are NaN: a kernel that let
  padding, or a guard region, into a valid row would turn it into NaN or a wrong value.
Reads outside A, B and the scales are what compute-sanitizer memcheck sees; run this file under
it with scripts/sanitize_gpu.sh (SANITIZE_PYTEST=tests/test_oob_gpu.py).

Skipped without a GPU, without artifacts ($NVFP4_ARTIFACTS, default <repo>/artifacts) or without
such a kernel for this GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import runtime
from runtime.dispatch import dynamic_groups, exact_groups
from runtime.errors import ManifestError
from runtime.manifest import KernelEntry, load_manifest
from runtime.nvfp4 import GroupedProblem, make_grouped_problem, reference_grouped_gemm, to_blocked
from runtime.validate import OUT_TORCH_DTYPES

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("NVFP4_ARTIFACTS", REPO / "artifacts"))
GUARD = 4096  # bytes before every tensor (and after, on top of a whole tile of overrun)
U8 = torch.uint8

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _ragged(e: KernelEntry) -> bool:
    """An exact-shape list-API entry with some m off its kernel's M tile."""
    return (dynamic_groups(e) is None and not e.takes_offsets
            and any(m % e.tile.m for m, _, _ in exact_groups(e)))


def _candidates() -> list[str]:
    try:
        return [e.name for e in load_manifest(ARTIFACTS).sets if _ragged(e)]
    except ManifestError:
        return []


CANDIDATES = _candidates() or ["(no artifacts)"]


def _pattern(nbytes: int, salt: int, device: str) -> torch.Tensor:
    """A sentinel with period 251 bytes (prime): a stray write of any value, or data copied
    from elsewhere in a guard, breaks it."""
    return ((torch.arange(nbytes, dtype=torch.int64, device=device) * 7 + salt) % 251).to(U8)


class Guarded:
    """`data` (any dtype) copied into a buffer with guard regions before and after it."""

    def __init__(self, data: torch.Tensor, after: int, salt: int) -> None:
        raw = data.contiguous().view(-1).view(U8)
        self.nbytes = raw.numel()
        self.before, self.after = GUARD, GUARD + after
        self.buf = _pattern(self.before + self.nbytes + self.after, salt, str(data.device))
        self.pristine = self.buf.clone()
        inner = self.buf[self.before:self.before + self.nbytes]
        inner.copy_(raw)
        self.expect = inner.clone()
        self.tensor = inner.view(data.dtype).view(data.shape)

    def guards_intact(self) -> bool:
        head = slice(0, self.before)
        tail = slice(self.before + self.nbytes, None)
        return (torch.equal(self.buf[head], self.pristine[head])
                and torch.equal(self.buf[tail], self.pristine[tail]))

    def first_bad(self) -> str:
        diff = (self.buf != self.pristine).nonzero().flatten()
        diff = diff[(diff < self.before) | (diff >= self.before + self.nbytes)]
        if not diff.numel():
            return "none"
        at = int(diff[0]) - self.before
        where = f"{-at} bytes before" if at < 0 else f"{at - self.nbytes} bytes after"
        return f"{diff.numel()} guard bytes changed, the first {where} the tensor"

    def unchanged(self) -> bool:
        return torch.equal(self.buf[self.before:self.before + self.nbytes], self.expect)


_PROBLEMS: dict[tuple, GroupedProblem] = {}


def _problem(groups: list[tuple[int, int, int]]) -> GroupedProblem:
    """The test's problem for these shapes, drawn once: the bf16 and fp16 entries of a set
    share it (moe_gateup's weights are 235 MB of codes drawn on the CPU)."""
    key = tuple(groups)
    if key not in _PROBLEMS:
        _PROBLEMS.clear()  # entries come in name order: a set's two entries are neighbours
        # As scripts/gpu_checks.py: full-range e2m1 values, scales 2^0..2^6 on A and
        # 2^-6..2^-3 on B keep every partial sum exact in fp32, so the result is the reference
        # rounded to the output type bit for bit.
        _PROBLEMS[key] = make_grouped_problem(groups, seed=66, device="cuda", values="full",
                                              scale_exp=(0, 6), scale_exp_b=(-6, -3))
    return _PROBLEMS[key]


@pytest.fixture(scope="module")
def gg() -> runtime.GroupedGemm:
    if not (ARTIFACTS / "manifest.json").is_file():
        pytest.skip(f"no artifacts at {ARTIFACTS} (set NVFP4_ARTIFACTS)")
    return runtime.load(ARTIFACTS)


@pytest.mark.parametrize("name", CANDIDATES)
def test_no_write_outside_c_and_inputs_untouched(gg: runtime.GroupedGemm, name: str) -> None:
    if name not in {e.name for e in gg.kernels}:
        pytest.skip(f"no kernel with an m off the M tile in {ARTIFACTS}")
    e = gg.store.manifest.entry(name)
    rt = gg.device_runtime(0)
    if e.arch != rt.arch:
        pytest.skip(f"{name} is for {e.arch}, this GPU runs {rt.arch}")
    groups = [tuple(g) for g in exact_groups(e)]
    tile_m, tile_n = e.tile.m, e.tile.n
    dtype = OUT_TORCH_DTYPES[e.out_dtype]
    served = gg.select(groups, out_dtype=dtype)
    if served.name != e.name:
        pytest.skip(f"the API dispatches these shapes to {served.name}")
    prob = _problem(groups)
    nan_pad = [to_blocked(s, pad_value=float("nan")) for s in prob.sfa_plain]
    guarded: dict[str, list[Guarded]] = {"a": [], "b": [], "sfa": [], "sfb": [], "out": []}
    for g, (m, n, k) in enumerate(groups):
        # After each tensor: a whole tile of overrun past its last row, plus GUARD.
        guarded["a"].append(Guarded(prob.a[g], tile_m * k // 2, 11 * g + 1))
        guarded["b"].append(Guarded(prob.b[g], tile_n * k // 2, 11 * g + 2))
        guarded["sfa"].append(Guarded(nan_pad[g], 512 * (k // 64 + 1), 11 * g + 3))
        guarded["sfb"].append(Guarded(prob.sfb[g], 512 * (k // 64 + 1), 11 * g + 4))
        poison = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
        guarded["out"].append(Guarded(poison, tile_m * n * poison.element_size(), 11 * g + 5))
    args = {key: [x.tensor for x in xs] for key, xs in guarded.items()}
    for key in ("a", "b", "sfa", "sfb", "out"):  # each starts 16-byte aligned, as TMA needs
        assert all(t.data_ptr() % 16 == 0 for t in args[key])

    got = gg.grouped_gemm(args["a"], args["b"], args["sfa"], args["sfb"], out=args["out"])
    torch.cuda.synchronize()

    assert [c.data_ptr() for c in got] == [c.data_ptr() for c in args["out"]]
    for key, xs in guarded.items():
        for g, x in enumerate(xs):
            assert x.guards_intact(), f"{name}: guards of {key}[{g}] {groups[g]}: {x.first_bad()}"
            if key != "out":
                assert x.unchanged(), f"{name}: input {key}[{g}] was written"
    ref = reference_grouped_gemm(prob.a, prob.b, prob.sfa, prob.sfb, groups, out_dtype=dtype)
    for g, (c, r) in enumerate(zip(args["out"], ref, strict=True)):
        m, n, _ = groups[g]
        assert not c.isnan().any(), (
            f"{name}: out[{g}] {groups[g]} has {int(c.isnan().sum())} NaN: unwritten elements, "
            f"or NaN scale padding (rows {m}.. of the last atom) leaked into valid rows")
        assert c.dtype == dtype and torch.equal(c, r), (
            f"{name}: out[{g}] {groups[g]} differs from the reference rounded to {e.out_dtype}")
