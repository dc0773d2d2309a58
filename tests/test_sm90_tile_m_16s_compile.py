"""tile_m between 64 and 128 in steps of 16 (moe_down runs at 112): the wgmma N is the tile_m,
every slot of the fp16 A ring stays 1024-aligned, and the kernel builds past the compile's
guards (no stack frame, no serialized wgmma) with the producer/consumer split of stream_a."""

from __future__ import annotations

from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

SCRIPT = """
import re
out = {}
for tile_m in (80, 112):
    k = compile_kernel(Config(tile_m=tile_m, tile_n=192, a_slots=5, async_epilogue=True,
                              patch_ahead=True, stream_a=True),
                       arch="sm_90a", groups=[(40, 7168, 2048), (196, 7168, 2048)])
    out[str(tile_m)] = {
        "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\\.(inc|dec)\\.sync\\.aligned"
                                            r"\\.u32\\s+(\\d+)", k.ptx))),
        "wgmma_n": sorted(set(re.findall(r"wgmma\\.mma_async\\.sync\\.aligned"
                                         r"\\.m64n(\\d+)k16", k.ptx))),
        "block": list(k.block), "smem": k.dynamic_smem, "tile": k.tile}
print(json.dumps(out))
"""


def test_tile_m_80_and_112_build_with_their_own_wgmma_n() -> None:
    out = compile_sm90(SCRIPT)
    for tile_m, smem in (("80", 1024 + 86016 + 5 * 10240 + 32768), ("112", 203776)):
        assert out[tile_m]["wgmma_n"] == [tile_m]
        assert out[tile_m]["tile"] == {"m": int(tile_m), "n": 192, "k": 256}
        assert out[tile_m]["block"] == [512, 1, 1] and out[tile_m]["smem"] == smem
        assert out[tile_m]["setmaxnreg"] == [["dec", "64"], ["inc", "144"]]
