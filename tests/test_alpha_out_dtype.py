"""CPU tests of issue 24's runtime side: per-group alpha and the bf16 / fp16 output type.

What runs on the GPU (the epilogue's values) is checked by scripts/gpu_checks.py; here: alpha's
and out_dtype's errors (exact messages, nothing launched), the kernel chosen by output type, the
alpha address each launch path hands the device runtime, and the parameter packing of the
`alpha` table (the caller's address, or the plan's ones).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from test_bound import SHAPES, RecordingRuntime, call_args, pointers
from test_bound import setup as bound_setup  # noqa: F401 - a fixture, used by name
from test_runtime_cpu import _params, _tables, _tma, entry, write_artifacts

import runtime
from runtime import api
from runtime.dispatch import KernelIndex
from runtime.errors import InputError, NoKernelError
from runtime.params import pack_params
from runtime.plan import make_plan
from runtime.validate import check_alpha, out_dtype_name


def alpha_params():
    """sm_90a-like params with the alpha table, as kernels/sm90 records it."""
    return _params([_tma(op) for op in ("a", "b", "sfa", "sfb")] + _tables()
                   + [("alpha", "table", 8, 8, {"table": "alpha"}),
                      ("num_groups", "scalar", 4, 4, {"value": "num_groups"})])


# ------------------------------------------------------------------ check_alpha


def test_alpha_errors_name_what_was_expected() -> None:
    def err(alpha, groups=2) -> str:
        with pytest.raises(InputError) as info:
            check_alpha(alpha, groups, 0)
        return str(info.value)

    assert err([1.0, 2.0]) == ("alpha must be a torch.Tensor of float32 of shape (2,) on "
                               "cuda:0, or None, but got list")
    assert err(torch.ones(2, dtype=torch.float16)) == (
        "alpha must have dtype torch.float32 (one fp32 scale per group), but got torch.float16")
    assert err(torch.ones(3)) == "alpha must have shape (2,) (one value per group), but got (3,)"
    assert err(torch.ones(1, 2)) == ("alpha must have shape (2,) (one value per group), but got "
                                     "(1, 2)")
    assert err(torch.ones(2)) == ("alpha must be a CUDA tensor on cuda:0 (it is read by the "
                                  "kernel, never on the host), but got a tensor on cpu")
    assert err(torch.ones(2, device="meta")) == (
        "alpha must be a CUDA tensor on cuda:0 (it is read by the kernel, never on the host), "
        "but got a tensor on meta")


def test_out_dtype_name() -> None:
    assert out_dtype_name(None, torch.bfloat16) == "bfloat16"
    assert out_dtype_name(None, torch.float16) == "float16"
    # Given outputs decide, whatever out_dtype says.
    assert out_dtype_name([torch.empty(1, dtype=torch.bfloat16)], torch.float16) == "bfloat16"
    with pytest.raises(InputError, match=r"^out_dtype must be torch.float16 or torch.bfloat16, "
                                         r"but got torch.float32$"):
        out_dtype_name(None, torch.float32)
    with pytest.raises(InputError, match=r"but got 'bf16'$"):
        out_dtype_name(None, "bf16")


# ------------------------------------------------------------------ dispatch by output type


def test_select_by_out_dtype_and_the_miss_names_what_was_built() -> None:
    f16, _ = entry()
    bf16, _ = entry("dense.sm_90a.acc1.bf16", out_dtype="bfloat16")
    shapes = ((192, 3072, 4096), (320, 3072, 4096))
    both = KernelIndex([f16, bf16])
    assert both.select(shapes, "sm_90a", out_dtype="float16") is f16
    assert both.select(shapes, "sm_90a", out_dtype="bfloat16") is bf16
    with pytest.raises(NoKernelError) as info:
        KernelIndex([f16]).select(shapes, "sm_90a", "cuda:0", out_dtype="bfloat16")
    lines = str(info.value).splitlines()
    assert lines[0].endswith("and bfloat16 output on cuda:0 (sm_90a); nothing was launched.")
    assert lines[1] == ("These shapes are built for float16 output only: pass out_dtype (or out "
                        "tensors) of that type, or add bfloat16 to the set's out_dtypes in "
                        "shapes.yaml and rebuild.")
    assert lines[3] == ("  - set 'dense' sm_90a float16 (dense.sm_90a.acc1.f16): (m, n, k) = "
                        "[(192, 3072, 4096), (320, 3072, 4096)]")


# ------------------------------------------------------------------ the launch paths


@pytest.fixture()
def alpha_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A GroupedGemm over one kernel per output type that takes alpha, one fp16 kernel that
    does not, a recording device runtime, and check_alpha without its CUDA-placement test."""
    dyn = {"dynamic_m": {"groups": [[n, k] for _, n, k in SHAPES]}}
    kernels = [entry("dense.sm_90a.acc1.f16", params=alpha_params(), constraints=dyn),
               entry("dense.sm_90a.acc1.bf16", params=alpha_params(), constraints=dyn,
                     out_dtype="bfloat16"),
               entry("old.sm_90a.acc1.f16", set_="old", groups=[[8, 1024, 512]])]
    gg = runtime.load(write_artifacts(tmp_path, kernels))
    rt = RecordingRuntime()
    gg._runtimes[0] = rt
    real = api.check_inputs

    def cpu_check_inputs(*call):
        from runtime.validate import _fast, check_structure

        got = _fast(*call, cuda=False)
        if got is None:
            check_structure(*call)
        shapes, _, ptrs = got
        return shapes, 0, ptrs

    def cpu_check_alpha(alpha, groups, ordinal):
        if tuple(alpha.shape) != (groups,) or alpha.dtype is not torch.float32:
            return check_alpha(alpha, groups, ordinal)  # the real message
        return alpha.data_ptr()

    monkeypatch.setattr(api, "check_inputs", cpu_check_inputs)
    monkeypatch.setattr(api, "check_alpha", cpu_check_alpha)
    assert real is not cpu_check_inputs
    return gg, rt


