"""The register-B K order must match between the two wgmma operands.

The weights are dequantized straight into wgmma A-operand registers and the
activations into a shared-memory tile; the K order inside each 64-K step is ours to choose, but
it must be the SAME permutation on both sides or every dot product is wrong. This emulates both
placements with the formulas the kernel uses (kernels/sm90/fp4_bits.py) and the register
fragment coordinates traced from the DSL's own RS tiled MMA.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.sm90.fp4_bits import fragment_word, permuted_chunk

REPO = Path(__file__).resolve().parents[1]


def fragment_coords(thread: int) -> list[tuple[int, int]]:
    """(row, k) of each fp16 element of a thread's A fragment over a (128, 64) tile: the layout
    traced from the DSL in test_fragment_coords_match_the_dsl (word w = elements 2w, 2w+1)."""
    c, t = thread % 4, thread % 128
    r0 = (thread // 128) * 64 + (t // 32) * 16 + (t % 32) // 4
    out = []
    for kb in range(4):
        for khalf in range(2):
            for rowhalf in range(2):
                for e in range(2):
                    out.append((r0 + 8 * rowhalf, 16 * kb + 2 * c + 8 * khalf + e))
    # element order in the fragment: e fastest, then rowhalf, then khalf, then kb
    return out


def physical_k_of_pair(word: int, q: int) -> tuple[int, int]:
    """Physical K (within the 64-K step) of output pair q of packed word `word` (dequant.py)."""
    return 8 * word + q, 8 * word + q + 4


def test_register_and_shared_operands_use_one_k_order() -> None:
    # B side: for every thread, which physical K lands at each logical (row, k) of the tile.
    b_order: dict[tuple[int, int], int] = {}
    for thread in range(256):
        coords = fragment_coords(thread)
        c = thread % 4
        for rowhalf in range(2):
            for upper in range(2):
                for q in range(4):
                    w = fragment_word(q, rowhalf, upper)
                    for e, phys in enumerate(physical_k_of_pair(c + 4 * upper, q)):
                        row, k = coords[2 * w + e]
                        assert (row, k) not in b_order
                        b_order[(row, k)] = phys
    assert len(b_order) == 128 * 64
    # A side: thread layout of _dequant_rows for 128 and 64 rows.
    for rows in (128, 64):
        words = rows // 32
        per_row = 8 // words
        a_order: dict[tuple[int, int], int] = {}
        for ct in range(256):
            r, part = divmod(ct, per_row)
            first = part * words
            for q in range(4):
                chunk, byte = permuted_chunk(first, q)
                for i in range(words):
                    for e, phys in enumerate(physical_k_of_pair(first + i, q)):
                        k = chunk * 8 + (byte + 4 * i) // 2 + e
                        assert (r, k) not in a_order
                        a_order[(r, k)] = phys
        assert len(a_order) == rows * 64
        for r in range(rows):
            # every logical k must hold the same physical k for A rows and B rows
            assert [a_order[(r, k)] for k in range(64)] == [b_order[(0, k)] for k in range(64)]
            assert sorted(a_order[(r, k)] for k in range(64)) == list(range(64))
    for row in range(128):
        assert [b_order[(row, k)] for k in range(64)] == [b_order[(0, k)] for k in range(64)]


_TRACE = r"""
import json
import cutlass, cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass import Float16, Float32
out = {}
@cute.jit
def trace():
    tm = sm90_utils.make_trivial_tiled_mma(Float16, Float16, OperandMajorMode.K,
        OperandMajorMode.K, Float32, (2, 1, 1), tiler_mn=(64, 128),
        a_source=warpgroup.OperandSource.RMEM)
    ident = cute.make_identity_tensor((128, 64))
    for t in (0, 1, 5, 37, 130, 255):
        c = tm.get_slice(t).partition_A(ident)
        out[t] = [tuple(int(x) for x in c[i]) for i in range(cute.size(c))]
cute.compile(trace, options="--gpu-arch sm_90a")
print("COORDS " + json.dumps(out))
"""


@pytest.mark.dsl
def test_fragment_coords_match_the_dsl(tmp_path: Path) -> None:
    pytest.importorskip("cutlass")
    script = tmp_path / "trace_fragment.py"  # the DSL needs a source file to trace
    script.write_text(_TRACE)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("COORDS ")]
    assert line, proc.stdout + proc.stderr
    traced = json.loads(line[0][len("COORDS "):])
    for t, coords in traced.items():
        assert [tuple(x) for x in coords] == fragment_coords(int(t)), t
