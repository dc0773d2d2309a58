"""Options deleted with their code paths (issue 25: what lost in measurement) are refused in
shapes.yaml by name, with why and where their code is, not as unknown keys; in `defaults` as in
a set, whatever the value (kernels/sm90/config.py, REMOVED_OPTIONS)."""

from __future__ import annotations

import pytest

from builder.errors import SpecError
from builder.families import Families, load_families
from builder.spec import parse_spec_text
from kernels.sm90.config import REMOVED_OPTIONS, Config


@pytest.fixture(scope="module")
def fams() -> Families:
    return load_families("kernels.families")


def _error(text: str, fams: Families) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, "shapes.yaml", fams)
    return str(info.value)


@pytest.mark.parametrize("option, reason", [
    ("a_fp16", "a_fp16 was removed in issue 25: v2, which converted A per tile (a_fp16: false), "
               "lost to v3 with stream_a, and every sm_90a kernel converts A once per call (v2 "
               "is last at commit b6627c2); delete it"),
    ("w_regs", "w_regs was removed in issue 25: weights through a shared fp16 tile (w_regs: "
               "false) lost to the register operand (branch wip-smem-fp16-b-option); delete it"),
    ("stream_k", "stream_k was removed in issue 25: stream-K lost 7% on moe_down and 3-8 us on "
                 "the dense sets (branch wip-stream-k-option); delete it"),
    ("trace", "trace was removed in issue 25: the clock-stamp diagnostic is a build of its own, "
              "not an option (python experiments/trace_families.py --spec SPEC --out DIR traces "
              "a spec's list and serving sets: experiments/trace_ab.yaml, "
              "experiments/trace_serving.yaml); delete it"),
], ids=["a_fp16", "w_regs", "stream_k", "trace"])
@pytest.mark.parametrize("value", ["true", "false"])
def test_a_removed_option_is_refused_by_name(fams: Families, option: str, reason: str,
                                             value: str) -> None:
    in_set = ("schema_version: 1\nsets:\n  - name: s\n    archs: [sm_90a]\n"
              f"    groups: [[56, 1024, 768]]\n    options: {{sm_90a: {{{option}: {value}}}}}\n")
    assert _error(in_set, fams) == f"shapes.yaml: sets[s].options.sm_90a.{option}: {reason}"
    in_defaults = (f"schema_version: 1\ndefaults:\n  options: {{sm_90a: {{{option}: {value}}}}}\n"
                   "sets:\n  - name: s\n    groups: [[56, 1024, 768]]\n")
    assert _error(in_defaults, fams) == (
        f"shapes.yaml: defaults.options.sm_90a.{option}: {reason}")


def test_removed_options_are_not_config_fields() -> None:
    assert set(REMOVED_OPTIONS) == {"a_fp16", "w_regs", "stream_k", "trace"}
    assert not set(REMOVED_OPTIONS) & set(Config.__dataclass_fields__)
