"""experiments/decode_ab.py's ab_case, shared with masked_ab.py: each variant's last output is
checked after a replay of its own graph (NaN first), against torch._grouped_mm's rows, through
`valid` for the masked layout. The GPU parts (graph capture, interleaved timing, the launch) are
replaced by CPU stand-ins whose "graph" calls its function again on replay, so a launch bound
late to the last variant would show here."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "experiments", ROOT / "bench", ROOT / "scripts"):
    sys.path.insert(0, str(p))
import decode_ab

THEIRS = torch.arange(6.0).view(2, 3)


class _Graph:
    def __init__(self, fn):
        self.fn = fn

    def replay(self) -> None:
        self.fn()


def _run(valid=lambda out: out, theirs=THEIRS):
    outs = {}

    def empty(shape, dtype=None, device=None):
        t = torch.zeros(shape)
        outs[t.data_ptr()] = t
        return t

    class Runtime:
        def offsets_plan(self, entry, experts, n, k, t):
            return entry.name

        def launch_offsets(self, op, ptrs, alpha):
            # Variant "good" writes the reference, "bad" something else.
            outs[ptrs[-1]].copy_(THEIRS if op == "good" else THEIRS + 1)

    def variant(name):
        return types.SimpleNamespace(entry=name, set="lay_" + name, experts=2, n=3, k=4)

    gg = types.SimpleNamespace(kernels=[types.SimpleNamespace(name="good"),
                                        types.SimpleNamespace(name="bad")])
    inputs = [{"a": torch.zeros(1), "sfa": torch.zeros(1)} for _ in range(2)]
    w = types.SimpleNamespace(b=torch.zeros(1), sfb=torch.zeros(1))
    variants = [variant("good"), variant("bad")]
    with mock.patch.object(decode_ab, "capture", lambda fn: (fn(), _Graph(fn))[1]), \
            mock.patch.object(decode_ab, "time_interleaved",
                              lambda graphs, reps: [10.0 * len(g) for g in graphs]), \
            mock.patch.object(decode_ab.torch, "empty", empty):
        times, same = decode_ab.ab_case(gg, Runtime(), variants, inputs, [w, w], torch.zeros(1),
                                        2, (2, 3), 5, theirs, valid=valid)
    return variants, times, same


def test_ab_case_checks_each_variant_against_the_reference() -> None:
    variants, times, same = _run()
    assert times == [20.0, 20.0] and same == [True, False]
    assert decode_ab.cells(variants, times, same) == "good    20.0  bad    20.0 DIFF"


def test_ab_case_compares_only_the_valid_rows() -> None:
    assert _run(valid=lambda out: out[:1], theirs=THEIRS[:1])[2] == [True, False]
