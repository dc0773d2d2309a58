"""CPU tests of the masked layout's host side (issue 27, runtime/masked.py): the spec option,
kernel choice, every argument error, the launch's parameters (fake driver) and the torch op's
fake. The kernel itself (kernels/sm90/offsets.py, Config.masked) runs in tests/test_masked_gpu.py
(on the H200 since the nineteenth session: bench/RESULTS.md)."""

from __future__ import annotations

import struct

import pytest
import torch
from test_dynamic_m import dev  # noqa: F401 - the fake-driver device fixture, used by name
from test_runtime_cpu import _params, _tma, entry

from builder.errors import SpecError
from builder.families import load_families
from builder.spec import parse_spec_text
from runtime.dispatch import KernelIndex
from runtime.errors import InputError, NoKernelError
from runtime.formats import blocked_scale_numel
from runtime.masked import check_masked, select_masked
from runtime.serving import select_serving

E, N, K, MAX_M = 4, 256, 512, 64


def masked_params():
    """The ABI kernels/sm90/offsets.py records with Config.masked."""
    return _params(
        [_tma(op) for op in ("b", "a", "sfb", "sfa")]
        + [(op, "operand", 8, 8, {"operand": op})
           for op in ("masked_m", "a", "b", "sfa", "sfb", "c")]
        + [("tensormap_workspace", "table", 8, 8, {"table": "tensormap_workspace"}),
           ("grid_barrier", "table", 8, 8, {"table": "grid_barrier"}),
           ("alpha", "table", 8, 8, {"table": "alpha"})]
        + [(v, "scalar", 4, 4, {"value": v}) for v in ("num_groups", "max_m", "n", "k")])


def masked_entry(name="lay_masked.sm_90a.acc1.bf16", max_m=None):
    e, _ = entry(name, set_=name.split(".")[0], params=masked_params(), out_dtype="bfloat16",
                 constraints={"dynamic_m": {"groups": [[N, K]] * E, "max_m": max_m}})
    return e


def test_spec_masked_needs_an_expert_set() -> None:
    fams = load_families()
    head = "schema_version: 1\ndefaults: {archs: [sm_90a]}\nsets:\n"
    spec = parse_spec_text(head + "  - {name: lay, experts: 8, n: 512, k: 1024, options: "
                           "{sm_90a: {masked: true}}}\n", "shapes.yaml", fams)
    assert dict(spec.sets[0].builds[0].options) == {"masked": True, "device_offsets": True}
    with pytest.raises(SpecError) as info:
        parse_spec_text(head + "  - {name: lay, m: dynamic, groups: [[512, 1024]], options: "
                        "{sm_90a: {masked: true}}}\n", "shapes.yaml", fams)
    assert "masked needs device_offsets: true" in str(info.value)


def test_masked_kernels_serve_masked_grouped_mm_only() -> None:
    masked = masked_entry()
    small = masked_entry("lay_masked_decode.sm_90a.acc1.bf16", max_m=32)
    assert masked.takes_masked and masked.takes_offsets
    assert select_masked((masked, small), "sm_90a", E, N, K, 16, "bfloat16") is small
    assert select_masked((masked, small), "sm_90a", E, N, K, 33, "bfloat16") is masked
    with pytest.raises(NoKernelError) as info:
        select_masked((masked,), "sm_90a", E, N, K, 16, "float16")
    assert str(info.value).startswith(
        f"no built kernel serves masked_grouped_mm with E = {E} experts of (N, K) = ({N}, {K}) "
        "and float16 output on sm_90a (rows hint 16); nothing was launched.")
    with pytest.raises(NoKernelError):  # scaled_grouped_mm never takes a masked kernel
        select_serving((masked,), "sm_90a", E, N, K, 64, "bfloat16")
    with pytest.raises(NoKernelError):  # nor does the list API
        KernelIndex((masked,)).select(tuple((5, N, K) for _ in range(E)), "sm_90a",
                                      out_dtype="bfloat16")


