"""CPU tests of runtime/serving.py (issue 26): the device tables computed from offs (torch ops,
run here on CPU tensors: the same arithmetic the GPU runs), the clamping of bad offs, the
kernel choice from host-known values, and every argument error. scripts/serving_check.py runs
the values on the GPU."""

from __future__ import annotations

import struct

import pytest
import torch
from test_dynamic_m import dev  # noqa: F401 - the fake-driver device fixture, used by name
from test_runtime_cpu import entry

from runtime.errors import InputError, NoKernelError
from runtime.formats import scale_cols
from runtime.serving import (
    ServingCall,
    check_serving,
    device_tables,
    select_serving,
    serving_plan,
    sfa_rows_needed,
)

E, N, K = 4, 256, 512
DYN = {"dynamic_m": {"groups": [[N, K]] * E, "max_m": None}}


def call_for(offs: list[int], t: int = 64, out_dtype=torch.bfloat16):
    a = torch.zeros(t, K // 2, dtype=torch.uint8)
    b = torch.zeros(E, N, K // 2, dtype=torch.uint8)
    sfa = torch.zeros(sfa_rows_needed(t, E) * scale_cols(K), dtype=torch.uint8)
    sfb = torch.zeros(E, 256 * scale_cols(K), dtype=torch.uint8)
    out = torch.empty(t, N, dtype=out_dtype)
    c = ServingCall(a=a, b=b, sfa=sfa, sfb=sfb, offs=torch.tensor(offs, dtype=torch.int32),
                    out=out, t=t, n=N, k=K, experts=E, dtype="bfloat16", ordinal=0,
                    alpha_ptr=0)
    return c, out


def unpack(e, call, out):
    pointers, tables, offset = device_tables(e, call, out)
    cols = ["a", "b", "sfa", "sfb", "c"]  # test_runtime_cpu's TABLES record this order
    ptr = [dict(zip(cols, row)) for row in pointers.tolist()]
    sizes = tables[: 4 * E].reshape(E, 4).tolist()
    prefix = tables[offset // 4: offset // 4 + E + 1].tolist()
    return ptr, sizes, prefix


def test_tables_follow_offs_in_torch_layout() -> None:
    e, _ = entry(constraints=DYN)
    call, out = call_for([10, 10, 150, 160], t=200)  # expert 1 empty, 40 padding rows
    ptr, sizes, prefix = unpack(e, call, out)
    m = [10, 0, 140, 10]
    assert [s[0] for s in sizes] == m and all(s[1:] == [N, K, 1] for s in sizes)
    starts = [0, 10, 10, 150]
    cols = scale_cols(K)  # 32 bytes per blocked row
    sfa_rows = [0, 128, 128, 384]  # sum of round_up(m_i, 128) before each expert
    for g in range(E):
        assert ptr[g]["a"] - call.a.data_ptr() == starts[g] * K // 2
        assert ptr[g]["b"] - call.b.data_ptr() == g * N * K // 2
        assert ptr[g]["sfa"] - call.sfa.data_ptr() == sfa_rows[g] * cols
        assert ptr[g]["sfb"] - call.sfb.data_ptr() == g * 256 * cols
        assert ptr[g]["c"] - out.data_ptr() == starts[g] * N * 2
    # tile 128 x 128: ceil(m / 128) * ceil(256 / 128) tiles per expert
    assert prefix == [0, 2, 2, 6, 8]


def test_bad_offs_are_clamped_inside_the_buffers() -> None:
    e, _ = entry(constraints=DYN)
    t = 64
    call, out = call_for([50, 20, 999, -5], t=t)  # decreasing, past T, negative
    ptr, sizes, prefix = unpack(e, call, out)
    m = [s[0] for s in sizes]
    assert m == [50, 0, 14, 0]  # running max of clamp(offs, 0, T): 50, 50, 64, 64
    for g in range(E):
        rows_before = (ptr[g]["a"] - call.a.data_ptr()) // (K // 2)
        assert 0 <= rows_before and rows_before + m[g] <= t
        c_rows = (ptr[g]["c"] - out.data_ptr()) // (N * 2)
        assert c_rows + m[g] <= t
        sfa_row = (ptr[g]["sfa"] - call.sfa.data_ptr()) // scale_cols(K)
        assert sfa_row + -(-m[g] // 128) * 128 <= sfa_rows_needed(t, E)


def test_plan_grid_is_every_sm_and_workspace_holds_t_rows() -> None:
    e, _ = entry(constraints=DYN)
    plan = serving_plan(e, E, N, K, 300, sm_count=132)
    assert plan.grid == 132 and plan.num_groups == E
    assert plan.workspace_bytes == 132 * 512  # test entry: 512 bytes per CTA, no A copy
    assert plan.plan_tables == struct.pack("<4f", 1, 1, 1, 1)  # alpha = None


def test_kernel_choice_uses_host_values_only() -> None:
    bf, _ = entry("ep.sm_90a.acc1.bf16", constraints=DYN, out_dtype="bfloat16")
    f16, _ = entry("ep.sm_90a.acc1.f16", constraints=DYN)
    capped, _ = entry("cap.sm_90a.acc1.bf16", set_="cap", out_dtype="bfloat16",
                      constraints={"dynamic_m": {"groups": [[N, K]] * E, "max_m": 64}})
    kernels = (capped, bf, f16)
    assert select_serving(kernels, "sm_90a", E, N, K, 64, "bfloat16") is capped
    assert select_serving(kernels, "sm_90a", E, N, K, 65, "bfloat16") is bf  # max_m < T
    assert select_serving(kernels, "sm_90a", E, N, K, 65, "float16") is f16
    with pytest.raises(NoKernelError) as info:
        select_serving(kernels, "sm_90a", E + 1, N, K, 8, "bfloat16")
    assert str(info.value).startswith(
        f"no built kernel serves scaled_grouped_mm with E = {E + 1} experts of (N, K) = "
        f"({N}, {K}), T = 8 rows and bfloat16 output on sm_90a; nothing was launched.")


def _args(t: int = 64):
    a = torch.zeros(t, K // 2, dtype=torch.uint8)
    b = torch.zeros(E, N, K // 2, dtype=torch.uint8)
    sfa = torch.zeros(sfa_rows_needed(t, E) * scale_cols(K), dtype=torch.uint8)
    sfb = torch.zeros(E, 256 * scale_cols(K), dtype=torch.uint8)
    offs = torch.zeros(E, dtype=torch.int32)
    return [a, b, sfa, sfb, offs]


@pytest.mark.parametrize("edit,message", [
    (lambda x: x.__setitem__(0, x[0][:, :8]),
     "a must be contiguous, but got strides (256, 1) for shape (64, 8)"),
    (lambda x: x.__setitem__(1, x[1][0]),
     "b must be 3-D (E, N, K/2) packed fp4, but got shape (256, 256)"),
    (lambda x: x.__setitem__(1, torch.zeros(E, N, 128, dtype=torch.uint8)),
     "b.shape[2] must equal a.shape[1] = 256 (K/2 bytes), but got 128"),
    (lambda x: x.__setitem__(4, torch.zeros(E + 1, dtype=torch.int32)),
     f"offs must have shape ({E},) (one end offset per expert of b), but got ({E + 1},)"),
    (lambda x: x.__setitem__(4, torch.zeros(E, dtype=torch.int64)),
     "offs must have dtype torch.int32, but got torch.int64"),
    (lambda x: x.__setitem__(2, x[2][:-1]),
     f"sfa must have at least {sfa_rows_needed(64, E) * 32} elements (room for any routing: "
     f"round_up(T, 128) + 128 * E = {sfa_rows_needed(64, E)} blocked rows x 32 scale columns, "
     f"T = 64, E = {E}), but got {sfa_rows_needed(64, E) * 32 - 1}"),
    (lambda x: x.__setitem__(3, x[3][:, 1:].contiguous()),
     f"sfb must have {E * 256 * 32} elements ((E, round_up(N, 128) * round_up(K/16, 4)) = "
     f"({E}, {256 * 32})), but got {E * (256 * 32 - 1)} (shape ({E}, {256 * 32 - 1}))"),
    (lambda x: None, "a must be a CUDA tensor, but got a tensor on cpu"),
])
def test_argument_errors(edit, message) -> None:
    args = _args()
    edit(args)
    with pytest.raises(InputError) as info:
        check_serving(*args, None, None, torch.bfloat16)
    assert str(info.value) == message


def test_out_and_out_dtype_errors() -> None:
    with pytest.raises(InputError, match=r"^out must have shape \(T, N\) = \(64, 256\), but got "
                                         r"\(64, 128\)$"):
        check_serving(*_args(), None, torch.empty(64, 128, dtype=torch.bfloat16), None)
    with pytest.raises(InputError, match=r"^out_dtype must be torch.float16 or torch.bfloat16"):
        check_serving(*_args(), None, None, torch.float32)


# ------------------------------------------------------------------ the launch (fake driver)


def test_launch_device_tables_eager_and_captured(dev, monkeypatch) -> None:  # noqa: F811
    """DeviceRuntime.launch_device_tables with test_dynamic_m's fake driver: the kernel gets the
    caller's device tables, the stream's workspace (eager) or a fresh one with a persistent
    zeroed barrier (captured), and alpha's address or the plan's ones."""
    from test_alpha_out_dtype import alpha_params
    from test_dynamic_m import TEMPLATES, FakeArena

    e, _ = entry(constraints=DYN, params=alpha_params())
    loaded = type("Loaded", (), {"function": dev.drv.real.CUfunction(0x5000)})()
    dp = dev.mod.DevicePlan(serving_plan(e, E, N, K, 64, 132),
                            dev.mod.PreparedKernel(loaded=loaded, templates=dict(TEMPLATES)))
    dp.ones = 0xABC000
    call, out = call_for([10, 10, 40, 60])
    pointers, tables, offset = device_tables(e, call, out)

    def launched() -> tuple[int, ...]:
        # (pointers, workspace, problem sizes, CTA prefix, alpha) at their recorded offsets
        raw = dp.slot().params.raw()
        return tuple(struct.unpack_from("<Q", raw, p.offset)[0] for p in e.params
                     if p.kind == "table")

    dev.rt.launch_device_tables(dp, pointers, tables, offset, 0)
    ws = dev.rt._workspaces[(7, 0)][2]
    assert launched() == (pointers.data_ptr(), ws, tables.data_ptr(),
                          tables.data_ptr() + offset, 0xABC000)
    assert dev.drv.launches[-1][0] == 7
    dev.rt.launch_device_tables(dp, pointers, tables, offset, 0x1234)
    assert launched()[-1] == 0x1234
    dev.rt._arena = FakeArena()
    dev.drv.capturing = True
    dev.rt.launch_device_tables(dp, pointers, tables, offset, 0)
    captured = launched()
    assert captured[0] == pointers.data_ptr() and captured[2:] == (
        tables.data_ptr(), tables.data_ptr() + offset, 0xABC000)
    assert captured[1] not in (0, ws)  # the graph pool's workspace, not the stream's
    assert len(dev.drv.launches) == 3
