"""torch.ops.nvfp4.scaled_grouped_mm (issue 26): schema, fake implementation, and
torch.compile(fullgraph=True) end to end on the CPU against a registered CPU stand-in that
computes the float64 reference per expert from offs (the GPU op reads offs on the device only;
scripts/serving_check.py checks it there)."""

from __future__ import annotations

import pytest
import torch

import runtime.torch_op as op
from runtime.errors import InputError
from runtime.formats import scale_cols
from runtime.nvfp4 import make_grouped_problem, reference_grouped_gemm
from runtime.serving import sfa_rows_needed

E, N, K = 3, 128, 256
OP = torch.ops.nvfp4.scaled_grouped_mm.default
KEY = "serving-cpu"


class CpuServing:
    """GroupedGemm.scaled_grouped_mm on the CPU: torch's 2D x 3D layout, float64 reference."""

    def __init__(self) -> None:
        self.calls = 0

    def grouped_gemm(self, *args, **kw):  # registry check: a GroupedGemm has grouped_gemm
        raise NotImplementedError

    def scaled_grouped_mm(self, a, b, sfa, sfb, offs, *, alpha=None, out=None,
                          out_dtype=torch.bfloat16):
        self.calls += 1
        t, n, k = a.shape[0], b.shape[1], 2 * a.shape[1]
        out = torch.zeros(t, n, dtype=out_dtype) if out is None else out
        ends = offs.to(torch.int64).clamp(0, t).cummax(0).values.tolist()
        row = srow = 0
        cols = scale_cols(k)
        for g, end in enumerate(ends):
            m = end - row
            ref = reference_grouped_gemm(
                [a[row:end]], [b[g]], [sfa[srow * cols:(srow + -(-m // 128) * 128) * cols]],
                [sfb[g]], [(m, n, k)],
                alpha=None if alpha is None else [float(alpha[g])], out_dtype=out_dtype)
            out[row:end] = ref[0]
            row, srow = end, srow + -(-m // 128) * 128
        return out


@pytest.fixture()
def served():
    ref = CpuServing()
    op.register(ref, KEY)
    yield ref
    op.unregister(KEY)
    torch._dynamo.reset()


def layer(counts: list[int], t: int, seed: int = 3):
    p = make_grouped_problem([(m, N, K) for m in counts], seed=seed, values="benchmark")
    w = make_grouped_problem([(1, N, K)] * E, seed=seed + 1, values="benchmark")
    a = torch.zeros(t, K // 2, dtype=torch.uint8)
    sfa = torch.zeros(sfa_rows_needed(t, E) * scale_cols(K), dtype=torch.uint8)
    row = srow = 0
    for x, s, m in zip(p.a, p.sfa, counts):
        a[row:row + m] = x.view(torch.uint8)
        sfa[srow * scale_cols(K):srow * scale_cols(K) + s.numel()] = s.view(torch.uint8).reshape(-1)
        row, srow = row + m, srow + -(-m // 128) * 128
    b = torch.stack([x.view(torch.uint8) for x in w.b])
    sfb = torch.stack([x.view(torch.uint8).reshape(-1) for x in w.sfb])
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return a, b, sfa, sfb, offs


def test_schema() -> None:
    assert str(OP._schema) == (
        "nvfp4::scaled_grouped_mm(Tensor a, Tensor b, Tensor sfa, Tensor sfb, Tensor offs, "
        'str artifacts="default", Tensor? alpha=None, ScalarType out_dtype=15) -> Tensor')


def test_fake_gives_t_by_n_in_out_dtype_and_checks_at_trace_time() -> None:
    meta = [x.to("meta") for x in layer([5, 0, 9], 16)]
    out = OP(*meta, KEY, None, torch.float16)
    assert (out.shape, out.dtype, out.device.type) == ((16, N), torch.float16, "meta")
    # The eager call's size checks, at trace time (runtime.serving.check_serving_sizes).
    with pytest.raises(InputError, match=r"^offs must have shape \(3,\) \(one end offset per "
                                         r"expert of b\), but got \(2,\)$"):
        OP(*meta[:4], meta[4][:2], KEY)
    with pytest.raises(InputError, match=r"^sfa must have at least \d+ elements \(room for any "
                                         r"routing"):
        OP(meta[0], meta[1], meta[2][:10], *meta[3:], KEY)
    with pytest.raises(InputError, match=r"^sfb must have \d+ elements"):
        OP(*meta[:3], meta[3][:, :100], meta[4], KEY)
    with pytest.raises(InputError, match=r"^offs must be on a's device meta, but got a tensor "
                                         r"on cpu$"):
        OP(*meta[:4], torch.zeros(3, dtype=torch.int32), KEY)
    with pytest.raises(InputError, match=r"^offs must be a 1-D torch.int32 tensor, but got "
                                         r"torch.int64 of shape \(3,\)$"):
        OP(*meta[:4], meta[4].long(), KEY)
    with pytest.raises(InputError, match=r"^alpha must have shape \(3,\), but got \(2,\)$"):
        OP(*meta, KEY, torch.ones(2, device="meta"))


def test_compiled_fullgraph_matches_the_reference_with_new_routing(served) -> None:
    def moe(a, b, sfa, sfb, offs, alpha):
        return torch.ops.nvfp4.scaled_grouped_mm(a, b, sfa, sfb, offs, KEY, alpha) * 2

    compiled = torch.compile(moe, fullgraph=True, backend="aot_eager")
    alpha = torch.tensor([0.5, 1.0, 2.0])
    for counts in ([5, 0, 9], [0, 14, 2], [16, 0, 0]):  # new routing, same shapes: no recompile
        args = layer(counts, 16)
        got = compiled(*args, alpha)
        want = served.scaled_grouped_mm(*args, alpha=alpha) * 2
        assert torch.equal(got, want), counts
        assert got.dtype == torch.bfloat16 and tuple(got.shape) == (16, N)
    assert served.calls == 6
