"""shapes.yaml sets with the sm_90a option stream_a, against the real families: the kernel stages
A in K order across all groups with one lane per group, so a set whose groups have more than one
k, or more than 32 groups, must be refused at parse time (builder/spec.py, groups_fit, through
kernels/sm90/config.py check_groups) with a message naming the set, before anything compiles.
(tests/test_spec.py uses a fake family, which has no check_groups.)"""

from __future__ import annotations

import pytest

from builder.errors import SpecError
from builder.families import Families, load_families
from builder.spec import ArchBuild, ShapeSpec, parse_spec_text

E = "shapes.yaml: "
ONE_K = ("the sm90 config for acc stage 1 cannot serve this set's groups: stream_a needs one k "
         "for all groups (it stages A in K order across groups), but the groups have k ")
MAX_GROUPS = ("the sm90 config for acc stage 1 cannot serve this set's groups: stream_a serves "
              "at most 32 groups (one per lane of a staging warp), but got ")

MIXED_K = "[[40, 7168, 2048], [76, 4096, 7168]]"
ONE_K_GROUPS = "[[40, 7168, 2048], [76, 7168, 2048]]"


@pytest.fixture(scope="module")
def fams() -> Families:
    return load_families("kernels.families")


def parse(text: str, fams: Families) -> ShapeSpec:
    return parse_spec_text(text, "shapes.yaml", fams)


def one_set(groups: str, options: str = "{sm_90a: {stream_a: true}}",
            archs: str = "[sm_90a, sm_100a]", extra: str = "") -> str:
    """A spec of one set `s` (plus `extra` lines in it)."""
    return ("schema_version: 1\n"
            "sets:\n"
            "  - name: s\n"
            f"    archs: {archs}\n"
            f"    groups: {groups}\n"
            f"    options: {options}\n" + extra)


def message(text: str, fams: Families) -> str:
    with pytest.raises(SpecError) as info:
        parse(text, fams)
    return str(info.value)


def test_stream_a_with_one_k_parses(fams: Families) -> None:
    spec = parse(one_set(ONE_K_GROUPS), fams)
    (s,) = spec.sets
    assert s.groups == ((40, 7168, 2048), (76, 7168, 2048))
    assert s.builds == (ArchBuild("sm_90a", (1,), (("stream_a", True),)),
                        ArchBuild("sm_100a", (2,), ()))  # its default acc stage


def test_stream_a_with_groups_of_different_k_is_refused(fams: Families) -> None:
    assert message(one_set(MIXED_K), fams) == E + "sets[s].options.sm_90a: " + ONE_K + "[2048, 7168]"


def test_without_stream_a_groups_of_different_k_parse(fams: Families) -> None:
    for options in ("{sm_90a: {stream_a: false}}", "{sm_90a: {tile_m: 64}}"):
        assert parse(one_set(MIXED_K, options), fams).sets[0].groups[1] == (76, 4096, 7168)


def test_stream_a_serves_at_most_32_groups(fams: Families) -> None:
    thirty_two = "[" + ", ".join(["[64, 256, 512]"] * 32) + "]"
    assert len(parse(one_set(thirty_two), fams).sets[0].groups) == 32
    thirty_three = "[" + ", ".join(["[64, 256, 512]"] * 33) + "]"
    assert message(one_set(thirty_three), fams) == E + "sets[s].options.sm_90a: " + MAX_GROUPS + "33"
    # both reasons, in check_groups' order
    mixed = "[[64, 256, 256], " + ", ".join(["[64, 256, 512]"] * 33) + "]"
    assert message(one_set(mixed), fams) == (
        E + "sets[s].options.sm_90a: " + ONE_K + "[256, 512]; stream_a serves at most 32 groups "
        "(one per lane of a staging warp), but got 34")


def test_dynamic_m_sets_are_checked_on_their_k(fams: Families) -> None:
    """Groups of (n, k): the k is the last entry there too."""
    dyn = "    m: dynamic\n"
    text = one_set("[[7168, 2048], [4096, 7168]]", extra=dyn)
    assert message(text, fams) == E + "sets[s].options.sm_90a: " + ONE_K + "[2048, 7168]"
    spec = parse(one_set("[[7168, 2048], [4096, 2048]]", extra=dyn), fams)
    assert spec.sets[0].dynamic_m and spec.sets[0].groups == ((7168, 2048), (4096, 2048))


def test_the_invalid_combination_is_reported_before_the_groups(fams: Families) -> None:
    """An invalid config is reported as such whatever the groups (config.check), not as groups
    that stream_a cannot serve."""
    text = one_set(MIXED_K, "{sm_90a: {stream_a: true, tile_m: 256, tile_n: 192}}")
    assert message(text, fams) == (
        E + "sets[s].options.sm_90a: the sm90 config for acc stage 1 is invalid: tile_m 256 needs "
        "tile_n 128 (two consumer warpgroups hold its accumulator), but got tile_n 192")
    assert message(one_set(ONE_K_GROUPS, "{sm_90a: {stream_a: 1}}"), fams) == (
        E + "sets[s].options.sm_90a.stream_a: stream_a must be a bool, but got int 1")


def test_a_set_without_sm_90a_is_not_checked(fams: Families) -> None:
    text = one_set(MIXED_K, "{sm_100a: {ab_stages: 4}}", archs="[sm_100a]")
    assert parse(text, fams).sets[0].groups[1] == (76, 4096, 7168)


DEFAULTS = """\
schema_version: 1
defaults:
  archs: [sm_90a]
  options: {sm_90a: {stream_a: true}}
sets:
  - name: same_k
    groups: [[40, 7168, 2048], [76, 7168, 2048]]
  - name: mixed
    groups: [[40, 7168, 2048], [76, 4096, 7168]]
"""


def test_stream_a_from_defaults_checks_every_set(fams: Families) -> None:
    msg = message(DEFAULTS, fams)
    assert msg.startswith(E + "sets[mixed].options")
    assert msg.endswith(": " + ONE_K + "[2048, 7168]")
    # the set that turns it off parses, and so does the one-k set
    text = DEFAULTS + "    options: {sm_90a: {stream_a: false}}\n"
    spec = parse(text, fams)
    assert [s.builds[0].options for s in spec.sets] == [(("stream_a", True),),
                                                        (("stream_a", False),)]


def test_stream_a_from_defaults_names_the_defaults_key(fams: Families) -> None:
    assert message(DEFAULTS, fams) == (
        E + "sets[mixed].options (from defaults.options.sm_90a): " + ONE_K + "[2048, 7168]")
