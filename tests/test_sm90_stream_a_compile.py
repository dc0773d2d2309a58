"""Config.stream_a (phase 1 overlapped with the tile loop, kernels/sm90/streamed.py) on the MoE
sets' kernel (tile_n 192, a_slots 5, async_epilogue, patch_ahead), against the same build without
it: the recorded workspace header grows to the progress header the runtime must zero (384 bytes,
staging.STREAM_HEADER_BYTES), the grid barrier's acq_rel atomic is gone, each CTA counts its
streaming iterations with one release add per stager warp, the stagers use no named barrier
(each warp counts its own iterations; no barrier hands the epoch over either: every thread reads
it before the CTA barrier), CTA 0 keeps the header (zeroes the other bank, advances the epoch),
and the producer warpgroup keeps 64 registers instead of 56 for the stagers. Both builds are
compiled once, in one subprocess."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

# PTX spellings as the DSL prints them: named barriers as "bar.sync \t<id>, <threads>;", the
# producer's hand-over of the epoch as "bar.arrive <id>, <threads>;".
COUNTED = (
    "atom.acq_rel.gpu.global.add.u32",  # the grid barrier's arrival
    "red.release.gpu.global.add.u32",  # grid barrier: generation; stream_a: a CTA's count
    "st.relaxed.gpu.global.u32",
    "nanosleep.u32",
    "bar.sync \t5, 96;",  # the 96 stagers after each iteration (removed, as barrier 6 below)
    "bar.sync \t6, 128;",  # an epoch hand-over between warps (removed: compute-sanitizer's
    "bar.arrive 6, 128;",  # racecheck and synccheck flagged the kernel while it had one)
    "bar.sync \t3, 480;",  # async_epilogue's hand-over, in both builds
    "bar.warp.sync \t-1;",  # stream_a: a stager warp's barrier before it counts
    "setmaxnreg.dec.sync.aligned.u32 \t56;",  # the producer warpgroup's registers: 56 ...
    "setmaxnreg.dec.sync.aligned.u32 \t64;",  # ... or 64 with stream_a (its stagers need them)
    "setmaxnreg.inc.sync.aligned.u32 \t152;",  # the consumers' 152 ...
    "setmaxnreg.inc.sync.aligned.u32 \t144;",  # ... or 144 with stream_a
)

SCRIPT = f"""
counted = {COUNTED!r}
out = {{}}
for name, on in (("off", False), ("on", True)):
    k = compile_kernel(Config(tile_n=192, a_slots=5, async_epilogue=True, patch_ahead=True,
                              stream_a=on),
                       arch="sm_90a", groups=[(40, 7168, 2048), (76, 7168, 2048)])
    out[name] = {{"counts": {{key: k.ptx.count(key) for key in counted}},
                 "workspace": k.tables["tensormap_workspace"],
                 "barrier_param": [p["name"] for p in k.params
                                   if p["kind"] == "table" and p["table"] == "grid_barrier"],
                 "smem": k.dynamic_smem}}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def builds() -> dict[str, Any]:
    return compile_sm90(SCRIPT)


def test_header_is_the_progress_header(builds: dict[str, Any]) -> None:
    off, on = builds["off"]["workspace"], builds["on"]["workspace"]
    assert (off["header_bytes"], on["header_bytes"]) == (128, 384)
    # The runtime keys workspaces by header size (runtime/device.py), so the grid barrier and
    # the progress header never share one; everything after the header is as before.
    assert {k: v for k, v in on.items() if k != "header_bytes"} == {
        k: v for k, v in off.items() if k != "header_bytes"}
    # a zeroed header comes with a grid_barrier parameter (runtime/plan.py checks it)
    assert builds["off"]["barrier_param"] == builds["on"]["barrier_param"] == ["grid_barrier"]
    assert builds["on"]["smem"] == builds["off"]["smem"] == 220160


def test_no_grid_barrier_but_one_count_per_iteration(builds: dict[str, Any]) -> None:
    off, on = builds["off"]["counts"], builds["on"]["counts"]
    # default: the grid barrier's arrival atomic and its generation's release add
    assert off["atom.acq_rel.gpu.global.add.u32"] == 1
    assert off["red.release.gpu.global.add.u32"] == 1
    # stream_a: no grid barrier; the one release add is a stager warp's count of an iteration
    assert on["atom.acq_rel.gpu.global.add.u32"] == 0
    assert on["red.release.gpu.global.add.u32"] == 1
    # grid barrier: the reset of its count; stream_a: CTA 0 zeroes the other bank, then
    # advances the epoch
    assert (off["st.relaxed.gpu.global.u32"], on["st.relaxed.gpu.global.u32"]) == (1, 2)
    # both poll with a back-off: the barrier's wait, the producer's waits for staged A
    assert off["nanosleep.u32"] >= 1 and on["nanosleep.u32"] >= 1


def test_stagers_use_no_named_barrier(builds: dict[str, Any]) -> None:
    off, on = builds["off"]["counts"], builds["on"]["counts"]
    # each stager warp counts its own iterations after a warp barrier; the epoch is read by
    # every thread before the CTA barrier, not handed over by a named barrier
    for key in ("bar.sync \t5, 96;", "bar.sync \t6, 128;", "bar.arrive 6, 128;"):
        assert on[key] == off[key] == 0, key
    assert on["bar.warp.sync \t-1;"] >= 1
    # the C tile hand-over (barriers 3 and 4) is unchanged
    assert on["bar.sync \t3, 480;"] == off["bar.sync \t3, 480;"] > 0


def test_stream_a_gives_the_stagers_64_registers(builds: dict[str, Any]) -> None:
    off, on = builds["off"]["counts"], builds["on"]["counts"]
    # staged.py STREAM_A_SPLIT: at 56 registers the counting stagers spill (the build's
    # stack-frame guard refuses that), so with stream_a the split is 64 / 144
    dec, inc = "setmaxnreg.dec.sync.aligned.u32 \t", "setmaxnreg.inc.sync.aligned.u32 \t"
    assert (off[dec + "56;"], off[inc + "152;"], off[dec + "64;"], off[inc + "144;"]) == (
        1, 1, 0, 0)
    assert (on[dec + "56;"], on[inc + "152;"], on[dec + "64;"], on[inc + "144;"]) == (0, 0, 1, 1)
