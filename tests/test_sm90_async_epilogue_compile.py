"""Config.async_epilogue (the consumers leave C in shared memory, warps 1..3 store it) must keep
building past the compile's guards, and the PTX must show the hand-over: the consumers' 64
two-byte C stores per thread become shared-memory stores, and named barriers pass the tile."""

from __future__ import annotations

from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

SCRIPT = """
out = {}
for name, on in (("off", False), ("on", True)):
    k = compile_kernel(Config(tile_n=192, a_slots=5, async_epilogue=on), arch="sm_90a",
                       groups=[(128, 4096, 7168)])
    out[name] = {key: k.ptx.count(key) for key in
                 ("st.global.b16", "st.shared.b16", "bar.arrive", "bar.sync", "st.global.v4")}
print(json.dumps(out))
"""


def test_async_epilogue_hands_tiles_to_the_storer_warps() -> None:
    out = compile_sm90(SCRIPT)
    off, on = out["off"], out["on"]
    # 192 x 128 accumulators over 384 consumer threads: 64 values each
    assert (off["st.global.b16"], off["st.shared.b16"], off["bar.arrive"]) == (64, 0, 0)
    assert (on["st.global.b16"], on["st.shared.b16"]) == (0, 64)
    # full barriers on both sides, so racecheck sees the hand-over: the consumers' "free" and
    # "full", the storers' first "free", their "full" and "free" between tiles
    assert on["bar.arrive"] == 0 and on["bar.sync"] == off["bar.sync"] + 5
    # the storers' 16-byte C stores come on top of the staging phase's
    assert on["st.global.v4"] > off["st.global.v4"]
