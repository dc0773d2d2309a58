"""tile_m 256 (bench_large's kernel) keeps a 128-register accumulator per consumer thread: it
must build past the compile's guards (no stack frame, no serialized wgmma), with the two
consumer warpgroups raised to 224 registers and the producer warpgroup lowered to 56."""

from __future__ import annotations

from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

SCRIPT = """
import re
out = {}
for name, tile_m in (("128", 128), ("256", 256)):
    k = compile_kernel(Config(tile_m=tile_m, tile_n=128, a_slots=3, async_epilogue=True),
                       arch="sm_90a", groups=[(1024, 4096, 7168)])
    out[name] = {"setmaxnreg": sorted(set(re.findall(r"setmaxnreg\\.(inc|dec)\\.sync\\.aligned"
                                                     r"\\.u32\\s+(\\d+)", k.ptx))),
                 "wgmma_n": sorted(set(re.findall(r"wgmma\\.mma_async\\.sync\\.aligned"
                                                  r"\\.m64n(\\d+)k16", k.ptx))),
                 "block": list(k.block), "smem": k.dynamic_smem}
print(json.dumps(out))
"""


def test_tile_m_256_raises_the_consumers_registers() -> None:
    out = compile_sm90(SCRIPT)
    # tile_m 128 at tile_n 128 keeps the launch's even split (168 registers each)
    assert out["128"]["setmaxnreg"] == [] and out["128"]["wgmma_n"] == ["128"]
    assert out["256"]["setmaxnreg"] == [["dec", "56"], ["inc", "224"]]
    assert out["256"]["wgmma_n"] == ["256"]
    assert out["256"]["block"] == [384, 1, 1] and out["256"]["smem"] == 224256
