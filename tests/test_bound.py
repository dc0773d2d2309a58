"""CPU tests of GroupedGemm.bind / BoundGemm (runtime/bound.py): a bound call is validated,
selected and planned once, then launches with no per-call checks. The device runtime is a
recording stand-in (the GPU tests run the real one), so these pin what the bound call asks of
it: which plan, which pointers, cached launch first, the full launch path when that declines.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from test_runtime_cpu import entry, group, lists, write_artifacts

import runtime
from runtime import api
from runtime.errors import InputError
from runtime.validate import _fast, check_structure

SHAPES = ((40, 3072, 4096), (8, 3072, 4096))


class RecordingRuntime:
    """What GroupedGemm asks of a device runtime, recorded (no GPU)."""

    arch, label = "sm_90a", "cpu (recording)"
    torch_device = torch.device("cpu")

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.tables: set[tuple[int, ...]] = set()  # pointer sets with a cached table
        self.capturing = False

    def plan(self, e, shapes):
        self.events.append(("plan", e.name, shapes))
        return types.SimpleNamespace(plan=types.SimpleNamespace(entry=e), uses=1)

    def launch(self, dp, ptrs, check, alpha=0) -> None:
        if check is not None:
            check()
        self.events.append(("launch", ptrs, check is None) + ((alpha,) if alpha else ()))
        self.tables.add(ptrs)

    def launch_cached(self, dp, ptrs, alpha=0) -> bool:
        if self.capturing or ptrs not in self.tables:
            return False
        self.events.append(("cached", ptrs) + ((alpha,) if alpha else ()))
        return True


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A dynamic-m kernel: it serves the SHAPES and the every-m-zero call alike.
    dyn = {"dynamic_m": {"groups": [[n, k] for _, n, k in SHAPES]}}
    gg = runtime.load(write_artifacts(tmp_path, [entry(constraints=dyn)]))
    rt = RecordingRuntime()
    gg._runtimes[0] = rt
    checks = []

    def cpu_check_inputs(*call):  # the validation without the CUDA-placement test
        checks.append(1)
        got = _fast(*call, cuda=False)
        if got is None:
            check_structure(*call)  # raises the detailed message
        shapes, _, ptrs = got
        return shapes, 0, ptrs

    monkeypatch.setattr(api, "check_inputs", cpu_check_inputs)
    return gg, rt, checks


def call_args():
    a, b, sfa, sfb = lists(*(group(m, n, k) for m, n, k in SHAPES))
    out = [torch.empty(m, n, dtype=torch.float16) for m, n, _ in SHAPES]
    return a, b, sfa, sfb, out


def pointers(*lists_) -> tuple[int, ...]:
    return tuple(t.data_ptr() for tensors in lists_ for t in tensors)


def test_bind_checks_once_then_launches_cached_with_the_bound_pointers(setup) -> None:
    gg, rt, checks = setup
    a, b, sfa, sfb, out = call_args()
    bound = gg.bind(a, b, sfa, sfb, out)
    assert checks == [1] and rt.events == [("plan", "dense.sm_90a.acc1.f16", SHAPES)]
    assert bound.kernel == "dense.sm_90a.acc1.f16" and repr(bound) == (
        "BoundGemm(kernel='dense.sm_90a.acc1.f16', groups=2)")
    ptrs = pointers(a, b, sfa, sfb, out)
    got = [bound() for _ in range(3)]
    # The first call builds the pointer table on the full path (overlap already checked at
    # bind time: no check passed); the rest are cached launches. Nothing is validated again.
    assert rt.events[1:] == [("launch", ptrs, True), ("cached", ptrs), ("cached", ptrs)]
    assert checks == [1]
    assert all(g[i] is out[i] for g in got for i in range(2))
    assert bound.out[0] is out[0] and bound.out is not bound.out  # a fresh list each time


def test_bound_call_takes_the_full_launch_path_when_the_cached_one_declines(setup) -> None:
    gg, rt, _ = setup
    a, b, sfa, sfb, out = call_args()
    bound = gg.bind(a, b, sfa, sfb, out)
    bound()
    rt.capturing = True  # e.g. under CUDA-graph capture: launch_cached returns False
    bound()
    ptrs = pointers(a, b, sfa, sfb, out)
    assert [e[0] for e in rt.events] == ["plan", "launch", "launch"]
    assert rt.events[-1] == ("launch", ptrs, True)


def test_bind_allocates_out_when_not_given(setup) -> None:
    gg, rt, _ = setup
    a, b, sfa, sfb, _ = call_args()
    bound = gg.bind(a, b, sfa, sfb)
    out = bound.out
    assert [tuple(c.shape) for c in out] == [(40, 3072), (8, 3072)]
    assert all(c.dtype == torch.float16 for c in out)
    bound()
    assert rt.events[-1] == ("launch", pointers(a, b, sfa, sfb, out), True)


def test_bind_rejects_an_overlapping_out_at_bind_time(setup) -> None:
    gg, rt, _ = setup
    a, b, sfa, sfb, out = call_args()
    on_b = b[0].view(torch.uint8).view(-1)[:40 * 3072 * 2].view(torch.float16).view(40, 3072)
    with pytest.raises(InputError, match=r"^out\[0\] must not overlap any other argument, but "
                                         r"it overlaps b_list\[0\]$"):
        gg.bind(a, b, sfa, sfb, [on_b, out[1]])
    assert not [e for e in rt.events if e[0] != "plan"]  # nothing launched


def test_bind_rejects_bad_input_with_grouped_gemms_message(setup) -> None:
    gg, rt, _ = setup
    a, b, sfa, sfb, out = call_args()
    bad = [a[0].view(torch.uint8).view(torch.int8)] + a[1:]
    with pytest.raises(InputError) as via_call:
        gg.grouped_gemm(bad, b, sfa, sfb, out=out)
    with pytest.raises(InputError) as via_bind:
        gg.bind(bad, b, sfa, sfb, out)
    assert str(via_bind.value) == str(via_call.value)
    assert "a_list[0]" in str(via_bind.value)
    assert rt.events == []


def test_bind_with_every_m_zero_launches_nothing(setup) -> None:
    gg, rt, _ = setup
    shapes = ((0, 3072, 4096), (0, 3072, 4096))
    a, b, sfa, sfb = lists(*(group(m, n, k) for m, n, k in shapes))
    out = [torch.empty(0, 3072, dtype=torch.float16) for _ in shapes]
    bound = gg.bind(a, b, sfa, sfb, out)
    assert bound.kernel is None and bound()[1] is out[1]
    assert rt.events == []


def test_bind_on_cpu_tensors_says_so_before_touching_cuda(tmp_path: Path) -> None:
    gg = runtime.load(write_artifacts(tmp_path, [entry()]))
    a, b, sfa, sfb = lists(group())
    with pytest.raises(runtime.InputError, match="^a_list\\[0\\] must be a CUDA tensor, but got "
                                                 "a tensor on cpu$"):
        gg.bind(a, b, sfa, sfb)