def test_alpha_address_reaches_every_launch_path(alpha_setup) -> None:
    gg, rt = alpha_setup
    a, b, sfa, sfb, out = call_args()
    alpha = torch.tensor([0.5, 2.0])
    ptrs = pointers(a, b, sfa, sfb, out)
    gg.grouped_gemm(a, b, sfa, sfb, out, alpha=alpha)
    assert rt.events[-1] == ("launch", ptrs, False, alpha.data_ptr())
    bound = gg.bind(a, b, sfa, sfb, out, alpha=alpha)
    bound()
    assert rt.events[-1] == ("cached", ptrs, alpha.data_ptr())
    gg.grouped_gemm(a, b, sfa, sfb, out)  # no alpha: address 0, the plan's ones
    assert rt.events[-1] == ("launch", ptrs, False)


def test_an_alpha_inside_an_output_is_refused_on_the_full_and_the_fast_path(
        alpha_setup, monkeypatch: pytest.MonkeyPatch) -> None:
    gg, rt = alpha_setup
    import types

    def plan(e, shapes):  # a plan seen twice: its calls are remembered for the fast path
        return types.SimpleNamespace(plan=types.SimpleNamespace(entry=e, num_groups=len(shapes)),
                                     uses=2)

    monkeypatch.setattr(rt, "plan", plan)
    a, b, sfa, sfb, out = call_args()
    alpha = torch.tensor([0.5, 2.0])
    ptrs = pointers(a, b, sfa, sfb, out)
    gg.grouped_gemm(a, b, sfa, sfb, out, alpha=alpha)
    gg.grouped_gemm(a, b, sfa, sfb, out, alpha=alpha)
    assert rt.events[-1] == ("cached", ptrs, alpha.data_ptr())  # the fast path
    inside = out[1].view(-1)[:4].view(torch.float32)  # alpha's 8 bytes in out[1]
    count = len(rt.events)
    for _ in range(2):  # the fast path declines (the guard passes), the full path names it
        with pytest.raises(InputError, match=r"^out\[1\] must not overlap any other argument, "
                                             r"but it overlaps alpha$"):
            gg.grouped_gemm(a, b, sfa, sfb, out, alpha=inside)
    assert len(rt.events) == count


