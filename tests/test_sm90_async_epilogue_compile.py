"""The epilogue (Config.async_epilogue, always on: the consumers leave C in shared memory, warps
1..3 store it) must keep building past the compile's guards, and the PTX must show the
hand-over: the consumers' 64 two-byte C stores per thread go to shared memory, none to global,
the storers write C in 16-byte vectors, and named barriers pass the tile."""

from __future__ import annotations

from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

SCRIPT = """
k = compile_kernel(Config(tile_n=192, a_slots=5), arch="sm_90a", groups=[(128, 4096, 7168)])
print(json.dumps({key: k.ptx.count(key) for key in
                  ("st.global.b16", "st.shared.b16", "bar.arrive", "bar.sync", "st.global.v4")}))
"""


def test_async_epilogue_hands_tiles_to_the_storer_warps() -> None:
    out = compile_sm90(SCRIPT)
    # 192 x 128 accumulators over 384 consumer threads: 64 each, all to the shared C tile
    assert (out["st.global.b16"], out["st.shared.b16"]) == (0, 64)
    # full barriers on both sides, so racecheck sees the hand-over: the consumers' "free" and
    # "full", the storers' first "free", their "full" and "free" between tiles: 5 on top of the
    # 4 the kernel had with the consumers' own C stores (wip-v3-direct-epilogue)
    assert out["bar.arrive"] == 0 and out["bar.sync"] == 4 + 5
    # the storers' 16-byte C stores (and the staging phase's)
    assert out["st.global.v4"] > 0
