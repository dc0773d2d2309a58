"""The v3 epilogue (Config.async_epilogue, always on with a_fp16: the consumers leave C in shared
memory, warps 1..3 store it) must keep building past the compile's guards, and the PTX must
show the hand-over: against v2, whose consumers store C themselves, the consumers' 64 two-byte C
stores per thread become shared-memory stores, and named barriers pass the tile."""

from __future__ import annotations

from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

SCRIPT = """
out = {}
for name, config in (("v2", Config(a_fp16=False, async_epilogue=False, patch_ahead=False)),
                     ("v3", Config(tile_n=192, a_slots=5))):
    k = compile_kernel(config, arch="sm_90a", groups=[(128, 4096, 7168)])
    out[name] = {key: k.ptx.count(key) for key in
                 ("st.global.b16", "st.shared.b16", "bar.arrive", "bar.sync", "st.global.v4")}
print(json.dumps(out))
"""


def test_async_epilogue_hands_tiles_to_the_storer_warps() -> None:
    out = compile_sm90(SCRIPT)
    v2, v3 = out["v2"], out["v3"]
    # 128 x 128 accumulators over v2's 256 consumer threads, 192 x 128 over v3's 384: 64 each
    assert (v2["st.global.b16"], v2["st.shared.b16"]) == (64, 0)
    assert (v3["st.global.b16"], v3["st.shared.b16"]) == (0, 64)
    # full barriers on both sides, so racecheck sees the hand-over: the consumers' "free" and
    # "full", the storers' first "free", their "full" and "free" between tiles: 5 on top of the
    # 4 the kernel had with the consumers' own C stores (wip-v3-direct-epilogue)
    assert v3["bar.arrive"] == 0 and v3["bar.sync"] == 4 + 5
    # the storers' 16-byte C stores (and the staging phase's); v2 writes C in 2-byte stores
    assert v3["st.global.v4"] > v2["st.global.v4"]
