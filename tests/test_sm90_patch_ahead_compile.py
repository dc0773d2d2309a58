"""The v3 producer patches the next tile's group descriptors one tile early (Config.patch_ahead,
always on with a_fp16): the build must pass the compile's guards, prefetch the three patched
descriptors, and record the larger tensor-map workspace (one more set of 4 maps per CTA than
its ring needs) that the runtime reads."""

from __future__ import annotations

from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

SCRIPT = """
out = {}
for name, config in (("v2", Config(a_fp16=False, async_epilogue=False, patch_ahead=False)),
                     ("v3", Config(tile_n=192, a_slots=5))):
    k = compile_kernel(config, arch="sm_90a", groups=[(40, 7168, 2048), (76, 7168, 2048)])
    out[name] = {"prefetch": k.ptx.count("prefetch.tensormap"),
                 "fence_acquire": k.ptx.count("fence.proxy.tensormap::generic.acquire"),
                 "per_cta": k.tables["tensormap_workspace"]["bytes_per_cta"]}
print(json.dumps(out))
"""


def test_patch_ahead_prefetches_and_keeps_one_more_set() -> None:
    out = compile_sm90(SCRIPT)
    v2, v3 = out["v2"], out["v3"]
    assert v2["prefetch"] == 0 and v3["prefetch"] == 3  # B, A and the weight scales
    # v2: 4 sets of 4 maps (its ring of 3 stages + 1); v3: 5 (ring 3 + 2), 128 bytes each
    assert (v2["per_cta"], v3["per_cta"]) == (4 * 4 * 128, 5 * 4 * 128)
    # v3 patches in its prologue and in the look-ahead: one acquire fence per map of each
    assert v3["fence_acquire"] == 2 * 3
