"""The producer patches the next tile's group descriptors one tile early (Config.patch_ahead,
always on): the build must pass the compile's guards, prefetch the three patched descriptors,
and record the larger tensor-map workspace (one more set of 4 maps per CTA than its ring needs)
that the runtime reads."""

from __future__ import annotations

from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

SCRIPT = """
k = compile_kernel(Config(tile_n=192, a_slots=5), arch="sm_90a",
                   groups=[(40, 7168, 2048), (76, 7168, 2048)])
print(json.dumps({"prefetch": k.ptx.count("prefetch.tensormap"),
                  "fence_acquire": k.ptx.count("fence.proxy.tensormap::generic.acquire"),
                  "per_cta": k.tables["tensormap_workspace"]["bytes_per_cta"]}))
"""


def test_patch_ahead_prefetches_and_keeps_one_more_set() -> None:
    out = compile_sm90(SCRIPT)
    assert out["prefetch"] == 3  # B, A and the weight scales
    # 5 sets of 4 maps (a ring of 3 stages + 1, + 1 for the look-ahead), 128 bytes each
    assert out["per_cta"] == 5 * 4 * 128
    # patched in the prologue and in the look-ahead: one acquire fence per map of each
    assert out["fence_acquire"] == 2 * 3
