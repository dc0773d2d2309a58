"""Dynamic m (issue 5) and the host fast path, on CPU.

- builder: a `m: dynamic` set becomes build items with (n, k) groups, served by the kernel of
  its config (manifest schema 2: an exact set of the same config shares it), a placeholder
  (m, n, k) list for the family's compile_kernel, and the set record's `serves.dynamic_m`
  (end to end through real worker subprocesses, fake family);
- dispatch: the record's parsing, exact-first selection, max_m, m * n < 2^31, messages;
- api: every m = 0 launches nothing; a repeated validated call takes the fast path, and every
  change that validation would look at sends it back to the full path;
- device: the launch path against a fake driver: per-stream workspaces, cached pointer tables,
  capture, context switching.

The GPU halves (real kernels, 20 random m vectors bit-exact) are in tests/test_runtime_gpu.py.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import struct
import threading
import types
from pathlib import Path

import pytest
import torch
from conftest import Fake
from test_runtime_cpu import TEMPLATES, entry, fake_cubin, swap, write_artifacts

import runtime
from builder.build import build
from builder.errors import BuildError
from builder.families import load_families
from builder.plan import DYNAMIC_M_PLACEHOLDER, BuildItem, expand
from builder.report import served_groups
from builder.spec import parse_spec_text
from builder.worker import kernel_limits
from runtime import api, device_tables
from runtime.dispatch import KernelIndex, dynamic_groups
from runtime.entry_rules import check_kernel
from runtime.errors import InputError, ManifestError, NoKernelError
from runtime.manifest import Serves, load_manifest, make_manifest, parse_manifest
from runtime.nvfp4 import make_grouped_problem, reference_grouped_gemm
from runtime.plan import make_plan
from runtime.validate import _fast, blocked_scale_numel

FP4 = torch.float4_e2m1fn_x2
E4M3 = torch.float8_e4m3fn

SPEC = """\
schema_version: 1
defaults:
  archs: [sm_90a, sm_100a]
  acc_stages: {sm_100a: [1, 2], sm_90a: [1]}
  out_dtypes: [float16]
sets:
  - name: moe
    groups: [[80, 4096, 7168], [176, 7168, 2048]]
  - name: moe_any_m
    m: dynamic
    groups: [[4096, 7168], [7168, 2048]]
    max_m: 4096
  - name: moe_any_m_unbounded
    m: dynamic
    groups: [[4096, 7168], [7168, 2048]]
