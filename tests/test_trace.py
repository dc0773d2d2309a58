"""The trace build (experiments/trace_families.py: clock stamps per CTA in the workspace) and
experiments/trace_run.py's reading of them: the old `trace` option is refused with where the
build went, a trace build goes through the families hook with keys of its own, compiles (list
and serving kernels, as the shipped kernel with its no-op hooks overridden) and reserves its
record in the workspace, and the decoder turns known stamps into the phase lengths they
encode."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import NEEDS_DSL, compile_sm90

from builder.errors import SpecError
from builder.families import load_families
from builder.plan import expand
from builder.spec import load_spec, parse_spec_text
from kernels.sm90.config import K_TILE, REMOVED_OPTIONS, SUB_K, Config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "experiments"))
import trace_families
import trace_run
from trace_families import TRACE_BYTES

SUB_STEPS = K_TILE // SUB_K


@pytest.mark.parametrize("families", ["kernels.families", trace_families.FAMILIES_MODULE])
@pytest.mark.parametrize("entry", ["groups: [[56, 1024, 768]]",
                                   "experts: 8\n    n: 1024\n    k: 768\n    max_m: 64"],
                         ids=["list", "serving"])
def test_the_trace_option_is_refused_with_where_the_build_went(families: str, entry: str) -> None:
    # Not an option any more, for list or serving sets, in either build: REMOVED_OPTIONS says
    # the trace build is experiments/trace_families.py.
    assert "trace" not in Config.__dataclass_fields__
    text = ("schema_version: 1\nsets:\n  - name: s\n    archs: [sm_90a]\n"
            f"    {entry}\n    options: {{sm_90a: {{trace: true}}}}\n")
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, "shapes.yaml", load_families(families))
    assert str(info.value) == (f"shapes.yaml: sets[s].options.sm_90a.trace: trace was removed "
                               f"{REMOVED_OPTIONS['trace']}; delete it")
    assert "experiments/trace_families.py" in REMOVED_OPTIONS["trace"]


def test_the_record_is_whole_128_byte_lines() -> None:
    assert TRACE_BYTES % 128 == 0 and TRACE_BYTES == 22784


def _records(grid: int, stages: int, tiles: int) -> torch.Tensor:
    """Synthetic stamps: every step takes 1000 cycles (start, +300 A ready, +20 issued, +600
    previous retired, +80 next start), a tile start adds 5000, the producer issues each stage's
    weights 2000 cycles before the consumers start it."""
    flat = torch.zeros(grid * TRACE_BYTES // 8, dtype=torch.int64)
    r = trace_run.split_records(flat, grid)
    for cta in range(grid):
        t = 100_000 * (cta + 1)
        r["start"][cta] = t
        r["cta"][cta, 1] = t + 50   # templates copied
        r["cta"][cta, 3] = t + 900  # first weight stage issued
        t += 400
        for tile in range(tiles):
            r["tiles"][cta, tile, 0] = t
            t += 200
            for kt in range(stages):
                r["stages"][cta, tile, kt, 1] = t - 2000
                for s in range(SUB_STEPS):
                    r["steps"][cta, tile, kt, s] = torch.tensor([t, t + 300, t + 320, t + 920])
                    t += 1000
            r["tiles"][cta, tile, 1] = t - 80 + 100
            r["tiles"][cta, tile, 2] = t - 80 + 300
            r["tiles"][cta, tile, 3] = t - 80 + 500
            t += 5000 - 200 - 80 + 80
    return flat


def test_the_decoder_reads_back_the_phases() -> None:
    grid, stages, tiles = 3, 2, 2
    r = trace_run.split_records(_records(grid, stages, tiles), grid)
    got = trace_run.summarize(r, grid, [tiles] * grid, stages)
    # With E the end of a tile's last step: retired at E - 80, K loop done E + 20, C tile free
    # E + 220, handed over E + 420, next tile at E + 4800, its first step at E + 5000 and
    # issued at E + 5320.
    expected = {
        "step period (issued -> issued)": 1000,
        "step: start -> A ready (conversion, A wait)": 300,
        "step: A ready -> issued": 20,
        "step: issued -> previous retired": 600,
        "step: retired -> next starts": 80,
        "producer lead: weights issued -> consumers start the stage": 2000,
        "first tile: CTA start -> tile start": 400,
        "CTA start -> descriptor templates copied": 50,
        "CTA start -> first weight stage issued": 900,
        "first tile: tile start -> first step starts": 200,
        "tile start: last step retired -> K loop done": 100,
        "tile start: K loop done -> C tile free": 200,
        "tile start: C tile free -> handed over": 200,
        "tile start: handed over -> next tile starts": 4380,
        "tile start: first step starts -> issued": 320,
        "tile start: total, last retired -> first issued": 5400,
    }
    assert {key: got[key] for key in expected} == expected
    # Events nobody stamped (here the patch, the staging ones) are not reported.
    assert "CTA start -> first group's descriptors patched" not in got
    total = got["tile start: total, last retired -> first issued"]
    assert total == sum(got[k] for k in (
        "tile start: last step retired -> K loop done", "tile start: K loop done -> C tile free",
        "tile start: C tile free -> handed over", "tile start: handed over -> next tile starts",
        "tile start: next tile starts -> first step starts",
        "tile start: first step starts -> issued"))


def _globals(grid: int, stamps: dict[int, tuple]) -> dict:
    """Zeroed records of `grid` CTAs with %globaltimer event e stamped stamps[e][cta]."""
    r = trace_run.split_records(torch.zeros(grid * TRACE_BYTES // 8, dtype=torch.int64), grid)
    for event, values in stamps.items():
        for cta, value in enumerate(values):
            r["global"][event][cta] = value
    return r


def test_the_globaltimer_stamps_compare_ctas() -> None:
    assert trace_run.across_ctas(_globals(3, {})) == {}  # nothing stamped
    # CTA starts (ns) 1000, 1100, 1040; first counts 3000, 3600, 3100; first A found 4000,
    # 4300, 4040.
    r = _globals(3, {0: (1000, 1100, 1040), 5: (3000, 3600, 3100), 4: (4000, 4300, 4040)})
    assert trace_run.across_ctas(r) == {
        "CTA starts: last - first (ns)": 100,
        "first A found staged, from the CTA's start: median (ns)": 3000,
        "stagers' first count, from the CTA's start: median (ns)": 2060,
        "stagers' first count of the last CTA, from the first CTA's start (ns)": 2600}


def test_the_globaltimer_stamps_time_phase_1_and_the_grid_barrier() -> None:
    # CTA starts 1000, 1100, 1040; staged 3000, 3600, 3100; barrier passed 3700, 3650, 3690.
    r = _globals(3, {0: (1000, 1100, 1040), 9: (3000, 3600, 3100), 10: (3700, 3650, 3690)})
    assert trace_run.across_ctas(r) == {
        "CTA starts: last - first (ns)": 100,
        "phase 1 staged, from the CTA's start: median (ns)": 2060,
        "phase 1 staged by the last CTA, from the first CTA's start (ns)": 2600,
        "grid barrier passed, from the CTA's start: median (ns)": 2650,
        "grid barrier passed by the last CTA, from the first CTA's start (ns)": 2700}


def test_ctas_without_a_start_stamp_are_skipped() -> None:
    grid, stages = 2, 1
    flat = _records(grid, stages, 1)
    r = trace_run.split_records(flat, grid)
    r["start"][1] = 0
    r["steps"][1] += 7  # would change the medians if it were read
    got = trace_run.summarize(r, grid, [1, 1], stages)
    assert got["step: A ready -> issued"] == 20


SCRIPT = f"sys.path.insert(0, {str(ROOT / 'experiments')!r})\n" + """
import trace_kernels
from kernels.sm90.grouped_gemm import Sm90GroupedGemm
from kernels.sm90.hooks import TraceHooks
from trace_kernels import TracedSm90GroupedGemm, TracedSm90OffsetsGemm
out = {}
for name, config, groups in [
        ("list", Config(tile_m=112, tile_n=192, a_slots=5, async_epilogue=True,
                        patch_ahead=True, stream_a=True),
         [(40, 7168, 2048), (196, 7168, 2048)]),
        # The serving (device-offsets) kernel is traced too (twentieth session).
        ("serving", Config(tile_m=16, tile_n=256, out_dtype="bfloat16", device_offsets=True),
         [(2048, 768)] * 4)]:
    k = trace_kernels.compile_kernel(config, arch="sm_90a", groups=groups)
    plain = compile_kernel(config, arch="sm_90a", groups=groups)
    out[name] = {"per_cta": [k.tables["tensormap_workspace"]["bytes_per_cta"],
                             plain.tables["tensormap_workspace"]["bytes_per_cta"]],
                 "clock": ["%clock64" in k.ptx, "%clock64" in plain.ptx]}
