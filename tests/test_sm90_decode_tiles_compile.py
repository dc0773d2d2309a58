"""tile_m 16 and 32 (issue 27, decode): the device-offsets kernel builds past the compile's
guards (no stack frame, no serialized wgmma) with a wgmma N equal to the tile, in both layouts
(offsets and masked), and its shared memory shrinks with the A ring and C tile."""

from __future__ import annotations

from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

SCRIPT = """
import re
out = {}
for tile_m in (16, 32):
    for masked in (False, True):
        k = compile_kernel(Config(tile_m=tile_m, out_dtype="bfloat16", device_offsets=True,
                                  masked=masked),
                           arch="sm_90a", groups=[(7168, 2048)] * 4)
        out[f"{tile_m}.{masked}"] = {
            "wgmma_n": sorted(set(re.findall(r"wgmma\\.mma_async\\.sync\\.aligned"
                                             r"\\.m64n(\\d+)k16", k.ptx))),
            "operands": [p["operand"] for p in k.params if p["kind"] == "operand"],
            "smem": k.dynamic_smem, "tile": k.tile}
print(json.dumps(out))
"""


def test_decode_tiles_build_with_their_own_wgmma_n_in_both_layouts() -> None:
    out = compile_sm90(SCRIPT)
    for tile_m, smem in (("16", 77824), ("32", 98304)):
        for masked in ("False", "True"):
            got = out[f"{tile_m}.{masked}"]
            assert got["wgmma_n"] == [tile_m]
            assert got["tile"] == {"m": int(tile_m), "n": 128, "k": 256}
            assert got["smem"] == smem
            index = "masked_m" if masked == "True" else "offs"
            assert got["operands"] == [index, "a", "b", "sfa", "sfb", "c"]
