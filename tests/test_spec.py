"""shapes.yaml validation: every invalid input is a SpecError whose exact message names the file,
the set and the key. Rules come from a fake family (K tile 256, N multiple 128, acc stages
(1,) on sm_90a and (1, 2) on sm_100a, options tile_m in {64, 128} and fail), so these tests do
not move when the real kernels' configs change; the default shapes.yaml is checked against the
real families at the end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fakefam import write_fake_package

from builder.errors import SpecError
from builder.families import Families, load_families
from builder.plan import expand
from builder.spec import ArchBuild, SetSpec, load_spec, parse_spec_text
from kernels.sm90.config import LANE_GROUPS

REPO = Path(__file__).resolve().parents[1]

BASE = """\
schema_version: 1
defaults:
  archs: [sm_90a, sm_100a]
  acc_stages: {sm_100a: [1, 2], sm_90a: [1]}
sets:
  - name: moe_gateup
    groups: [[80, 4096, 7168], [176, 4096, 7168]]
  - name: moe_down
    groups: [[40, 7168, 2048], [76, 7168, 2048], [168, 7168, 2048]]
    options: {sm_90a: {tile_m: 64}}
"""


@pytest.fixture(scope="module")
def fams(tmp_path_factory: pytest.TempPathFactory) -> Families:
    root = tmp_path_factory.mktemp("specfam")
    pkg = write_fake_package(root)
    sys.path.insert(0, str(root))
    try:
        yield load_families(f"{pkg}.families")
    finally:
        sys.path.remove(str(root))


def parse(text: str, fams: Families):
    return parse_spec_text(text, "shapes.yaml", fams)


def edit(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


def test_valid_spec_parses_to_plain_data(fams: Families) -> None:
    spec = parse(BASE, fams)
    assert spec.source == "shapes.yaml"
    assert spec.sets == (
        SetSpec("moe_gateup", ((80, 4096, 7168), (176, 4096, 7168)),
                (ArchBuild("sm_90a", (1,), ()), ArchBuild("sm_100a", (1, 2), ()))),
        SetSpec("moe_down", ((40, 7168, 2048), (76, 7168, 2048), (168, 7168, 2048)),
                (ArchBuild("sm_90a", (1,), (("tile_m", 64),)),
                 ArchBuild("sm_100a", (1, 2), ()))),
    )


def test_plain_acc_list_applies_to_every_arch_and_set_overrides_defaults(fams: Families) -> None:
    text = edit("    options: {sm_90a: {tile_m: 64}}", "    archs: [sm_100a]\n    acc_stages: [2]")
    spec = parse(text, fams)
    assert spec.sets[1].builds == (ArchBuild("sm_100a", (2,), ()),)


def test_missing_acc_stages_means_family_default(fams: Families) -> None:
    spec = parse(edit("  acc_stages: {sm_100a: [1, 2], sm_90a: [1]}\n", ""), fams)
    assert [b.acc_stages for b in spec.sets[0].builds] == [(1,), (1,)]


def test_set_options_merge_over_defaults_key_by_key(fams: Families) -> None:
    text = edit("  acc_stages:", "  options: {sm_90a: {tile_m: 64, fail: 0}}\n  acc_stages:")
    text = text.replace("{sm_90a: {tile_m: 64}}", "{sm_90a: {tile_m: 128}}")
    spec = parse(text, fams)
    assert spec.sets[0].builds[0].options == (("fail", 0), ("tile_m", 64))
    assert spec.sets[1].builds[0].options == (("fail", 0), ("tile_m", 128))


E = "shapes.yaml: "
CASES = [
    # malformed YAML, with its position
    ("[176, 4096, 7168]]", "[176, 4096, 7168]",
     E + "line 8, column 3: malformed YAML: expected ',' or ']', but got '-'"),
    ("    options: {sm_90a: {tile_m: 64}}",
     "    options: {sm_90a: {tile_m: 64}}\n    options: {}",
     E + "line 11, column 5: duplicate key 'options' (first written on line 10)"),
    # schema_version
    ("schema_version: 1", "schema_version: 2",
     E + "schema_version: schema_version must be 1, but got 2 (this builder reads schema v1)"),
    ("schema_version: 1", "schema_version: '1'",
     E + "schema_version: schema_version must be an int, but got str '1'"),
    ("schema_version: 1\n", "",
     E + "key 'schema_version' is missing (start the file with `schema_version: 1`)"),
    # unknown keys, anywhere
    ("sets:", "set:",
     E + "unknown key 'set'; did you mean 'sets'? (allowed keys: schema_version, defaults, sets)"),
    ("defaults:", "defaults:\n  group: 1",
     E + "defaults: unknown key 'group' (allowed keys: archs, acc_stages, options, out_dtypes)"),
    ("    groups: [[40", "    grups: [[40",
     E + "sets[moe_down]: unknown key 'grups'; did you mean 'groups'? (allowed keys: name, "
     "groups, m, max_m, archs, acc_stages, options, out_dtypes, experts, n, k)"),
    ("tile_m: 64", "tile_k: 64",
     E + "sets[moe_down].options.sm_90a: unknown key 'tile_k'; did you mean 'tile_m'? "
     "(allowed keys: tile_m, fail)"),
    # missing keys
    ("  - name: moe_down\n", "  - nmae: moe_down\n",
     E + "sets[1]: unknown key 'nmae'; did you mean 'name'? (allowed keys: name, groups, m, "
     "max_m, archs, acc_stages, options, out_dtypes, experts, n, k)"),
    ("    groups: [[80, 4096, 7168], [176, 4096, 7168]]\n", "",
     E + "sets[moe_gateup]: key 'groups' is missing"),
    ("  archs: [sm_90a, sm_100a]\n", "",
     E + "sets[moe_gateup]: key 'archs' is missing (and defaults gives no archs)"),
    # groups
    ("[[40, 7168, 2048], [76, 7168, 2048], [168, 7168, 2048]]", "[]",
     E + "sets[moe_down].groups: groups must not be empty, but got an empty list"),
    ("[40, 7168, 2048]", "[40, 7168]",
     E + "sets[moe_down].groups[0]: group must be a list [m, n, k] (for m chosen at run time, "
     "give the set `m: dynamic` and [n, k] groups), but got a list of 2"),
    ("[40, 7168, 2048]", "5",
     E + "sets[moe_down].groups[0]: group must be a list [m, n, k], but got int 5"),
    ("[40, 7168", "[true, 7168",
     E + "sets[moe_down].groups[0][0]: m must be an int, but got bool True"),
    ("[40, 7168", "['40', 7168",
     E + "sets[moe_down].groups[0][0]: m must be an int, but got str '40'"),
    ("[40, 7168", "[0, 7168", E + "sets[moe_down].groups[0][0]: m must be > 0, but got 0"),
    ("[40, 7168", "[40, -128", E + "sets[moe_down].groups[0][1]: n must be > 0, but got -128"),
    ("[40, 7168, 2048]", "[40, 7168, 0]",
     E + "sets[moe_down].groups[0][2]: k must be > 0, but got 0"),
    ("[168, 7168, 2048]]", "[168, 7168, 1000]]",
     E + "sets[moe_down].groups[2][2]: k must be a multiple of 256 (the sm_90a kernel's K granule), "
     "but got 1000"),
    ("[76, 7168, 2048]", "[76, 7000, 2048]",
     E + "sets[moe_down].groups[1][1]: n must be a multiple of 128 (the sm_90a kernel's N "
     "multiple), but got 7000"),
    # archs
    ("archs: [sm_90a, sm_100a]", "archs: [sm_90a, sm_80]",
     E + "defaults.archs[1]: arch must be one of ['sm_100a', 'sm_90a'], but got str 'sm_80'"),
    ("archs: [sm_90a, sm_100a]", "archs: sm_90a",
     E + "defaults.archs: archs must be a list, but got str 'sm_90a'"),
    ("archs: [sm_90a, sm_100a]", "archs: []",
     E + "defaults.archs: archs must not be empty, but got an empty list"),
    ("archs: [sm_90a, sm_100a]", "archs: [sm_90a, sm_90a]",
     E + "defaults.archs[1]: arch 'sm_90a' is listed twice"),
    ("{sm_90a: {tile_m: 64}}", "{sm_70: {tile_m: 64}}",
     E + "sets[moe_down].options.sm_70: arch must be one of ['sm_100a', 'sm_90a'], but got str "
     "'sm_70'"),
    # sets and names
    ("name: moe_down", "name: moe_gateup",
     E + "sets[1].name: set name 'moe_gateup' is already used by sets[0]"),
    ("name: moe_down", "name: moe.down",
     E + "sets[1].name: set name must match [A-Za-z0-9_-]+, but got str 'moe.down'"),
    ("name: moe_down", "name: 7",
     E + "sets[1].name: set name must match [A-Za-z0-9_-]+, but got int 7"),
    # acc stages
    ("acc_stages: {sm_100a: [1, 2], sm_90a: [1]}", "acc_stages: [1, 2]",
     E + "sets[moe_gateup].acc_stages (from defaults.acc_stages[1]): acc stage 2 is not "
     "supported by the sm_90a kernel (it supports [1]); give stages per arch, e.g. acc_stages: "
     "{sm_90a: [1], sm_100a: [1, 2]}"),
    ("    options: {sm_90a: {tile_m: 64}}",
     "    options: {sm_90a: {tile_m: 64}}\n    acc_stages: {sm_90a: [1, 2]}",
     E + "sets[moe_down].acc_stages.sm_90a[1]: acc stage 2 is not supported by the sm_90a kernel "
     "(it supports [1]); give stages per arch, e.g. acc_stages: {sm_90a: [1], sm_100a: [1, 2]}"),
    ("acc_stages: {sm_100a: [1, 2], sm_90a: [1]}", "acc_stages: {sm_100a: [1, 1]}",
     E + "defaults.acc_stages.sm_100a[1]: acc stage 1 is listed twice"),
    ("acc_stages: {sm_100a: [1, 2], sm_90a: [1]}", "acc_stages: {sm_100a: [true]}",
     E + "defaults.acc_stages.sm_100a[0]: acc stage must be an int, but got bool True"),
    ("acc_stages: {sm_100a: [1, 2], sm_90a: [1]}", "acc_stages: 2",
     E + "defaults.acc_stages: acc_stages must be a list of ints or a mapping arch -> list of "
     "ints, but got int 2"),
    ("acc_stages: {sm_100a: [1, 2], sm_90a: [1]}", "acc_stages: {sm_100a: [1, 2], sm_80: [1]}",
     E + "defaults.acc_stages.sm_80: arch must be one of ['sm_100a', 'sm_90a'], but got str "
     "'sm_80'"),
    # options
    ("tile_m: 64", "tile_m: 96",
     E + "sets[moe_down].options.sm_90a: the fake90 config for acc stage 1 is invalid: tile_m "
     "must be one of [64, 128], but got 96"),
    ("tile_m: 64", "tile_m: true",
     E + "sets[moe_down].options.sm_90a.tile_m: tile_m must be an int, but got bool True"),
    ("tile_m: 64", "tile_m: 64.0",
     E + "sets[moe_down].options.sm_90a.tile_m: tile_m must be an int, but got float 64.0"),
    ("{sm_90a: {tile_m: 64}}", "[tile_m]",
     E + "sets[moe_down].options: options must be a mapping arch -> options, but got a list "
     "of 1"),
    ("    options: {sm_90a: {tile_m: 64}}",
     "    options: {sm_90a: {tile_m: 64}}\n    archs: [sm_100a]",
     E + "sets[moe_down].options.sm_90a: options are given for sm_90a, but the set builds only "
     "['sm_100a']"),
]


@pytest.mark.parametrize("old,new,message", CASES, ids=[c[2][len(E):60] for c in CASES])
def test_invalid_spec_message(fams: Families, old: str, new: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(edit(old, new), fams)
    assert str(info.value) == message


@pytest.mark.parametrize("text,message", [
    ("- 1\n", E + "the file must be a mapping, but got a list of 1"),
    ("", E + "the file must be a mapping with schema_version and sets, but it is empty"),
    ("schema_version: 1\n", E + "key 'sets' is missing"),
    ("schema_version: 1\nsets: []\n", E + "sets: sets must not be empty, but got an empty list"),
    ("schema_version: 1\nsets: [1]\n", E + "sets[0]: a set must be a mapping, but got int 1"),
    ("schema_version: 1\ndefaults:\nsets: [1]\n",
     E + "defaults: defaults must be a mapping, but got null"),
])
def test_invalid_top_level(fams: Families, text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(text, fams)
    assert str(info.value) == message


def test_file_errors_name_the_path(fams: Families, tmp_path: Path) -> None:
    path = tmp_path / "my_shapes.yaml"
    with pytest.raises(SpecError, match=rf"^{path}: cannot read the spec file: "):
        load_spec(path, fams)
    path.write_text(edit("[40, 7168", "[0, 7168"))
    with pytest.raises(SpecError) as info:
        load_spec(path, fams)
    assert str(info.value) == f"{path}: sets[moe_down].groups[0][0]: m must be > 0, but got 0"


# --------------------------------------------------------------------------------------------
# The default shapes.yaml, with the real families
# --------------------------------------------------------------------------------------------

BENCHMARK = {  # facts.md: set -> (M per group, N, K)
    "moe_gateup": ([80, 176, 128, 72, 64, 248, 96, 160], 4096, 7168),
    "moe_down": ([40, 76, 168, 72, 164, 148, 196, 160], 7168, 2048),
    "dense_a": ([192, 320], 3072, 4096),
    "dense_b": ([128, 384], 4096, 1536),
}


def test_default_shapes_yaml_declares_the_benchmark_and_test_style_sets() -> None:
    fams = load_families("kernels.families")
    spec = load_spec(REPO / "shapes.yaml", fams)
    sets = {s.name: s for s in spec.sets}
    for name, (ms, n, k) in BENCHMARK.items():
        assert sets[name].groups == tuple((m, n, k) for m in ms), name
    # One Hopper-only set has more groups than phase 1 holds one per lane, so the GPU checks
    # cover the table walk too.
    many = sets.pop("many_groups")
    assert len(many.groups) > LANE_GROUPS and many.archs == ("sm_90a",)
    # And one Hopper-only stream_a set has more streaming iterations than progress counters.
    long = sets.pop("stream_a_long")
    assert long.archs == ("sm_90a",) and dict(long.builds[0].options)["stream_a"] is True
    # Sets in the style of the public tests: n and k differ between groups.
    style = [s for s in sets.values()
             if not s.dynamic_m and len({(g[1], g[2]) for g in s.groups}) > 1]
    assert len(style) >= 3
    for s in style:
        assert 2 <= len(s.groups) <= 4, s.name
        assert len({g[1] for g in s.groups}) > 1 and len({g[2] for g in s.groups}) > 1, s.name
        assert any(g[0] % 128 for g in s.groups), s.name
    # gpt-oss's K = 2880 (a multiple of 64, not 256): Hopper-only, like the masked sets below.
    gptoss = [sets.pop(n) for n in ("gptoss_gateup", "gptoss_down")]
    assert all(s.archs == ("sm_90a",) and s.groups[0][-1] == 2880 for s in gptoss)
    # The tile_m 64 tier between decode and prefill sets, the decode tiers added for the
    # other many-expert layers and the tile_m 16 tier at E >= 128: Hopper tile sizes, bounded T.
    tiers = [sets.pop(n) for n in [n for n, s in sets.items()
                                   if not dict(s.builds[0].options).get("masked")
                                   and (n.endswith(("_mid", "_mid48", "_tiny"))
                                        or (n.endswith("_decode") and s.archs == ("sm_90a",)))]]
    assert len(tiers) == 44 and all(s.archs == ("sm_90a",) and s.max_m for s in tiers)
    assert {dict(s.builds[0].options)["tile_m"] for s in tiers} == {16, 32, 48, 64}
    # The 48-row tiers (thirty-first session): 48 x 192 on Qwen3-235B gate-up and gpt-oss down,
    # 48 x 256 on the others; the mid tiers at 64 x 256 where that won.
    assert sorted(s.name for s in tiers if dict(s.builds[0].options)["tile_m"] == 48) == [
        "dsv3_down_e256_mid48", "dsv3_down_e32_mid48", "dsv3_gateup_e256_mid48",
        "gptoss_down_mid48", "mixtral_down_mid48", "mixtral_gateup_decode",
        "qwen3_235b_down_e128_mid48", "qwen3_235b_gateup_e128_mid48"]
    assert sorted(s.name for s in tiers if dict(s.builds[0].options)["tile_m"] == 64
                  and dict(s.builds[0].options)["tile_n"] == 256) == [
        "dsv3_down_e256_mid", "dsv3_gateup_e256_mid", "mixtral_gateup_mid",
        "qwen3_235b_down_e128_mid", "qwen3_30b_down_mid"]
    # The tiny tier: at most 4 rows per expert on average at E >= 32, 8 on the short-K layers
    # and 6 on DeepSeek-V3 EP8, where it measured faster (shapes.yaml, thirtieth and
    # thirty-first sessions).
    tiny = [s for s in tiers if s.name.endswith("_tiny")]
    per_expert = {s.name: s.max_m / len(s.groups) for s in tiny}
    assert len(tiny) == 13 and all(s.max_m >= 128 or "mixtral" in s.name for s in tiny)
    assert sorted(n for n, r in per_expert.items() if r != 4) == [
        "dsv3_down_e32_tiny", "dsv3_gateup_e32_tiny", "qwen3_235b_down_e128_tiny",
        "qwen3_235b_down_e16_tiny", "qwen3_235b_gateup_e16_tiny", "qwen3_30b_down_tiny",
        "qwen3_30b_gateup_tiny"]
    assert per_expert["dsv3_gateup_e32_tiny"] == per_expert["dsv3_down_e32_tiny"] == 6
    assert {r for n, r in per_expert.items() if "_e32_" not in n} == {4, 8}
    # The one-token tier (thirty-second session): bounded so that its experts' tiles, at most
    # max_m x ceil(N / tile_n) (max_m rows hit at most max_m experts), fit one wave of 132 SMs.
    micro = [sets.pop(n) for n in [n for n in sets if "_micro" in n]]
    assert sorted((s.name, s.max_m) for s in micro) == [
        ("gptoss_down_micro", 4), ("gptoss_down_micro192", 8), ("gptoss_gateup_micro", 4),
        ("mixtral_down_micro", 4), ("qwen3_235b_gateup_e128_micro", 8),
        ("qwen3_30b_down_micro", 8), ("qwen3_30b_gateup_micro", 8)]
    for s in micro:
        opts = dict(s.builds[0].options)
        assert s.archs == ("sm_90a",) and opts["tile_m"] == 16 and opts["inline_a"] is True
        assert min(s.max_m, len(s.groups)) * -(-s.groups[0][0] // opts["tile_n"]) <= 132, s.name
        # narrower than the tiny tier's 256 columns (the next tier up; Mixtral's is its 32 x 192
        # decode tier)
        assert opts["tile_n"] < 256
    # The one prefill-tile tier (thirty-fifth session): Mixtral down keeps 128 x 128 tiles up to
    # 2048 rows; its catch-all set takes the 128 x 192 prefill tiles as every other layer's.
    prefill128 = sets.pop("mixtral_down_prefill128")
    assert (prefill128.archs, prefill128.max_m) == (("sm_90a",), 2048)
    assert "tile_n" not in dict(prefill128.builds[0].options)  # the default, 128
    assert dict(sets["mixtral_down"].builds[0].options)["tile_n"] == 192
    gptoss += [*tiers, *micro, prefill128]  # one arch each, as gpt-oss
    # The masked-layout expert sets (issue 27) are Hopper-only: sm_100a has no masked kernel.
    masked = [sets.pop(n) for n in [n for n, s in sets.items()
                                    if dict(s.builds[0].options).get("masked")]]
    # Two layers, each with a prefill, a mid (max_m 64), a decode (max_m 20 down, 24 gate-up at
    # 48 x 256) and a tiny set (max_m 8, inline_a).
    assert len(masked) == 8 and all(s.archs == ("sm_90a",) for s in masked)
    assert sorted((s.name, s.max_m) for s in masked if s.max_m) == [
        ("dsv3_down_e32_masked_decode", 20), ("dsv3_down_e32_masked_mid", 64),
        ("dsv3_down_e32_masked_tiny", 8), ("dsv3_gateup_e32_masked_decode", 24),
        ("dsv3_gateup_e32_masked_mid", 64), ("dsv3_gateup_e32_masked_tiny", 8)]
    assert all(bool(dict(s.builds[0].options).get("inline_a")) == s.name.endswith("_tiny")
               for s in masked)
    for s in sets.values():
        assert s.archs == ("sm_90a", "sm_100a")
        assert {b.arch: b.acc_stages for b in s.builds} == {"sm_90a": (1,), "sm_100a": (1, 2)}
    # Every set builds both output types (issue 24: bf16 for models, fp16 for the seed's API).
    assert all(s.out_dtypes == ("bfloat16", "float16") for s in spec.sets)
    items = expand(spec, fams)
    assert len(items) == 2 * (3 * len(sets) + len((many, long)) + len(masked) + len(gptoss))
    assert len({it.name for it in items}) == len(items)


# --------------------------------------------------------------------------------------------
# Dynamic-m sets (`m: dynamic`, groups of (n, k), optional max_m)
# --------------------------------------------------------------------------------------------

DYN = BASE + """\
  - name: moe_any_m
    m: dynamic
    groups: [[4096, 7168], [7168, 2048]]
    max_m: 4096