"""


def items_of(fake: Fake, text: str = SPEC) -> dict[str, BuildItem]:
    fams = load_families(fake.module)
    return {it.name: it for it in expand(parse_spec_text(text, "shapes.yaml", fams), fams)}


# ------------------------------------------------------------------ builder


def test_dynamic_items_carry_n_k_groups_and_share_their_config_s_kernel(fake: Fake) -> None:
    items = items_of(fake)
    dyn = items["moe_any_m.sm_90a.acc1.f16"]
    assert (dyn.groups, dyn.dynamic_m, dyn.max_m) == (((4096, 7168), (7168, 2048)), True, 4096)
    assert dyn.compile_groups() == [[4096, 4096, 7168], [4096, 7168, 2048]]
    free = items["moe_any_m_unbounded.sm_90a.acc1.f16"]
    assert (free.dynamic_m, free.max_m) == (True, None)
    assert free.compile_groups() == [[DYNAMIC_M_PLACEHOLDER, 4096, 7168],
                                     [DYNAMIC_M_PLACEHOLDER, 7168, 2048]]
    exact = items["moe.sm_90a.acc1.f16"]
    assert (exact.dynamic_m, exact.max_m) == (False, None)
    assert exact.compile_groups() == [[80, 4096, 7168], [176, 7168, 2048]]
    for it in items.values():  # survives the JSON trip to a worker
        assert BuildItem.from_dict(json.loads(json.dumps(it.to_dict()))) == it
    # The key is the kernel's: one config, one kernel for the exact and both dynamic sets;
    # dynamic_m and max_m change only what the set records it serves.
    for name, it in items.items():
        same = name.replace("moe_any_m_unbounded.", "moe.").replace("moe_any_m.", "moe.")
        assert it.key == items[same].key, name
    assert len({it.key for it in items.values()}) == 3  # sm_90a acc1, sm_100a acc1 and acc2
    assert dyn.serves().record() == {"dynamic_m": {"groups": [[4096, 7168], [7168, 2048]],
                                                   "max_m": 4096}}
    assert free.serves().record() == {"dynamic_m": {"groups": [[4096, 7168], [7168, 2048]],
                                                    "max_m": None}}
    assert exact.serves().record() == {"groups": [[80, 4096, 7168], [176, 7168, 2048]]}
    bumped = items_of(fake, SPEC.replace("max_m: 4096", "max_m: 2048"))
    assert {n: it.key for n, it in bumped.items()} == {n: it.key for n, it in items.items()}
    assert bumped["moe_any_m.sm_90a.acc1.f16"].serves().max_m == 2048
    # An old job file (no dynamic fields) still reads as an exact item.
    d = exact.to_dict()
    del d["dynamic_m"], d["max_m"]
    assert BuildItem.from_dict(d) == exact


def test_kernel_limits_come_from_the_family_s_constraints_and_nothing_else(fake: Fake) -> None:
    """The worker keeps the family's per-group limits for the kernel record; the groups it gave
    the family must come back unchanged, and no other key may ride along (the builder writes
    what each set serves)."""
    items = items_of(fake)
    exact, dyn = items["moe.sm_90a.acc1.f16"], items["moe_any_m.sm_90a.acc1.f16"]
    family = {"groups": dyn.compile_groups(), "k_multiple": 256, "n_multiple": 8}
    assert kernel_limits(dyn, family) == {"k_multiple": 256, "n_multiple": 8}
    assert kernel_limits(exact, {"groups": exact.compile_groups()}) == {}
    with pytest.raises(BuildError) as info:
        kernel_limits(dyn, {"groups": [[128, 4096, 7168]], "k_multiple": 256})
    assert str(info.value) == (
        "moe_any_m.sm_90a.acc1.f16: compile_kernel must record the groups it was given as "
        "constraints.groups ([[4096, 4096, 7168], [4096, 7168, 2048]]), but it recorded "
        "[[128, 4096, 7168]]")
    with pytest.raises(BuildError) as info:
        kernel_limits(dyn, {**family, "dynamic_m": True})
    assert str(info.value) == ("moe_any_m.sm_90a.acc1.f16: constraints may hold groups and "
                               "['k_multiple', 'n_multiple'] only, but got ['dynamic_m']")


def test_pipeline_builds_a_dynamic_set_the_runtime_serves(fake: Fake, tmp_path: Path) -> None:
    fams = load_families(fake.module)
    items = expand(parse_spec_text(SPEC, "shapes.yaml", fams), fams)
    out = tmp_path / "artifacts"
    build(items, out, fams, jobs=2)
    m = load_manifest(out)
    assert len(m.sets) == 9 and len(m.kernels) == 3  # one kernel per arch and acc stages
    kernels = {e.name: e for e in m.sets}
    assert kernels["moe_any_m.sm_90a.acc1.f16"].kernel == kernels["moe.sm_90a.acc1.f16"].kernel
    assert kernels["moe_any_m.sm_90a.acc1.f16"].serves.record() == {
        "dynamic_m": {"groups": [[4096, 7168], [7168, 2048]], "max_m": 4096}}
    assert kernels["moe_any_m.sm_90a.acc1.f16"].constraints == {
        "dynamic_m": {"groups": [[4096, 7168], [7168, 2048]], "max_m": 4096}, "k_multiple": 256}
    assert kernels["moe_any_m_unbounded.sm_100a.acc2.f16"].constraints == {
        "dynamic_m": {"groups": [[4096, 7168], [7168, 2048]], "max_m": None}, "k_multiple": 256}
    assert kernels["moe.sm_90a.acc1.f16"].constraints == {
        "groups": [[80, 4096, 7168], [176, 7168, 2048]], "k_multiple": 256}
    # Each kernel compiled once, with the rows of the first set (by name) it serves: moe's.
    assert sorted(fake.compiles()) == [
        "fake100 sm_100a acc1 [[80, 4096, 7168], [176, 7168, 2048]]",
        "fake100 sm_100a acc2 [[80, 4096, 7168], [176, 7168, 2048]]",
        "fake90 sm_90a acc1 [[80, 4096, 7168], [176, 7168, 2048]]"]
    index = runtime.load(out).index
    assert index.select(((80, 4096, 7168), (176, 7168, 2048)), "sm_90a").name == "moe.sm_90a.acc1.f16"
    for ms in ((0, 0), (0, 5), (81, 4096), (4096, 1)):
        shapes = ((ms[0], 4096, 7168), (ms[1], 7168, 2048))
        assert index.select(shapes, "sm_90a").name == "moe_any_m.sm_90a.acc1.f16", ms
    over = ((4097, 4096, 7168), (1, 7168, 2048))
    assert index.select(over, "sm_90a").name == "moe_any_m_unbounded.sm_90a.acc1.f16"
    # Incremental: a second build compiles nothing.
    before = len(fake.compiles())
    report = build(items, out, fams, jobs=2)
    assert not report.changed and len(fake.compiles()) == before


def test_report_lists_what_dynamic_kernels_serve() -> None:
    same = {"dynamic_m": {"groups": [[4096, 7168]] * 8, "max_m": 4096}, "k_multiple": 256}
    assert served_groups(same) == "8: any m <= 4096, n 4096, k 7168"
    mixed = {"dynamic_m": {"groups": [[1024, 512], [2048, 768]], "max_m": None}}
    assert served_groups(mixed) == "2: any m, 1024x512, 2048x768"
    assert served_groups({"groups": [[40, 256, 512]]}) == "1: m 40, n 256, k 512"


# ------------------------------------------------------------------ dispatch

NK = [[4096, 7168], [7168, 2048]]


def dyn_entry(name: str = "moe_any_m.sm_90a.acc1.f16", groups: list = NK, max_m: int | None = 4096,
              **over):
    e, _ = entry(name, set_=name.split(".")[0],
                 constraints={"dynamic_m": {"groups": groups, "max_m": max_m},
                              "k_multiple": 256, "n_multiple": 8}, **over)
    return e


def test_dispatch_reads_the_dynamic_m_record() -> None:
    e = dyn_entry()
    assert dynamic_groups(e) == (((4096, 7168), (7168, 2048)), 4096)
    assert dynamic_groups(entry()[0]) is None


_FORM = ('{"groups": [[n, k], ...], "max_m": int or null} or '
         '{"experts": E, "group": [n, k], "max_m": int or null}')
_CHECKED = "kernel 'bad.sm_90a.acc1.f16': serves.dynamic_m"


@pytest.mark.parametrize("serves,message", [
    ({"dynamic_m": True}, f"m.sets[0].serves.dynamic_m must be an object {_FORM}, but got True"),
    ({"dynamic_m": {"max_m": 4}},
     f"m.sets[0].serves.dynamic_m must be an object {_FORM}, but got {{'max_m': 4}}"),
    ({"dynamic_m": {"groups": NK, "max_m": None}, "groups": [[1, 4096, 7168]]},
     "m.sets[0].serves must have either groups (exact shapes) or dynamic_m, not both"),
    ({"dynamic_m": {"groups": [], "max_m": None}},
     "m.sets[0].serves.dynamic_m.groups must be a non-empty list, but got []"),
    ({"dynamic_m": {"groups": [[1, 4096, 7168]], "max_m": None}},
     "m.sets[0].serves.dynamic_m.groups[0] must be a list of 2 ints, but got [1, 4096, 7168]"),
    ({"dynamic_m": {"groups": [[4096, 0]], "max_m": None}},
     f"{_CHECKED}.groups[0] must have n, k > 0, but got [4096, 0]"),
    # An expert set's E equal rows are parsed and checked as one (manifest._rows): a row that
    # differs only in type, or a bad value in every row, is still found and named.
    ({"dynamic_m": {"groups": [[4096, 7168]] * 5 + [[4096.0, 7168]] + [[4096, 7168]] * 2,
                    "max_m": None}},
     "m.sets[0].serves.dynamic_m.groups[5] must be a list of 2 ints, but got [4096.0, 7168]"),
    ({"dynamic_m": {"groups": [[4096, 7168]] * 3 + [[4096, True]], "max_m": None}},
     "m.sets[0].serves.dynamic_m.groups[3] must be a list of 2 ints, but got [4096, True]"),
    ({"dynamic_m": {"groups": [[4096, -1]] * 4, "max_m": None}},
     f"{_CHECKED}.groups[0] must have n, k > 0, but got [4096, -1]"),
    ({"dynamic_m": {"groups": [[4096, 7168]] * 3 + [[4096, -1]], "max_m": None}},
     f"{_CHECKED}.groups[3] must have n, k > 0, but got [4096, -1]"),
    ({"dynamic_m": {"groups": NK, "max_m": 0}},
     f"{_CHECKED}.max_m must be a positive int below 2^31 or null, but got 0"),
    ({"dynamic_m": {"groups": NK, "max_m": True}},
     "m.sets[0].serves.dynamic_m.max_m must be a positive int or null, but got True"),
    # The expert-set form (schema 3): E and one (n, k).
    ({"dynamic_m": {"experts": 4, "group": [4096, 7168], "groups": NK, "max_m": None}},
     f"m.sets[0].serves.dynamic_m must be an object {_FORM}, but got {{'experts': 4, 'group': "
     f"[4096, 7168], 'groups': [[4096, 7168], [7168, 2048]], 'max_m': None}}"),
    ({"dynamic_m": {"experts": 0, "group": [4096, 7168], "max_m": None}},
     "m.sets[0].serves.dynamic_m.experts must be a positive int, but got 0"),
    ({"dynamic_m": {"experts": 1025, "group": [4096, 7168], "max_m": None}},
     "m.sets[0].serves.dynamic_m.experts must be at most 1024 (the groups a set may have), but "
     "got 1025"),
    ({"dynamic_m": {"experts": True, "group": [4096, 7168], "max_m": None}},
     "m.sets[0].serves.dynamic_m.experts must be int, but got bool"),
    ({"dynamic_m": {"experts": 4, "group": [4096, 7168, 1], "max_m": None}},
     "m.sets[0].serves.dynamic_m.group must have 2 entries, but has 3"),
    ({"dynamic_m": {"experts": 4, "group": [4096, 7168.0], "max_m": None}},
     "m.sets[0].serves.dynamic_m.group[1] must be int, but got float"),
    ({"dynamic_m": {"experts": 4, "max_m": None}},
     "m.sets[0].serves.dynamic_m.group is missing"),
    # A key the schema does not have: a misspelled max_m was ignored, dropping the bound.
    ({"dynamic_m": {"groups": NK, "maxm": 64}},
     "m.sets[0].serves.dynamic_m has unknown key(s) ['maxm']: it must be an object "
     '{"groups": [[n, k], ...], "max_m": int or null}'),
    ({"dynamic_m": {"experts": 4, "group": [4096, 7168], "max_m": None, "max_M": 64}},
     "m.sets[0].serves.dynamic_m has unknown key(s) ['max_M']: it must be an object "
     '{"experts": E, "group": [n, k], "max_m": int or null}'),
    ({"dynamic_m": {"experts": 4, "group": [4096, 7168], "max_m": None}, "max_m": 64},
     "m.sets[0].serves has unknown key(s) ['max_m']: it must be an object "
     '{"groups": [[m, n, k], ...]} or {"dynamic_m": {...}}'),
    ({"groups": [[1, 4096, 7168]], "dynamic": True},
     "m.sets[0].serves has unknown key(s) ['dynamic']: it must be an object "
     '{"groups": [[m, n, k], ...]} or {"dynamic_m": {...}}'),
    ({"dynamic_m": {"experts": 4, "group": [4096, -1], "max_m": None}},
     f"{_CHECKED}.groups[0] must have n, k > 0, but got [4096, -1]"),
])
def test_manifest_rejects_malformed_dynamic_m(serves: dict, message: str) -> None:
    """The set record's serves is checked once, at parse (load, verify, package, reuse)."""
    obj = json.loads(make_manifest([dyn_entry("bad.sm_90a.acc1.f16")], "t", "d").to_json())
    obj["sets"][0]["serves"] = serves
    with pytest.raises(ManifestError) as info:
        parse_manifest(obj, "m")
    assert str(info.value) == message


