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

from kernels.sm90.fp4_bits import (
    fragment_word,
    position_vector,
    position_word,
    thread_step_bytes,
)

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
                    for e, phys in enumerate(physical_k_of_pair(2 * c + upper, q)):
                        row, k = coords[2 * w + e]
                        assert (row, k) not in b_order
                        b_order[(row, k)] = phys
    assert len(b_order) == 128 * 64
    # The 8 packed bytes a B thread loads (thread_step_bytes) are exactly its two words.
    for s in range(4):
        for c in range(4):
            chunk, byte = thread_step_bytes(s, c)
            assert (chunk - 2 * s) * 16 + byte == 4 * (2 * c)
            assert byte % 8 == 0  # an aligned 8-byte load
    # A side: each row's step is converted by two lanes (parity p), position i of lane p
    # holding word position_word(p, i), its pair q written at byte 4 i of vector
    # position_vector(p, q) of the row's 64 fp16.
    a_order: dict[int, int] = {}
    for p in range(2):
        for i in range(4):
            word = position_word(p, i)
            assert word // 2 == i  # position i lies in 16-K block i (its scale byte)
            for q in range(4):
                for e, phys in enumerate(physical_k_of_pair(word, q)):
                    k = position_vector(p, q) * 8 + 2 * i + e
                    assert k not in a_order
                    a_order[k] = phys
    assert sorted(a_order) == list(range(64))
    assert sorted(a_order.values()) == list(range(64))
    for row in range(128):
        # every logical k must hold the same physical k for A rows and B rows
        assert [a_order[k] for k in range(64)] == [b_order[(row, k)] for k in range(64)]
    # A B thread's two words and their 16 K lie in one 16-K scale block (the byte it loads).
    for c in range(4):
        assert {(8 * (2 * c + u) + j) // 16 for u in range(2) for j in range(8)} == {c}


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
