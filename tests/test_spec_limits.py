"""shapes.yaml limits (issue 28): every value a device table stores is bounded, set names fit a
file name, sets and groups are capped, the parser is libyaml's, and a rule broken by an option
inherited from `defaults` names that defaults key. Real families: the sm90 rules are the point
of the inherited-option case."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from builder import spec as spec_mod
from builder.errors import SpecError
from builder.families import Families, load_families
from builder.spec import load_spec, parse_spec_text

HEAD = "schema_version: 1\ndefaults:\n  archs: [sm_90a]\nsets:\n"


@pytest.fixture(scope="module")
def fams() -> Families:
    return load_families()


def _error(text: str, fams: Families) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, "shapes.yaml", fams)
    return str(info.value)


# ------------------------------------------------------------------ case 4: cubin file names


def test_a_set_name_too_long_for_the_cubin_file_name_is_a_spec_error(fams: Families) -> None:
    name = "s" * 225
    msg = _error(HEAD + f"  - name: {name}\n    groups: [[64, 256, 256]]\n", fams)
    assert msg == (f"shapes.yaml: sets[0].name: set name must be at most 128 characters (it goes "
                   f"into the cubin's file name), but got 225: {'s' * 40}...")


# ------------------------------------------------------------------ case 5: table values


@pytest.mark.parametrize("group,dynamic,message", [
    ("[1, 256, 2147483648]", False,
     "sets[big].groups[0][2]: k must be < 2^31 (the runtime's problem-size table holds int32), "
     "but got 2147483648"),
    ("[2147483648, 256]", True,
     "sets[big].groups[0][0]: n must be < 2^31 (the runtime's problem-size table holds int32), "
     "but got 2147483648"),
])
def test_sizes_the_runtime_tables_cannot_hold_are_spec_errors(
        fams: Families, group: str, dynamic: bool, message: str) -> None:
    m = "    m: dynamic\n" if dynamic else ""
    assert _error(HEAD + f"  - name: big\n{m}    groups: [{group}]\n", fams) == \
        f"shapes.yaml: {message}"


# ------------------------------------------------------------------ case 7: limits


def test_the_parser_is_libyaml_and_still_rejects_duplicate_keys(fams: Families) -> None:
    if not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML built without libyaml")
    assert issubclass(spec_mod._Loader, yaml.CSafeLoader)
    text = HEAD + "  - name: a\n    groups: [[64, 256, 256]]\n    groups: [[64, 256, 512]]\n"
    assert _error(text, fams) == ("shapes.yaml: line 7, column 5: duplicate key 'groups' (first "
                                  "written on line 6)")


def test_caps_on_sets_groups_and_file_size(fams: Families, tmp_path: Path) -> None:
    sets = "".join(f"  - name: s{i}\n    groups: [[64, 256, 256]]\n" for i in range(1025))
    assert _error(HEAD + sets, fams) == \
        "shapes.yaml: sets: the file must have at most 1024 sets, but got 1025"
    groups = ", ".join(["[64, 256, 256]"] * 1025)
    assert _error(HEAD + f"  - name: g\n    groups: [{groups}]\n", fams) == \
        "shapes.yaml: sets[g].groups: a set must have at most 1024 groups, but got 1025"
    big = tmp_path / "big.yaml"
    big.write_text(HEAD + "# " + "x" * (1 << 20) + "\n")
    with pytest.raises(SpecError, match=r"must be at most 1048576 bytes, but it has 1048631"):
        load_spec(big, fams)


def test_an_option_inherited_from_defaults_is_named_with_its_defaults_key(
        fams: Families) -> None:
    text = ("schema_version: 1\ndefaults:\n  archs: [sm_90a]\n"
            "  options: {sm_90a: {tile_n: 192, patch_ahead: true}}\nsets:\n"
            "  - name: big\n    groups: [[56, 1024, 768]]\n    options: {sm_90a: {tile_m: 256}}\n")
    assert _error(text, fams) == (
        "shapes.yaml: sets[big].options.sm_90a (with patch_ahead, tile_n from "
        "defaults.options.sm_90a): the sm90 config for acc stage 1 is invalid: tile_m 256 needs "
        "tile_n 128 (two consumer warpgroups hold its accumulator), but got tile_n 192")


# ------------------------------------------------------------------ what the parser cannot read


def test_deep_nesting_is_a_spec_error_not_a_crash(fams: Families) -> None:
    # 100,000 levels crashed the process inside libyaml's composer (a segfault); 2,000 raised
    # a RecursionError traceback.
    for depth in (65, 2_000, 100_000):
        text = "schema_version: 1\nsets: " + "[" * depth + "]" * depth + "\n"
        assert _error(text, fams) == ("shapes.yaml: line 2, column 70: collections nest deeper "
                                      "than 64 levels (a shapes.yaml needs about 5)")


def test_values_python_cannot_read_are_spec_errors(fams: Families) -> None:
    msg = _error(HEAD + f"  - name: big\n    groups: [[64, 256, {'9' * 5000}]]\n", fams)
    assert msg.startswith("shapes.yaml: a value cannot be read: Exceeds the limit (4300 digits)")
    # max_m is a table value like the others (its message once formatted max_m * n).
    msg = _error(HEAD + f"  - name: big\n    m: dynamic\n    max_m: {'9' * 4000}\n"
                        "    groups: [[256, 256]]\n", fams)
    assert msg.startswith("shapes.yaml: sets[big].max_m: max_m must be < 2^31 (the runtime's "
                          "problem-size table holds int32), but got 9999")


def test_a_yaml_merge_key_override_is_not_a_duplicate(fams: Families) -> None:
    text = HEAD + ("  - &base {name: dense_a, groups: [[64, 256, 256]], options: {sm_90a: "
                   "{tile_n: 192, a_slots: 5}}}\n  - <<: *base\n    name: dense_b\n")
    a, b = parse_spec_text(text, "shapes.yaml", fams).sets
    assert (a.name, b.name) == ("dense_a", "dense_b")
    assert b.groups == a.groups and b.builds == a.builds
    # A key written twice by hand is still one.
    assert _error(HEAD + "  - {name: x, groups: [[64, 256, 256]], name: y}\n", fams) == (
        "shapes.yaml: line 5, column 41: duplicate key 'name' (first written on line 5)")