def args(**over):
    a = dict(a=torch.zeros(E, MAX_M, K // 2, dtype=torch.uint8),
             b=torch.zeros(E, N, K // 2, dtype=torch.uint8),
             sfa=torch.zeros(E, blocked_scale_numel(MAX_M, K), dtype=torch.uint8),
             sfb=torch.zeros(E, blocked_scale_numel(N, K), dtype=torch.uint8),
             masked_m=torch.zeros(E, dtype=torch.int32), expected_m=None, alpha=None, out=None,
             out_dtype=torch.bfloat16)
    a.update(over)
    return a


@pytest.mark.parametrize("over, message", [
    ({"a": torch.zeros(MAX_M, K // 2, dtype=torch.uint8)},
     "a must be 3-D (E, max_m, K/2) packed fp4, but got shape (64, 256)"),
    ({"b": torch.zeros(E, N, K // 4, dtype=torch.uint8)},
     f"b must have shape (E, N, K/2) = ({E}, N, {K // 2}) (a's E and K/2), but got "
     f"({E}, {N}, {K // 4})"),
    ({"masked_m": torch.zeros(E + 1, dtype=torch.int32)},
     f"masked_m must have shape ({E},) (one row count per expert), but got ({E + 1},)"),
    ({"masked_m": torch.zeros(E, dtype=torch.int64)},
     "masked_m must have dtype torch.int32, but got torch.int64"),
    ({"sfa": torch.zeros(E, 10, dtype=torch.uint8)},
     f"sfa must have {E * blocked_scale_numel(MAX_M, K)} elements ((E, round_up({MAX_M}, 128) "
     f"* round_up(K/16, 4)) blocked), but got {E * 10}"),
    ({"expected_m": -1}, "expected_m must be None or an int >= 0 (a host hint of the rows per "
                         "expert), but got -1"),
    ({"out": torch.zeros(E, MAX_M, N + 8, dtype=torch.bfloat16)},
     f"out must have shape (E, max_m, N) = ({E}, {MAX_M}, {N}), but got ({E}, {MAX_M}, "
     f"{N + 8})"),
    ({}, "a must be a CUDA tensor, but got a tensor on cpu"),
])
def test_argument_errors(over, message) -> None:
    with pytest.raises(InputError) as info:
        check_masked(**args(**over))
    assert str(info.value).startswith(message), str(info.value)


def test_launch_writes_masked_m_and_max_m(dev) -> None:  # noqa: F811
    from test_dynamic_m import TEMPLATES

    e = masked_entry()
    templates = {f"tma_{op}": TEMPLATES[f"tma_{op}"] for op in ("a", "b", "sfa", "sfb")}
    loaded = type("Loaded", (), {"function": dev.drv.real.CUfunction(0x5000)})()
    prepared = dev.mod.PreparedKernel(loaded=loaded, templates=templates)
    op = dev.mod.OffsetsPlan(e, prepared, 132, 4096,
                             {"num_groups": E, "rows": E * MAX_M, "n": N, "k": K,
                              "max_m": MAX_M}, ones=0xABC000)
    dev.rt.launch_offsets(op, (0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000), 0)
    raw = op._slot()[0].raw()
    at = {p.operand or p.value: p for p in e.params if p.kind in ("operand", "scalar")}
    assert struct.unpack_from("<Q", raw, at["masked_m"].offset)[0] == 0x1000
    assert struct.unpack_from("<Q", raw, at["c"].offset)[0] == 0x6000
    assert struct.unpack_from("<I", raw, at["max_m"].offset)[0] == MAX_M
    assert len(dev.drv.launches) == 1


def test_torch_op_fake_gives_e_by_max_m_by_n() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    import runtime.torch_op  # noqa: F401 - registers the ops

    with FakeTensorMode():
        a = args()
        out = torch.ops.nvfp4.masked_grouped_mm(a["a"], a["b"], a["sfa"], a["sfb"],
                                                a["masked_m"], 16)
        assert tuple(out.shape) == (E, MAX_M, N) and out.dtype == torch.bfloat16
        with pytest.raises(InputError) as info:
            torch.ops.nvfp4.masked_grouped_mm(a["a"], a["b"], a["sfa"], a["sfb"],
                                              torch.zeros(E, dtype=torch.int64))
        assert "masked_m must be a 1-D torch.int32 tensor" in str(info.value)
        # The eager call's size checks and expected_m's range, at trace time.
        with pytest.raises(InputError) as info:
            torch.ops.nvfp4.masked_grouped_mm(a["a"], a["b"], a["sfa"][:, :100], a["sfb"],
                                              a["masked_m"], 16)
        assert str(info.value).startswith(f"sfa must have {E * blocked_scale_numel(MAX_M, K)} "
                                          f"elements")
        with pytest.raises(InputError) as info:
            torch.ops.nvfp4.masked_grouped_mm(a["a"], a["b"], a["sfa"], a["sfb"],
                                              a["masked_m"], -5)
        assert str(info.value) == ("expected_m must be -1 (none) or an int >= 0 (a host hint "
                                   "of the rows per expert), but got -5")
