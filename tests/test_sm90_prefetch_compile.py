"""Config.w_prefetch (1-2% slower on the H200, kept as an option) must keep building: the compile's own guards
(no stack frame, asynchronous wgmma) pass, and the option moves the weight loads of the next
64-K step ahead of the current step's wgmma, which the PTX shows."""

from __future__ import annotations

from conftest import NEEDS_DSL, compile_sm90

pytestmark = NEEDS_DSL

SCRIPT = """
out = {}
for name, opts in (("off", {"tile_n": 192, "a_slots": 5}),
                   ("on", {"tile_n": 192, "a_slots": 5, "w_prefetch": True})):
    ptx = compile_kernel(Config(**opts), arch="sm_90a", groups=[(128, 4096, 7168)]).ptx
    # In each 64-K step (text up to its wgmma fence), do shared loads follow the step's scale
    # conversion? Only when they belong to the next step.
    late = 0
    for step in ptx.split("wgmma.commit_group")[:-1]:
        if "wgmma.fence" not in step:
            continue
        head = step[: step.rindex("wgmma.fence")]
        if "cvt.rn.f16x2.e4m3x2" in head and "ld.shared" in head:
            late += head.rindex("ld.shared") > head.rindex("cvt.rn.f16x2.e4m3x2")
    out[name] = late
print(json.dumps(out))
"""


def test_prefetch_builds_and_loads_the_next_step_before_waiting() -> None:
    counts = compile_sm90(SCRIPT)
    assert counts["off"] == 0
    assert counts["on"] > 0