out["hooks"] = sorted(a for a in vars(TraceHooks) if not a.startswith("__"))
out["replaced"] = sorted(a for a in vars(TracedSm90GroupedGemm)
                         if hasattr(Sm90GroupedGemm, a) and not a.startswith("__"))
out["serving_bases"] = [c.__name__ for c in TracedSm90OffsetsGemm.__bases__]
out["serving_own"] = sorted(a for a in vars(TracedSm90OffsetsGemm) if not a.startswith("__"))
print(json.dumps(out))
"""


@NEEDS_DSL
def test_a_trace_build_reserves_its_record_and_reads_the_clock() -> None:
    out = compile_sm90(SCRIPT)
    for name in ("list", "serving"):
        assert out[name]["per_cta"][0] == out[name]["per_cta"][1] + TRACE_BYTES, name
        assert out[name]["clock"] == [True, False], name
    # The stamps live in a subclass that replaces the shipped kernel's no-op hooks, every one
    # of them and nothing else (no role of the shipped kernel has a traced copy), and lifts the
    # no-stack-frame guard (the stamps spill a few per-tile values); the serving one is the
    # shipped device-offsets kernel with those same hooks and nothing of its own.
    assert out["replaced"] == sorted([*out["hooks"], "REQUIRE_NO_STACK_FRAME"])
    assert out["serving_bases"] == ["Sm90OffsetsGemm", "TracedSm90GroupedGemm"]
    assert out["serving_own"] == []


def test_the_trace_specs_build_known_sets_as_traced_kernels() -> None:
    fams = load_families(trace_families.FAMILIES_MODULE)
    assert fams.family_for("sm_90a").compile_module == "trace_kernels"
    spec = load_spec(ROOT / "experiments" / "trace_ab.yaml", fams)
    bench = ["moe_down", "moe_down_one_tile", "dense_a", "dense_b"]
    # The decode sets (eighteenth session): bench_models' 64 tokens x 8 routing, experts with
    # tokens only, traced with the decode tiles; trace_run reads their groups from the manifest.
    # And (nineteenth session) the Qwen3 ones again with the tiny tier's 16 x 256 tiles.
    decode = ["qwen_down_decode", "qwen_gateup_decode", "dsv3_gateup_e32_decode"]
    tiny = ["qwen_down_tiny", "qwen_gateup_tiny"]
    assert [s.name for s in spec.sets] == bench + decode + tiny
    by_name = {s.name: s for s in spec.sets}
    for s in spec.sets:
        if s.name in bench:
            assert list(s.groups) == trace_run.ALL_SETS[s.name]
        else:
            assert s.name not in trace_run.ALL_SETS and sum(g[0] for g in s.groups) == 512
            assert all(g[0] > 0 for g in s.groups)
            tile = (16, 256) if s.name in tiny else (32, 192)
            assert {(b.options_dict()["tile_m"], b.options_dict()["tile_n"])
                    for b in s.builds} == {tile}
        assert {b.arch for b in s.builds} == {"sm_90a"}
        assert all(b.options_dict()["async_epilogue"] and b.options_dict()["patch_ahead"]
                   for b in s.builds)
    for name in tiny:
        assert by_name[name].groups == by_name[name.replace("tiny", "decode")].groups
    # The serving spec (twentieth session): Qwen3-30B's tiny tier as device-offsets sets.
    serving = load_spec(ROOT / "experiments" / "trace_serving.yaml", fams)
    assert [s.name for s in serving.sets] == ["qwen3_30b_down_tiny", "qwen3_30b_gateup_tiny"]
    for s in serving.sets:
        assert {(b.options_dict()["tile_m"], b.options_dict()["tile_n"])
                for b in s.builds} == {(16, 256)}
    # A trace kernel never shares a build key with the shipped kernel of the same options (the
    # trace modules are part of its sources), so one artifacts tree cannot mix them up.
    shipped = load_families("kernels.families")
    for path, traced_spec in [("trace_ab.yaml", spec), ("trace_serving.yaml", serving)]:
        plain = {i.name: i.key for i in expand(load_spec(ROOT / "experiments" / path, shipped),
                                               shipped)}
        items = expand(traced_spec, fams)
        traced = {i.name: i.key for i in items}
        assert traced.keys() == plain.keys() and not set(traced.values()) & set(plain.values())
        assert {i.options_dict()["device_offsets"] for i in items} == {
            path == "trace_serving.yaml"}
