"""Config.stream_k (off by default: slower on the H200, bench/RESULTS.md) must keep building
past the compile's guards, record its partial slots in the workspace, and carry the cross-CTA
hand-off in its PTX; the default build has none of it."""

from __future__ import annotations

from pathlib import Path

from conftest import NEEDS_DSL, compile_sm90

from kernels.sm90.config import Config, check

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
out = {}
for name, opts in (("off", {"tile_n": 192}), ("on", {"tile_n": 192, "stream_k": True})):
    k = compile_kernel(Config(**opts), arch="sm_90a", groups=[(128, 4096, 7168)])
    out[name] = {"per_cta": k.tables["tensormap_workspace"]["bytes_per_cta"],
                 "cg_loads": k.ptx.count("ld.global.cg.v4.f32"),
                 "f32_stores": k.ptx.count("st.global.v4.f32"),
                 "release": k.ptx.count("red.release.gpu.global.add.u32")}
print(json.dumps(out))
"""


@NEEDS_DSL
def test_stream_k_builds_with_partial_slots_and_a_hand_off() -> None:
    out = compile_sm90(SCRIPT)
    # 4 sets (tma.sets_needed) of 4 tensor maps of 128 bytes; with stream-K also one fp32
    # 192 x 128 partial and its flag
    assert out["off"]["per_cta"] == 2048
    assert out["on"]["per_cta"] == 2048 + 192 * 128 * 4 + 128
    assert out["off"]["cg_loads"] == out["off"]["f32_stores"] == 0
    assert out["on"]["cg_loads"] > 0 and out["on"]["f32_stores"] > 0
    # the grid barrier's release, plus the partial flag's
    assert out["on"]["release"] == out["off"]["release"] + 1


def test_stream_k_needs_the_staged_kernel_and_no_prefetch() -> None:
    assert check(Config(stream_k=True, tile_n=192)) == []
    assert check(Config(stream_k=True, a_fp16=False)) == [
        "stream_k needs a_fp16: true (only the staged-A kernel has it)"]
    assert check(Config(stream_k=True, w_prefetch=True)) == [
        "stream_k and w_prefetch do not combine (the stream-K consumer has no prefetching path)"]
    assert check(Config(stream_k=1)) == ["stream_k must be true or false, but got 1"]


def test_the_ab_spec_parses_and_turns_stream_k_on_everywhere() -> None:
    from builder.families import load_families
    from builder.spec import load_spec

    spec = load_spec(REPO / "bench" / "stream_k_ab.yaml", load_families("kernels.families"))
    names = [s.name for s in spec.sets]
    assert names == ["moe_gateup", "moe_down", "dense_a", "bench_large", "mixed_2", "mixed_4"]
    assert all(b.arch == "sm_90a" and b.options_dict()["stream_k"] is True
               for s in spec.sets for b in s.builds)