def test_dispatch_serves_any_m_exact_first() -> None:
    exact, _ = entry("moe.sm_90a.acc1.f16", set_="moe", groups=[[80, 4096, 7168], [176, 7168, 2048]])
    dyn = dyn_entry()
    index = KernelIndex([dyn, exact])
    assert index.select(((80, 4096, 7168), (176, 7168, 2048)), "sm_90a") is exact
    for ms in ((0, 0), (1, 0), (0, 4096), (13, 77), (4096, 4096)):
        assert index.select(((ms[0], 4096, 7168), (ms[1], 7168, 2048)), "sm_90a") is dyn, ms
    for shapes in (((5, 7168, 2048), (5, 4096, 7168)),  # (n, k) order matters
                   ((5, 4096, 7168),),  # group count
                   ((5, 4096, 7168), (5, 7168, 2048), (5, 7168, 2048))):
        with pytest.raises(NoKernelError):
            index.select(shapes, "sm_90a")
    with pytest.raises(NoKernelError):
        index.select(((1, 4096, 7168), (1, 7168, 2048)), "sm_100a")  # no sm_100a kernel


def test_dispatch_over_max_m_names_the_bound() -> None:
    index = KernelIndex([dyn_entry()])
    with pytest.raises(NoKernelError) as info:
        index.select(((4097, 4096, 7168), (5000, 7168, 2048)), "sm_90a", "cuda:0")
    assert str(info.value).splitlines()[:4] == [
        "no built kernel serves 2 group(s) with (m, n, k) = [(4097, 4096, 7168), "
        "(5000, 7168, 2048)] and float16 output on cuda:0 (sm_90a); nothing was launched.",
        "Kernel moe_any_m.sm_90a.acc1.f16 has these (n, k) but serves m <= 4096 only; "
        "(group, m) over it: [(0, 4097), (1, 5000)].",
        "Built kernels (1):",
        "  - set 'moe_any_m' sm_90a float16 (moe_any_m.sm_90a.acc1.f16): any m <= 4096, (n, k) = "
        "[(4096, 7168), (7168, 2048)]",
    ]


