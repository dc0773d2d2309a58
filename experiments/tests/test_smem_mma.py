"""experiments/smem_mma.py times shared-memory-sourced wgmma next to conversion-like shared-memory
traffic. Its numbers mean something only if each variant's timed loop holds what the variant
says: 4 wgmma m64nNk16 per step, the stated 16-byte stores and loads, the ALU ops, and the named
barrier when asked for."""

from __future__ import annotations

import sys
from pathlib import Path

from probe_sass import NEEDS_DSL, probe_sass

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/
from smem_mma import VARIANTS  # noqa: E402

pytestmark = NEEDS_DSL


def test_smem_mma_loops_hold_what_each_variant_says(tmp_path: Path) -> None:
    sass_by_variant = probe_sass("smem_mma.py", tmp_path / "sm")
    assert sorted(sass_by_variant) == list(range(len(VARIANTS)))
    for i, sass in sass_by_variant.items():
        _, n, stores, alu, sync = VARIANTS[i]
        lines = [line for line in sass.splitlines() if "/*" in line and ";" in line]
        stamps = [j for j, line in enumerate(lines) if "SR_CLOCKLO" in line]
        assert len(stamps) == 2, (i, stamps)
        loop = lines[stamps[0] + 1:stamps[1]]

        def count(op: str, lines=loop) -> int:
            return sum(op in line for line in lines)

        assert count(f"HGMMA.64x{n}x16.F32") == 4, i
        assert count("STS.128") == stores, i
        assert count("LDS.128") == stores // 2, i
        assert count("IMAD ") >= alu, i
        assert count("BAR.SYNC.DEFER_BLOCKING 0x1") == int(sync), i
        assert count("WARPGROUP.ARRIVE") == 1 and count("WARPGROUP.DEPBAR.LE") >= 1, i
