"""experiments/first_load.py measures how long a kernel's first loads take on their own. Its number
means something only if each thread has every copy in flight before it waits: the built
kernels must issue all their cp.async copies, then one wait for all, then the CTA barrier and
the stamp, in that order."""

from __future__ import annotations

from pathlib import Path

from probe_sass import NEEDS_DSL, probe_sass

pytestmark = NEEDS_DSL


def test_first_load_kernels_issue_every_copy_before_one_wait(tmp_path: Path) -> None:
    sass_by_size = probe_sass("first_load.py", tmp_path / "fl")
    assert sorted(sass_by_size) == [2, 25, 100]
    for vecs, sass in sass_by_size.items():
        ops = [op for line in sass.splitlines()
               for op in ("LDGSTS", "DEPBAR.LE SB0, 0x0", "BAR.SYNC", "CS2R") if op in line]
        copies = ops.count("LDGSTS")
        assert copies == vecs, (vecs, ops)
        last_copy = max(i for i, op in enumerate(ops) if op == "LDGSTS")
        # start stamps, every copy, the one wait, the barrier, the end stamps
        assert ops[last_copy + 1:] == ["DEPBAR.LE SB0, 0x0", "BAR.SYNC", "CS2R", "CS2R"], ops
        assert ops[:2] == ["CS2R", "CS2R"], ops