"""


def dyn_edit(old: str, new: str) -> str:
    tail = DYN[len(BASE):]
    assert old in tail, old
    return BASE + tail.replace(old, new, 1)


def test_dynamic_m_set_parses_to_n_k_groups(fams: Families) -> None:
    spec = parse(DYN, fams)
    builds = (ArchBuild("sm_90a", (1,), ()), ArchBuild("sm_100a", (1, 2), ()))
    assert spec.sets[2] == SetSpec("moe_any_m", ((4096, 7168), (7168, 2048)), builds,
                                   dynamic_m=True, max_m=4096)
    assert spec.sets[0].dynamic_m is False and spec.sets[0].max_m is None
    unbounded = parse(dyn_edit("    max_m: 4096\n", ""), fams).sets[2]
    assert (unbounded.dynamic_m, unbounded.max_m) == (True, None)


D = E + "sets[moe_any_m]"
DYN_CASES = [
    ("m: dynamic", "m: 128",
     D + ".m: m must be 'dynamic' (m chosen at run time; for fixed m give [m, n, k] groups and "
     "no m key), but got int 128"),
    ("m: dynamic", "m: Dynamic",
     D + ".m: m must be 'dynamic' (m chosen at run time; for fixed m give [m, n, k] groups and "
     "no m key), but got str 'Dynamic'"),
    ("m: dynamic", "m:",
     D + ".m: m must be 'dynamic' (m chosen at run time; for fixed m give [m, n, k] groups and "
     "no m key), but got null"),
    ("[4096, 7168], [7168", "[64, 4096, 7168], [7168",
     D + ".groups[0]: group must be a list [n, k] (the set has m: dynamic), but got a list of 3"),
    ("[[4096, 7168], [7168, 2048]]", "[[4096, 7168], 7168]",
     D + ".groups[1]: group must be a list [n, k] (the set has m: dynamic), but got int 7168"),
    ("[[4096, 7168], [7168, 2048]]", "[]",
     D + ".groups: groups must not be empty, but got an empty list"),
    ("[4096, 7168],", "['4096', 7168],",
     D + ".groups[0][0]: n must be an int, but got str '4096'"),
    ("[4096, 7168],", "[4096, true],",
     D + ".groups[0][1]: k must be an int, but got bool True"),
    ("[4096, 7168],", "[0, 7168],", D + ".groups[0][0]: n must be > 0, but got 0"),
    ("[7168, 2048]]", "[7168, -256]]", D + ".groups[1][1]: k must be > 0, but got -256"),
    ("[4096, 7168],", "[4000, 7168],",
     D + ".groups[0][0]: n must be a multiple of 128 (the sm_90a kernel's N multiple), but got "
     "4000"),
    ("[7168, 2048]]", "[7168, 2000]]",
     D + ".groups[1][1]: k must be a multiple of 256 (the sm_90a kernel's K granule), but got "
     "2000"),
    ("max_m: 4096", "max_m: 0", D + ".max_m: max_m must be > 0, but got 0"),
    ("max_m: 4096", "max_m: 4k", D + ".max_m: max_m must be an int, but got str '4k'"),
    ("max_m: 4096", "max_m: true", D + ".max_m: max_m must be an int, but got bool True"),
    ("max_m: 4096", "max_m: 300000",
     D + ".max_m: max_m * n must be < 2^31 for every group (the kernels index C with 32-bit "
     "offsets), but groups[1] has n = 7168: 300000 * 7168 = 2150400000"),
    ("    m: dynamic\n", "",
     D + ".max_m: max_m is only allowed with `m: dynamic` (this set's groups fix m), but got "
     "int 4096"),
    ("    m: dynamic\n    groups: [[4096, 7168], [7168, 2048]]\n    max_m: 4096\n",
     "    groups: [[4096, 7168], [7168, 2048]]\n",
     D + ".groups[0]: group must be a list [m, n, k] (for m chosen at run time, give the set "
     "`m: dynamic` and [n, k] groups), but got a list of 2"),
    ("max_m: 4096", "max_m: 4096\n    m_max: 1",
     D + ": unknown key 'm_max'; did you mean 'max_m'? (allowed keys: name, groups, m, max_m, "
     "archs, acc_stages, options, out_dtypes, experts, n, k)"),
    ("    m: dynamic\n", "    m: dynamic\n    m: dynamic\n",
     E + "line 13, column 5: duplicate key 'm' (first written on line 12)"),
]


@pytest.mark.parametrize("old,new,message", DYN_CASES, ids=[c[2][len(D):70] for c in DYN_CASES])
def test_invalid_dynamic_m_set_message(fams: Families, old: str, new: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(dyn_edit(old, new), fams)
    assert str(info.value) == message


def test_exact_group_m_times_n_must_fit_32_bits(fams: Families) -> None:
    with pytest.raises(SpecError) as info:
        parse(edit("[40, 7168, 2048]", "[300000, 7168, 2048]"), fams)
    assert str(info.value) == (E + "sets[moe_down].groups[0]: m * n must be < 2^31 (the kernels "
                               "index C with 32-bit offsets), but got 300000 * 7168 = 2150400000")
    # 2^31 - 1 fits: 2^31 = 2147483648 is the first product refused.
    ok = parse(edit("[40, 7168, 2048]", "[299593, 7168, 2048]"), fams)  # 2147482624
    assert ok.sets[1].groups[0] == (299593, 7168, 2048)


def test_default_shapes_yaml_declares_dynamic_m_sets() -> None:
    fams = load_families("kernels.families")
    sets = {s.name: s for s in load_spec(REPO / "shapes.yaml", fams).sets}
    for name, exact in (("moe_gateup_any_m", "moe_gateup"), ("moe_down_any_m", "moe_down")):
        dyn = sets[name]
        assert dyn.dynamic_m and dyn.max_m == 4096
        assert dyn.groups == tuple((n, k) for _, n, k in sets[exact].groups), name
    mixed = sets["mixed_any_m"]
    assert mixed.dynamic_m and mixed.max_m is None
    assert len({n for n, _ in mixed.groups}) > 1 and len({k for _, k in mixed.groups}) > 1
    # Tiny sets for bench/host_cost.py: G = 2 and G = 8, one 128-row tile of n per group.
    assert [len(sets[n].groups) for n in ("tiny2_any_m", "tiny8_any_m")] == [2, 8]


def test_sm100_ab_stages_beyond_shared_memory_is_a_spec_error(tmp_path) -> None:
    # The family's own check (kernels/sm100/config.py) rejects it before anything compiles.
    p = tmp_path / "shapes.yaml"
    p.write_text(
        "schema_version: 1\n"
        "sets:\n"
        "  - name: s\n"
        "    groups: [[64, 128, 256]]\n"
        "    archs: [sm_100a]\n"
        "    acc_stages: [2]\n"
        "    options: {sm_100a: {ab_stages: 7}}\n")
    with pytest.raises(SpecError) as info:
        load_spec(p, load_families("kernels.families"))
    assert "ab_stages 7 needs 7 x 36864 + 1024 = 259072 bytes of shared memory" in str(info.value)
    assert "sets[s]" in str(info.value)


# ------------------------------------------------------------------ out_dtypes (issue 24)


def test_out_dtypes_default_to_both_and_sets_override_defaults(fams: Families) -> None:
    spec = parse(BASE, fams)
    assert [s.out_dtypes for s in spec.sets] == [("bfloat16", "float16")] * 2
    names = [it.name for it in expand(spec, fams) if it.set == "moe_down"]
    assert names == ["moe_down.sm_100a.acc1.bf16", "moe_down.sm_100a.acc1.f16",
                     "moe_down.sm_100a.acc2.bf16", "moe_down.sm_100a.acc2.f16",
                     "moe_down.sm_90a.acc1.bf16", "moe_down.sm_90a.acc1.f16"]
    text = BASE.replace("  acc_stages: {sm_100a: [1, 2], sm_90a: [1]}\n",
                        "  acc_stages: {sm_100a: [1, 2], sm_90a: [1]}\n"
                        "  out_dtypes: [float16]\n")
    text += "    out_dtypes: [bfloat16]\n"  # moe_down's own list replaces the defaults'
    spec = parse(text, fams)
    assert [s.out_dtypes for s in spec.sets] == [("float16",), ("bfloat16",)]
    items = expand(spec, fams)
    assert {(it.set, it.out_dtype) for it in items} == {("moe_gateup", "float16"),
                                                        ("moe_down", "bfloat16")}
    # The output type is part of the content key: same shapes, other dtype, other cubin.
    one = expand(parse(BASE, fams), fams)
    keys = {(it.set, it.arch, it.acc_stages, it.out_dtype): it.key for it in one}
    assert keys[("moe_down", "sm_90a", 1, "float16")] != keys[("moe_down", "sm_90a", 1,
                                                               "bfloat16")]


@pytest.mark.parametrize("value,message", [
    ("[float32]", "sets[moe_down].out_dtypes[0]: out_dtype must be one of ['float16', "
                  "'bfloat16'], but got str 'float32'"),
    ("[bfloat16, bfloat16]", "sets[moe_down].out_dtypes[1]: out_dtype 'bfloat16' is listed "
                             "twice"),
    ("[]", "sets[moe_down].out_dtypes: out_dtypes must not be empty, but got an empty list"),
    ("bfloat16", "sets[moe_down].out_dtypes: out_dtypes must be a list, but got str "
                 "'bfloat16'"),
    ("[16]", "sets[moe_down].out_dtypes[0]: out_dtype must be one of ['float16', "
             "'bfloat16'], but got int 16"),
])
def test_invalid_out_dtypes_message(fams: Families, value: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(BASE + f"    out_dtypes: {value}\n", fams)
    assert str(info.value) == f"shapes.yaml: {message}"


def test_out_dtype_is_not_an_option(fams: Families) -> None:
    with pytest.raises(SpecError, match=r"unknown key 'out_dtype'"):
        parse(BASE.replace("{sm_90a: {tile_m: 64}}", "{sm_90a: {out_dtype: bfloat16}}"), fams)


# ------------------------------------------------------------------ expert layers (issue 26)


def test_expert_set_is_a_dynamic_set_of_identical_groups(fams: Families) -> None:
    text = BASE + "  - name: layer\n    experts: 3\n    n: 256\n    k: 512\n    max_m: 64\n"
    layer = parse(text, fams).sets[-1]
    assert layer.dynamic_m and layer.max_m == 64
    assert layer.groups == ((256, 512), (256, 512), (256, 512))


@pytest.mark.parametrize("extra,message", [
    ("    experts: 2\n    n: 256\n", "sets[layer]: key 'k' is missing (an expert set gives "
                                      "experts, n and k)"),
    ("    experts: 0\n    n: 256\n    k: 512\n", "sets[layer].experts: experts must be in "
                                                  "1..1024, but got 0"),
    ("    experts: 2\n    n: 256\n    k: 500\n", "sets[layer].k: k must be a multiple of 256 "
                                                  "(the sm_90a kernel's K granule), but got 500"),
    ("    experts: 2\n    n: 200\n    k: 512\n", "sets[layer].n: n must be a multiple of 128 "
                                                  "(the sm_90a kernel's N multiple), but got 200"),
    ("    experts: 2\n    n: 256\n    k: 512\n    groups: [[256, 512]]\n",
     "sets[layer].groups: groups must not be given with experts (an expert set is `m: dynamic` "
     "with E groups [n, k]), but got a list of 1"),
    ("    groups: [[1, 256, 512]]\n    n: 256\n", "sets[layer].n: n is only allowed with "
                                                  "experts (an expert layer: experts, n, k), but "
                                                  "got int 256"),
])
def test_invalid_expert_set_message(fams: Families, extra: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(BASE + "  - name: layer\n" + extra, fams)
    assert str(info.value) == f"shapes.yaml: {message}"


def test_default_shapes_yaml_declares_the_model_expert_layers() -> None:
    """Issue 26: the expert GEMMs of real models, for scaled_grouped_mm (serving.md)."""
    fams = load_families("kernels.families")
    sets = {s.name: s for s in load_spec(REPO / "shapes.yaml", fams).sets}
    layers = {"dsv3_gateup_e256": (256, 4096, 7168), "dsv3_down_e256": (256, 7168, 2048),
              "dsv3_gateup_e32": (32, 4096, 7168), "dsv3_down_e32": (32, 7168, 2048),
              "qwen3_30b_gateup": (128, 1536, 2048), "qwen3_30b_down": (128, 2048, 768),
              "qwen3_235b_gateup_e128": (128, 3072, 4096), "qwen3_235b_down_e128": (128, 4096, 1536),
              "qwen3_235b_gateup_e16": (16, 3072, 4096), "qwen3_235b_down_e16": (16, 4096, 1536),
              "mixtral_gateup": (8, 28672, 4096), "mixtral_down": (8, 4096, 14336)}
    for name, (e, n, k) in layers.items():
        s = sets[name]
        assert s.dynamic_m and s.max_m is None and s.groups == ((n, k),) * e, name
        assert s.out_dtypes == ("bfloat16", "float16"), name