def test_out_dtype_picks_the_kernel_and_allocates_its_type(alpha_setup) -> None:
    gg, rt = alpha_setup
    a, b, sfa, sfb, _ = call_args()
    got = gg.grouped_gemm(a, b, sfa, sfb, out_dtype=torch.bfloat16)
    assert [o.dtype for o in got] == [torch.bfloat16, torch.bfloat16]
    assert [tuple(o.shape) for o in got] == [(m, n) for m, n, _ in SHAPES]
    plans = [e for e in rt.events if e[0] == "plan"]
    assert plans[-1][1] == "dense.sm_90a.acc1.bf16"
    out = [torch.empty(m, n, dtype=torch.bfloat16) for m, n, _ in SHAPES]
    # Given outputs decide: bf16 outputs select the bf16 kernel whatever out_dtype says.
    gg.grouped_gemm(a, b, sfa, sfb, out, out_dtype=torch.float16)
    assert [e for e in rt.events if e[0] == "plan"][-1][1] == "dense.sm_90a.acc1.bf16"


def test_bad_alpha_or_out_dtype_launches_nothing(alpha_setup) -> None:
    gg, rt = alpha_setup
    a, b, sfa, sfb, out = call_args()
    with pytest.raises(InputError, match=r"^alpha must have shape \(2,\) \(one value per "
                                         r"group\), but got \(3,\)$"):
        gg.grouped_gemm(a, b, sfa, sfb, out, alpha=torch.ones(3))
    with pytest.raises(InputError, match=r"^alpha must have dtype torch.float32"):
        gg.bind(a, b, sfa, sfb, out, alpha=torch.ones(2, dtype=torch.float64))
    with pytest.raises(InputError, match=r"^out_dtype must be torch.float16 or torch.bfloat16"):
        gg.grouped_gemm(a, b, sfa, sfb, out_dtype=torch.float32)
    assert rt.events == []


def test_alpha_for_a_kernel_built_without_it_is_refused(alpha_setup) -> None:
    gg, rt = alpha_setup
    from test_runtime_cpu import group, lists

    a, b, sfa, sfb = lists(group(8, 1024, 512))
    with pytest.raises(InputError) as info:
        gg.grouped_gemm(a, b, sfa, sfb, alpha=torch.ones(1))
    assert str(info.value) == ("alpha was given, but kernel 'old.sm_90a.acc1.f16' takes no "
                               "alpha (built before alpha existed); rebuild the artifacts")
    assert not any(e[0] == "launch" for e in rt.events)


# ------------------------------------------------------------------ parameter packing


def test_alpha_table_is_packed_and_rewritten_per_launch() -> None:
    params = alpha_params()
    packed = pack_params(params, {"tma_a": bytes(128), "tma_b": bytes(128),
                                  "tma_sfa": bytes(128), "tma_sfb": bytes(128), "pointers": 1,
                                  "problem_sizes": 2, "cta_prefix": 3,
                                  "tensormap_workspace": 4, "alpha": 0x1234, "num_groups": 2})
    at = next(p.offset for p in params if p.name == "alpha")
    assert packed.has_alpha
    assert struct.unpack_from("<Q", packed.raw(), at) == (0x1234,)
    packed.set_tables(1, 2, 3, 4, 0, 0xABC0)
    assert struct.unpack_from("<Q", packed.raw(), at) == (0xABC0,)


def test_plan_ones_are_one_float32_per_group() -> None:
    e, _ = entry(params=alpha_params())
    plan = make_plan(e, ((192, 3072, 4096), (320, 3072, 4096), (0, 3072, 4096)), 132)
    ones = plan.plan_tables[plan.ones_offset:]
    assert ones == struct.pack("<3f", 1.0, 1.0, 1.0)
    assert plan.ones_offset % 128 == 0 and plan.ones_offset > plan.cta_prefix_offset