def test_dispatch_unbounded_m_still_keeps_m_times_n_in_32_bits() -> None:
    index = KernelIndex([dyn_entry(max_m=None)])
    ok = ((2**31 // 4096 - 1, 4096, 7168), (0, 7168, 2048))
    assert index.select(ok, "sm_90a").name == "moe_any_m.sm_90a.acc1.f16"
    with pytest.raises(InputError) as info:
        index.select(((1, 4096, 7168), (299594, 7168, 2048)), "sm_90a")
    assert str(info.value) == ("a_list[1].shape[0] (m) must keep m * n < 2^31 (the kernels index "
                               "C with 32-bit offsets; n = 7168), but got 299594")


# ------------------------------------------------------------------ m = 0 inputs


def test_make_grouped_problem_and_reference_handle_m_zero() -> None:
    groups = [(0, 256, 512), (5, 128, 256), (0, 128, 256)]
    prob = make_grouped_problem(groups, seed=3, values="full", scale_exp=(0, 6),
                                scale_exp_b=(-6, -3))
    assert [tuple(t.shape) for t in prob.a] == [(0, 256), (5, 128), (0, 128)]
    assert [t.numel() for t in prob.sfa] == [0, blocked_scale_numel(5, 256), 0]
    ref = reference_grouped_gemm(prob.a, prob.b, prob.sfa, prob.sfb, groups)
    assert [tuple(r.shape) for r in ref] == [(0, 256), (5, 128), (0, 128)]
    # The call's structure is valid, m = 0 groups included (empty a, empty scales).
    out = [torch.empty(m, n, dtype=torch.float16) for m, n, _ in groups]
    shapes, _, _ = _fast(prob.a, prob.b, prob.sfa, prob.sfb, out, cuda=False)
    assert shapes == tuple(groups)


# ------------------------------------------------------------------ api: fake device runtime


class FakeRT:
    """What GroupedGemm needs of a DeviceRuntime, recording plans and launches."""

    def __init__(self, entry_) -> None:
        self.arch, self.label = "sm_90a", "cuda:0 (fake)"
        self.torch_device = torch.device("cpu")
        self.plans: dict = {}
        self.launches: list[tuple] = []
        self.cached: set = set()
        self.cached_calls = 0
        self.cached_result: bool | None = None  # None: answer from `cached`

    def plan(self, e, shapes):
        dp = self.plans.get((e.name, shapes))
        if dp is None:
            dp = self.plans[(e.name, shapes)] = types.SimpleNamespace(
                plan=make_plan(e, shapes, 132), uses=0, serial=len(self.plans))
        dp.uses += 1
        return dp

    def launch(self, dp, ptrs, check, alpha=0):
        if (dp.serial, ptrs) not in self.cached and check is not None:
            check()
        self.cached.add((dp.serial, ptrs))
        self.launches.append(("full", dp.serial, ptrs))

    def launch_cached(self, dp, ptrs, alpha=0):
        self.cached_calls += 1
        hit = (dp.serial, ptrs) in self.cached if self.cached_result is None \
            else self.cached_result
        if hit:
            self.launches.append(("fast", dp.serial, ptrs))
        return hit


def problem(ms=(40, 0), nk=((256, 512), (128, 256)), a_dtype=FP4):
    a = [torch.zeros(m, k // 2, dtype=torch.uint8).view(a_dtype) for m, (_, k) in zip(ms, nk)]
    b = [torch.zeros(n, k // 2, dtype=torch.uint8).view(a_dtype) for n, k in nk]
    sfa = [torch.zeros(blocked_scale_numel(m, k), dtype=torch.uint8).view(E4M3)
           for m, (_, k) in zip(ms, nk)]
    sfb = [torch.zeros(blocked_scale_numel(n, k), dtype=torch.uint8).view(E4M3) for n, k in nk]
    out = [torch.empty(m, n, dtype=torch.float16) for m, (n, _) in zip(ms, nk)]
    return a, b, sfa, sfb, out


@pytest.fixture
def gg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A GroupedGemm over one dynamic-m kernel, CPU tensors accepted as if on cuda:0."""
    e = dyn_entry("small_any_m.sm_90a.acc1.f16", groups=[[256, 512], [128, 256]], max_m=None)
    g = runtime.load(write_artifacts(tmp_path / "art", [(e, fake_cubin("sm_90a"))]))
    rt = FakeRT(e)
    g._runtimes[0] = rt

    def cpu_check_inputs(*args):
        fast = _fast(*args, cuda=False)
        if fast is None:
            raise InputError("rejected by the CPU stand-in of check_inputs")
        shapes, _, ptrs = fast
        return shapes, 0, ptrs

    monkeypatch.setattr(api, "check_inputs", cpu_check_inputs)
    g.rt = rt
    return g


def ptrs_of(*lists) -> tuple[int, ...]:
    return tuple(t.data_ptr() for t in itertools.chain(*lists))


def test_all_m_zero_plans_and_launches_nothing(gg) -> None:
    a, b, sfa, sfb, out = problem(ms=(0, 0))
    got = gg.grouped_gemm(a, b, sfa, sfb)
    assert [tuple(c.shape) for c in got] == [(0, 256), (0, 128)]
    assert [c.dtype for c in got] == [torch.float16] * 2
    assert gg.grouped_gemm(a, b, sfa, sfb, out=out) == out
    assert gg.rt.plans == {} and gg.rt.launches == []


def test_repeated_call_takes_the_fast_path(gg) -> None:
    a, b, sfa, sfb, out = problem()
    ptrs = ptrs_of(a, b, sfa, sfb, out)
    for _ in range(2):  # first: new plan; second: plan hit -> signature remembered
        assert gg.grouped_gemm(a, b, sfa, sfb, out=out) == out
    assert [k for k, *_ in gg.rt.launches] == ["full", "full"]
    assert len(gg._signatures[(2, False)]) == 1
    assert gg.grouped_gemm(a, b, sfa, sfb, out=tuple(out)) == out
    assert gg.rt.launches[-1] == ("fast", 0, ptrs)
    # Fresh tensors with the same shapes and the same pointers (the caching allocator's common
    # case) hit too: the guard is about types, dtypes, shapes, strides and devices only.
    a2 = [t.view(torch.uint8).view(FP4) for t in a]
    gg.grouped_gemm(a2, b, sfa, sfb, out=out)
    assert gg.rt.launches[-1] == ("fast", 0, ptrs)
    assert len(gg._signatures[(2, False)]) == 1


def test_anything_validation_reads_sends_the_call_back_to_the_full_path(gg) -> None:
    a, b, sfa, sfb, out = problem()
    for _ in range(3):
        gg.grouped_gemm(a, b, sfa, sfb, out=out)
    assert gg.rt.launches[-1][0] == "fast"
    fast_calls = gg.rt.cached_calls
    variants = {
        "uint8 a": ([a[0].view(torch.uint8), a[1]], b, sfa, sfb, out),
        "other m": (*problem(ms=(41, 0))[:4], problem(ms=(41, 0))[4]),
        "strided out": (a, b, sfa, sfb, [torch.empty(256, 40, dtype=torch.float16).t(), out[1]]),
        "one group": (a[:1], b[:1], sfa[:1], sfb[:1], out[:1]),
        "lists of unequal length": (a, b + b[:1], sfa, sfb, out),
        "a generator": ((t for t in a), b, sfa, sfb, out),
        "requires_grad out": (a, b, sfa, sfb, [out[0].clone().requires_grad_(), out[1]]),
        "a Parameter": (a, [torch.nn.Parameter(b[0], requires_grad=False), b[1]], sfa, sfb, out),
        "no out": (a, b, sfa, sfb, None),
    }
    for what, args in variants.items():
        try:
            gg.grouped_gemm(*args)
        except (InputError, NoKernelError):
            pass
        assert gg.rt.cached_calls == fast_calls, what  # never reached launch_cached
    # Same signature but a pointer set never validated: the fast path declines, the full path
    # validates it (the overlap check runs) and launches.
    gg.rt.cached_result = False
    out2 = [torch.empty_like(c) for c in out]
    gg.grouped_gemm(a, b, sfa, sfb, out=out2)
    assert gg.rt.cached_calls == fast_calls + 1
    assert gg.rt.launches[-1] == ("full", 0, ptrs_of(a, b, sfa, sfb, out2))


def test_fast_path_never_accepts_an_overlapping_out(gg) -> None:
    a, b, sfa, sfb, out = problem()
    for _ in range(3):
        gg.grouped_gemm(a, b, sfa, sfb, out=out)
    # An out that overlaps b[0], with out[0]'s shape, dtype and strides: the guard passes,
    # the pointer set is new, so the full path's overlap check runs and refuses it.
    pool = torch.zeros(256 * 256 + 40 * 256 * 2, dtype=torch.uint8)
    b0 = pool[:256 * 256].view(FP4).view(256, 256)
    bad = pool[1024:1024 + 40 * 256 * 2].view(torch.float16).view(40, 256)
    with pytest.raises(InputError, match=r"^out\[0\] must not overlap any other argument, but "
                                         r"it overlaps b_list\[0\]$"):
        gg.grouped_gemm(a, [b0, b[1]], sfa, sfb, out=[bad, out[1]])


def test_signatures_are_capped_per_group_count(gg) -> None:
    for m in range(api.SIGNATURES_PER_COUNT + 3):
        args = problem(ms=(m + 1, 3))
        for _ in range(2):
            gg.grouped_gemm(*args[:4], out=args[4])
    assert len(gg._signatures[(2, False)]) == api.SIGNATURES_PER_COUNT


def test_guard_type_self_check_and_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._C._dynamo.guards import TensorGuards

    assert api.tensor_guard_type() is TensorGuards
    monkeypatch.setenv(api.ENV_FAST_PATH, "0")
    assert api.tensor_guard_type() is None


# ------------------------------------------------------------------ device: fake driver


class FakeDriver:
    """The four driver calls of the launch path, recorded."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        self.real = driver
        self.current = 0x1000  # the device's context
        self.capturing = False
        self.calls: list[tuple] = []
        self.launches: list[tuple[int, bytes]] = []

    def cuCtxGetCurrent(self):
        return (self.real.CUresult.CUDA_SUCCESS, self.real.CUcontext(self.current))

    def cuCtxSetCurrent(self, ctx):
        self.calls.append(("set", int(ctx)))
        return (self.real.CUresult.CUDA_SUCCESS,)

    def cuStreamIsCapturing(self, stream):
        s = self.real.CUstreamCaptureStatus
        return (self.real.CUresult.CUDA_SUCCESS, s.CU_STREAM_CAPTURE_STATUS_ACTIVE
                if self.capturing else s.CU_STREAM_CAPTURE_STATUS_NONE)

    def cuLaunchKernelEx(self, config, function, kernel_params, extra):
        # The parameter buffer, through the void*[] the driver would read.
        first = ctypes.c_void_p.from_address(kernel_params).value
        self.launches.append((int(config.hStream), ctypes.string_at(first, 548)))
        return (self.real.CUresult.CUDA_SUCCESS,)


class FakeTable:
    addresses = itertools.count(0x7000_0000, 0x1000)

    def __init__(self, image: bytes, device, stream: int) -> None:
        self.image, self.address, self.streams = image, next(self.addresses), {stream}

    def ready_on(self, stream: int, device) -> None:
        self.streams.add(stream)

    @staticmethod
    def view(table: FakeTable, offset: int, nbytes: int, stream: int) -> FakeTable:
        v = object.__new__(FakeTable)
        v.image, v.address = table.image[offset:offset + nbytes], table.address + offset
        v.streams = {stream}
        return v


@pytest.fixture
def dev(monkeypatch: pytest.MonkeyPatch):
    from runtime import device as device_mod
    from runtime import launch as launch_mod

    drv = FakeDriver()
    monkeypatch.setattr(device_mod, "driver", drv)

    def fake_launch(function, config, stream, kernel_params):  # the runtime's one launch point
        config.hStream = stream
        drv.cuLaunchKernelEx(config, function, kernel_params, 0)

    monkeypatch.setattr(launch_mod, "launch", fake_launch)
    monkeypatch.setattr(device_tables, "upload", FakeTable)
    monkeypatch.setattr(device_tables, "view", FakeTable.view)
    rt = object.__new__(device_mod.DeviceRuntime)
    rt.device = types.SimpleNamespace(ordinal=0, context=drv.real.CUcontext(0x1000),
                                      sm_count=132)
    rt.torch_device = torch.device("cpu")
    rt.arch, rt.label = "sm_90a", "fake"
    rt._plans = device_tables.LruCache(8)
    rt._pointers = device_tables.LruCache(8)
    rt._lock = threading.Lock()
    rt._arena = None  # used only under capture, whose tests give it a FakeArena
    rt._workspaces = {}
    rt._alloc_stream, rt._alloc_lock = None, threading.Lock()
    rt.stream = 7
    rt._stream = lambda ordinal: rt.stream
    e, _ = entry(groups=[[192, 3072, 4096], [320, 3072, 4096]])
    loaded = types.SimpleNamespace(function=drv.real.CUfunction(0x5000))
    prepared = device_mod.PreparedKernel(loaded=loaded, templates=dict(TEMPLATES))

    def plan(shapes):
        return device_mod.DevicePlan(make_plan(e, shapes, 132), prepared)

    return types.SimpleNamespace(rt=rt, drv=drv, plan=plan, mod=device_mod, prepared=prepared)


def slots(raw: bytes) -> tuple[int, int, int, int]:
    """(pointers, workspace, problem_sizes, cta_prefix) of the sm90-like ABI (offset 512)."""
    return struct.unpack_from("<4Q", raw, 512)


def test_launch_reuses_one_workspace_per_stream(dev) -> None:
    dp = dev.plan(((192, 3072, 4096), (320, 3072, 4096)))
    ptrs = tuple(range(0x1000, 0x1000 + 10 * 0x100, 0x100))
    dev.rt.launch(dp, ptrs, None)
    dev.rt.launch(dp, ptrs, None)
    dev.rt.stream = 8
    dev.rt.launch(dp, ptrs, None)
    (s1, p1), (s2, p2), (s3, p3) = dev.drv.launches
    assert (s1, s2, s3) == (7, 7, 8)
    assert slots(p1)[1] == slots(p2)[1] != slots(p3)[1]
    assert dev.rt._workspaces[(7, 0)][1] >= dp.plan.workspace_bytes
    # A plan that needs more grows stream 7's workspace (the old one is dropped, not reused).
    dev.rt.stream = 7
    big = dev.plan(((4000, 3072, 4096), (4000, 3072, 4096)))
    assert big.workspace_bytes > dev.rt._workspaces[(7, 0)][1]
    dev.rt.launch(big, ptrs, None)
    assert slots(dev.drv.launches[-1][1])[1] != slots(p1)[1]
    assert dev.rt._workspaces[(7, 0)][1] >= big.workspace_bytes


def test_pointer_table_rows_follow_the_recorded_columns(dev) -> None:
    dp = dev.plan(((192, 3072, 4096), (320, 3072, 4096)))
    # argument order: a0 a1 b0 b1 sfa0 sfa1 sfb0 sfb1 c0 c1
    ptrs = (0xA0, 0xA1, 0xB0, 0xB1, 0x50, 0x51, 0x60, 0x61, 0xC0, 0xC1)
    assert dp.rows(ptrs) == [0xA0, 0xB0, 0x50, 0x60, 0xC0, 0xA1, 0xB1, 0x51, 0x61, 0xC1]
    dev.rt.launch(dp, ptrs, None)
    table = dev.rt._pointers.get((dp.serial, ptrs))
    assert table.image == struct.pack("<10q", *dp.rows(ptrs))
    pointers, _, sizes, prefix = slots(dev.drv.launches[-1][1])
    assert pointers == table.address
    assert (sizes, prefix) == (dp.tables.address, dp.tables.address + 128)


def test_launch_cached_needs_a_validated_pointer_set(dev) -> None:
    dp = dev.plan(((192, 3072, 4096), (320, 3072, 4096)))
    ptrs = tuple(range(10))
    assert dev.rt.launch_cached(dp, ptrs) is False and dev.drv.launches == []
    checks = []
    dev.rt.launch(dp, ptrs, lambda: checks.append(1))
    dev.rt.launch(dp, ptrs, lambda: checks.append(1))
    assert checks == [1]  # the overlap check runs once per new (plan, pointers)
    assert dev.rt.launch_cached(dp, ptrs) is True
    assert len(dev.drv.launches) == 3
    assert dev.rt.launch_cached(dp, ptrs[::-1]) is False


class FakeArena:
    """CaptureArena stand-in: persistent images at fake device addresses."""

    def __init__(self) -> None:
        self.images: dict[int, bytes] = {}

    def store(self, image: bytes, dev) -> int:
        address = 0x7000_0000 + 0x1000 * len(self.images)
        self.images[address] = image
        return address


def captured_launch(dev, monkeypatch, dp, ptrs, checks):
    """Launch `dp` as under graph capture; returns (raw kernel parameters, arena, workspaces
    allocated, driver calls other than the launch)."""
    workspaces = []
    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        workspaces.append(t)
        return t

    monkeypatch.setattr(dev.mod.torch, "empty", empty)
    monkeypatch.setattr(dev.mod.launch, "launch",
                        lambda f, config, stream, kp: dev.drv.cuLaunchKernelEx(
                            types.SimpleNamespace(hStream=stream), f, kp, 0))
    dev.rt._arena = FakeArena()
    dev.drv.capturing = True
    calls = len(dev.drv.calls)
    dev.rt.launch(dp, ptrs, lambda: checks.append(1))
    monkeypatch.setattr(dev.mod.torch, "empty", real_empty)
    return dev.drv.launches[-1][1], dev.rt._arena, workspaces, dev.drv.calls[calls:]


def test_capture_uses_persistent_tables_and_a_graph_workspace(dev, monkeypatch) -> None:
    monkeypatch.setattr(dev.mod.launch, "launch",
                        lambda f, config, stream, kp: dev.drv.cuLaunchKernelEx(
                            types.SimpleNamespace(hStream=stream), f, kp, 0))
    dp = dev.plan(((192, 3072, 4096), (320, 3072, 4096)))
    ptrs = tuple(range(10))
    dev.rt.launch(dp, ptrs, None)  # eager: the stream's workspace and cached tables
    eager_ws = slots(dev.drv.launches[-1][1])[1]
    dev.drv.capturing = True
    assert dev.rt.launch_cached(dp, ptrs) is False  # the hot path never launches in capture
    checks = []
    raw, arena, workspaces, calls = captured_launch(dev, monkeypatch, dp, ptrs, checks)
    pointers, ws, sizes, prefix = slots(raw)
    assert checks == [1]  # inside a capture the pointer checks always run
    assert ws != eager_ws and dev.rt._workspaces[(7, 0)][2] == eager_ws
    # One persistent image written at capture time: the pointer table at its start, the plan
    # tables on the next 128-byte boundary; no graph node for either.
    [(base, image)] = arena.images.items()
    pointer_table = struct.pack("<10q", *dp.rows(ptrs))
    assert (pointers, sizes, prefix) == (base, base + 128, base + 128 + 128)
    assert image == pointer_table.ljust(128, b"\0") + dp.plan.plan_tables
    # The workspace is a fresh allocation (the graph's pool) of the plan's size, and the
    # launch path made no driver call but the launch.
    [w] = workspaces
    assert ws == w.data_ptr() and w.numel() == dp.workspace_bytes
    assert calls == []


def test_capture_gives_the_grid_barrier_a_persistent_zeroed_header(dev, monkeypatch) -> None:
    dp = dev.mod.DevicePlan(make_plan(staged_entry(), ((192, 3072, 4096), (320, 3072, 4096)),
                                      132), dev.prepared)
    assert dp.workspace_header == 128
    raw, arena, workspaces, calls = captured_launch(dev, monkeypatch, dp, tuple(range(10)), [])
    [(base, image)] = arena.images.items()
    barrier = struct.unpack_from("<Q", dp.slot().params.raw(), BARRIER_AT)[0]
    tables = dp.plan.plan_tables
    # [pointer table | plan tables | 128 zero bytes], each on a 128-byte boundary
    at = 128 + -(-len(tables) // 128) * 128
    assert barrier == base + at and image[at:] == bytes(128) and len(image) == at + 128
    assert slots(raw)[1] == workspaces[0].data_ptr() != barrier  # the graph's pool
    assert calls == []  # only the kernel: every launch leaves the barrier zeroed


def test_launch_switches_to_the_device_context_and_back(dev) -> None:
    dp = dev.plan(((192, 3072, 4096), (320, 3072, 4096)))
    dev.rt.launch(dp, tuple(range(10)), None)
    assert dev.drv.calls == []  # already current: no switch
    dev.drv.current = 0x2000  # another device's context is current in this thread
    dev.rt.launch(dp, tuple(range(10)), None)
    assert dev.rt.launch_cached(dp, tuple(range(10))) is True
    assert dev.drv.calls == [("set", 0x1000), ("set", 0x2000)] * 2


def test_workspace_map_is_bounded(dev) -> None:
    dp = dev.plan(((192, 3072, 4096), (320, 3072, 4096)))
    for s in range(dev.mod.WORKSPACE_STREAMS + 5):
        dev.rt.stream = 100 + s
        dev.rt.launch(dp, tuple(range(10)), None)
    assert len(dev.rt._workspaces) <= dev.mod.WORKSPACE_STREAMS


def test_plan_entry_dataclass_is_untouched_by_dynamic_constraints() -> None:
    # make_plan only reads tile, grid and tables: a dynamic entry plans any m.
    e = dyn_entry(max_m=None)
    plan = make_plan(e.replace(), ((0, 4096, 7168), (13, 7168, 2048)), 132)
    assert plan.cta_prefix == (0, 0, 56)


def test_new_plan_uploads_its_tables_with_the_pointer_table(dev, monkeypatch) -> None:
    uploads = []

    def counting(image, device, stream):
        uploads.append(len(image))
        return FakeTable(image, device, stream)

    monkeypatch.setattr(device_tables, "upload", counting)
    dp = dev.plan(((192, 3072, 4096), (320, 3072, 4096)))
    dev.rt.launch(dp, tuple(range(10)), None)
    # One upload: problem sizes + CTA prefix + alpha's ones (each padded to 128, 8 bytes of
    # ones -> 264, padded to 384), then pointers.
    assert uploads == [384 + 80]
    pointers, _, sizes, prefix = slots(dev.drv.launches[-1][1])
    assert (prefix - sizes, pointers - sizes) == (128, 384)
    assert dp.tables.image == dp.plan.plan_tables
    dev.rt.launch(dp, tuple(range(1, 11)), None)  # same plan, new pointers: pointers only
    assert uploads == [464, 80]


def test_plans_of_one_kernel_and_group_count_share_a_thread_slot(dev) -> None:
    small = dev.plan(((1, 3072, 4096), (1, 3072, 4096)))
    big = dev.plan(((4000, 3072, 4096), (4000, 3072, 4096)))
    assert (small.plan.grid, big.plan.grid) == (48, 132)
    s1 = small.slot()
    assert s1.config.gridDimX == 48
    s2 = big.slot()
    assert s2 is s1 and s1.config.gridDimX == 132
    assert small.slot().config.gridDimX == 48
    other = []
    t = threading.Thread(target=lambda: other.append(small.slot()))
    t.start()
    t.join()
    assert other[0] is not s1  # per thread
    dev.rt.launch(small, tuple(range(10)), None)
    dev.rt.launch(big, tuple(range(10)), None)
    assert [struct.unpack_from("<I", raw, 544)[0] for _, raw in dev.drv.launches] == [2, 2]


def test_fast_overlap_check_agrees_with_the_detailed_one() -> None:
    """no_overlap_fast decides from shapes and pointers; on 600 random layouts carved from one
    pool (many overlapping, m = 0 included) it must agree with check_no_overlap exactly."""
    import random

    from runtime.validate import check_no_overlap

    rng = random.Random(1)
    pool = torch.zeros(1 << 16, dtype=torch.uint8)
    verdicts = {True: 0, False: 0}
    for _ in range(600):
        groups = [(rng.choice([0, 1, 3, 40]), rng.choice([8, 16, 24]), rng.choice([16, 64, 80]))
                  for _ in range(rng.randint(1, 3))]

        def carve(nbytes: int) -> torch.Tensor:
            at = rng.randrange(0, (1 << 16) - nbytes - 64) & ~15
            return pool[at:at + nbytes]

        a = [carve(m * k // 2).view(FP4).view(m, k // 2) for m, n, k in groups]
        b = [carve(n * k // 2).view(FP4).view(n, k // 2) for m, n, k in groups]
        sfa = [carve(blocked_scale_numel(m, k)).view(E4M3) for m, n, k in groups]
        sfb = [carve(blocked_scale_numel(n, k)).view(E4M3) for m, n, k in groups]
        out = [carve(2 * m * n).view(torch.float16).view(m, n) for m, n, k in groups]
        shapes, _, ptrs = _fast(a, b, sfa, sfb, out, cuda=False)
        try:
            check_no_overlap(a, b, sfa, sfb, out)
            detailed = True
        except InputError:
            detailed = False
        assert api.no_overlap_fast(shapes, ptrs) is detailed, groups
        verdicts[detailed] += 1
    assert min(verdicts.values()) > 100  # both outcomes well covered


def test_host_cost_bench_runs_without_a_gpu(tmp_path: Path) -> None:
    """bench/host_cost.py --mock end to end on synthetic G = 2 and G = 8 dynamic-m kernels
    (Python stand-ins for the driver), so the GPU run's script does not rot."""
    import os
    import subprocess
    import sys

    kernels = [(dyn_entry(f"tiny{g}_any_m.sm_90a.acc1.f16", groups=[[128, 256]] * g, max_m=None),
                fake_cubin("sm_90a")) for g in (2, 8)]
    art = write_artifacts(tmp_path / "art", kernels)
    repo = Path(__file__).resolve().parents[1]
    res = subprocess.run(
        [sys.executable, str(repo / "bench" / "host_cost.py"), "--artifacts", str(art), "--mock",
         "--batch", "20", "--batches", "2", "--json", str(tmp_path / "out.json")],
        capture_output=True, text=True, timeout=300, cwd=repo, check=False,
        env={**os.environ, "NVFP4_NO_FAKE_LIBCUDA": "1", "PYTHONPATH": str(repo)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "TOTAL grouped_gemm(out=...) (fast path)" in res.stdout
    report = json.loads((tmp_path / "out.json").read_text())
    assert sorted(report["results"]) == ["2", "8"]
    assert report["meta"]["8"]["kernel"] == "tiny8_any_m.sm_90a.acc1.f16"
    for rows in report["results"].values():
        assert rows["total"] > 0 and rows["dynamic_new_m"] > 0


# ------------------------------------------------------------------ staged-A workspace (sm90 v3)

STAGED_WS = {"bytes_per_cta": 1024, "align": 128, "header_bytes": 128, "bytes_per_a_element": 2}
BARRIER_AT = 544  # the grid_barrier parameter: after four templates (512) and four tables


def staged_params():
    """sm90 v3-like: the sm90-like ABI plus a grid_barrier table before num_groups."""
    from test_runtime_cpu import _params, _tables, _tma

    return _params([_tma(op) for op in ("a", "b", "sfa", "sfb")] + _tables()
                   + [("grid_barrier", "table", 8, 8, {"table": "grid_barrier"}),
                      ("num_groups", "scalar", 4, 4, {"value": "num_groups"})])


def staged_entry():
    e, _ = entry(groups=[[192, 3072, 4096], [320, 3072, 4096]], params=staged_params())
    assert [p.offset for p in e.params if p.name == "grid_barrier"] == [BARRIER_AT]
    return swap(e, tables={**e.tables.record(), "tensormap_workspace": STAGED_WS})


def test_plan_sizes_header_slots_and_staged_a() -> None:
    shapes = ((192, 3072, 4096), (320, 3072, 4096))
    p = make_plan(staged_entry(), shapes, 132)
    assert p.workspace_header == 128
    assert p.workspace_bytes == 128 + p.grid * 1024 + (192 + 320) * 4096 * 2
    plain, _ = entry(groups=[list(s) for s in shapes])
    q = make_plan(plain, shapes, 132)
    assert (q.workspace_header, q.workspace_bytes) == (0, q.grid * 512)


_REBUILD = "; rebuild the artifacts with `python build_kernels.py build --force`"


@pytest.mark.parametrize("key, value, why", [
    ("header_bytes", 100, "must be a multiple of 128, but got 100" + _REBUILD),
    ("header_bytes", -128, "must be a non-negative int, but got -128" + _REBUILD),
    ("bytes_per_cta", 2**62, f"must be below 2^40 (1 TiB), but got {2**62}" + _REBUILD),
    ("header_bytes", 2**40, f"must be below 2^40 (1 TiB), but got {2**40}" + _REBUILD),
    ("bytes_per_a_element", 2**40, f"must be below 2^40 (1 TiB), but got {2**40}" + _REBUILD),
    ("bytes_per_a_element", True, "must be int, but got bool"),
])
def test_manifest_rejects_bad_workspace_record(key, value, why) -> None:
    """The workspace record is checked at parse, before any plan reads it."""
    e = staged_entry()
    obj = json.loads(make_manifest([e], "t", "d").to_json())
    obj["kernels"][0]["tables"]["tensormap_workspace"][key] = value
    with pytest.raises(ManifestError) as info:
        parse_manifest(obj, "m")
    where = ("m.kernels[0]." if isinstance(value, bool) else f"kernel {e.kernel.name!r}: ")
    assert str(info.value) == f"{where}tables.tensormap_workspace.{key} {why}"


def test_kernel_check_rejects_a_header_without_a_barrier_parameter_and_the_reverse() -> None:
    no_param = swap(staged_entry(), params=entry()[0].params).kernel
    with pytest.raises(ManifestError) as info:
        check_kernel(no_param)
    assert str(info.value) == (
        f"kernel {no_param.name!r}: tables.tensormap_workspace.header_bytes is 128 but the "
        "kernel has no grid_barrier parameter; a zeroed header and a grid_barrier parameter "
        "come together")
    no_header = swap(staged_entry(), tables=entry()[0].tables).kernel
    with pytest.raises(ManifestError, match=r"header_bytes is 0 but the kernel has "
                                            r"grid_barrier parameter"):
        check_kernel(no_header)


def test_header_workspace_is_zeroed_and_not_shared(dev, monkeypatch) -> None:
    # Fresh allocations full of 0xAB, so a header left unzeroed cannot pass by luck.
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(0xAB))
    from runtime.device import DevicePlan

    shapes = ((192, 3072, 4096), (320, 3072, 4096))
    staged = DevicePlan(make_plan(staged_entry(), shapes, 132), dev.prepared)
    ptrs = tuple(range(0x1000, 0x1000 + 10 * 0x100, 0x100))
    dev.rt.launch(staged, ptrs, None)
    barrier = struct.unpack_from("<Q", staged.slot().params.raw(), BARRIER_AT)[0]
    dev.rt.launch(dev.plan(shapes), ptrs, None)
    ws_staged, ws_plain = dev.rt._workspaces[(7, 128)], dev.rt._workspaces[(7, 0)]
    assert ws_staged[2] != ws_plain[2]
    assert ws_staged[1] >= staged.plan.workspace_bytes
    assert ws_staged[0][:128].eq(0).all() and ws_staged[0][128:].eq(0xAB).all()
    assert ws_plain[0].eq(0xAB).all()  # nothing to zero without a header
    (_, p_staged), (_, p_plain) = dev.drv.launches
    assert slots(p_staged)[1] == ws_staged[2] and slots(p_plain)[1] == ws_plain[2]
    # An eager launch's grid barrier is its workspace's zeroed header.
    assert barrier == ws_staged[2]


def test_an_expert_set_is_written_as_e_and_one_row() -> None:
    """Schema 3: E equal (n, k) rows are written once (`experts`), read back as E rows; a set
    of different rows keeps the list; both round-trip through the JSON."""
    experts = Serves(groups=((2048, 768),) * 128, dynamic_m=True, max_m=512)
    assert experts.record() == {"dynamic_m": {"experts": 128, "group": [2048, 768],
                                              "max_m": 512}}
    mixed = Serves(groups=((4096, 7168), (7168, 2048)), dynamic_m=True, max_m=None)
    assert mixed.record() == {"dynamic_m": {"groups": [[4096, 7168], [7168, 2048]],
                                            "max_m": None}}
    one = Serves(groups=((2048, 768),), dynamic_m=True, max_m=None)
    assert one.record() == {"dynamic_m": {"groups": [[2048, 768]], "max_m": None}}
    for serves in (experts, mixed, one):
        obj = json.loads(make_manifest([dyn_entry("x.sm_90a.acc1.f16")], "t", "d").to_json())
        obj["sets"][0]["serves"] = json.loads(json.dumps(serves.record()))
        assert parse_manifest(obj, "m").sets[0].serves == serves
