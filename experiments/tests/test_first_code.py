"""experiments/first_code.py measures what fetching cold code costs at a kernel's start. Its number
means something only if the block between the stamps is the straight-line code it claims: N
IMADs with no branch among them, run twice by one loop."""

from __future__ import annotations

from pathlib import Path

from probe_sass import NEEDS_DSL, probe_sass

pytestmark = NEEDS_DSL


def test_first_code_kernels_time_one_straight_block_of_n_imads(tmp_path: Path) -> None:
    sass_by_size = probe_sass("first_code.py", tmp_path / "fc")
    assert sorted(sass_by_size) == [512, 2048, 4096]
    for n, sass in sass_by_size.items():
        lines = [line for line in sass.splitlines() if "/*" in line and ";" in line]
        stamps = [i for i, line in enumerate(lines) if "SR_CLOCKLO" in line]
        assert len(stamps) == 2, stamps  # before the loop, and inside it after the block
        block = lines[stamps[0] + 1:stamps[1]]
        assert not [line for line in block if "BRA" in line], block
        imads = [line for line in block if "IMAD " in line or "IMAD\t" in line]
        assert len(imads) == n, (n, len(imads))
        # the loop's branch back comes after the second stamp
        assert any("BRA" in line for line in lines[stamps[1]:]), lines[stamps[1]:]
