"""Config.patch_ahead (the producer patches the next tile's group descriptors one tile early):
the build must pass the compile's guards, prefetch the three patched descriptors, and record
the larger tensor-map workspace (one more set of 4 maps per CTA) that the runtime reads."""

from __future__ import annotations

from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

SCRIPT = """
out = {}
for name, on in (("off", False), ("on", True)):
    k = compile_kernel(Config(tile_n=192, a_slots=5, async_epilogue=True, patch_ahead=on),
                       arch="sm_90a", groups=[(40, 7168, 2048), (76, 7168, 2048)])
    out[name] = {"prefetch": k.ptx.count("prefetch.tensormap"),
                 "fence_acquire": k.ptx.count("fence.proxy.tensormap::generic.acquire"),
                 "per_cta": k.tables["tensormap_workspace"]["bytes_per_cta"]}
print(json.dumps(out))
"""


def test_patch_ahead_prefetches_and_keeps_one_more_set() -> None:
    out = compile_sm90(SCRIPT)
    off, on = out["off"], out["on"]
    assert off["prefetch"] == 0 and on["prefetch"] == 3  # B, A and the weight scales
    # 4 sets of 4 maps (ring 3 + 1) against 5 (ring 3 + 2), 128 bytes each
    assert (off["per_cta"], on["per_cta"]) == (4 * 4 * 128, 5 * 4 * 128)
    # one patch site either way (prologue + loop), so the acquire fences stay as many
    assert on["fence_acquire"] == off["fence_acquire"] > 0
