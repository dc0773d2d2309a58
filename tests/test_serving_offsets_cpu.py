"""CPU tests of the device-offsets kernels' host side (issue 26): the spec gives `experts:` sets
device_offsets kernels and refuses the option elsewhere, the manifest ABI kind `operand`, the
list API never selects such a kernel while scaled_grouped_mm prefers it, the workspace and grid
arithmetic, and the launch (fake driver) writing exactly the nine per-call addresses. The
kernel's own table derivation runs on the GPU only: scripts/serving_check.py."""

from __future__ import annotations

import struct

import pytest
from test_alpha_out_dtype import alpha_params
from test_dynamic_m import dev  # noqa: F401 - the fake-driver device fixture, used by name
from test_runtime_cpu import _params, _tma, entry

from builder.errors import SpecError
from builder.families import load_families
from builder.spec import parse_spec_text
from runtime.dispatch import KernelIndex, served
from runtime.errors import ManifestError, NoKernelError
from runtime.formats import offsets_tables_bytes
from runtime.manifest import _parse_param, _Reader
from runtime.serving import offsets_launch_facts, select_serving

E, N, K = 4, 256, 512
DYN = {"dynamic_m": {"groups": [[N, K]] * E, "max_m": None}}


def offsets_params():
    """The ABI kernels/sm90/offsets.py records (the order and kinds of a real build)."""
    return _params(
        [_tma(op) for op in ("b", "a", "sfb", "sfa")]
        + [(op, "operand", 8, 8, {"operand": op}) for op in ("offs", "a", "b", "sfa", "sfb", "c")]
        + [("tensormap_workspace", "table", 8, 8, {"table": "tensormap_workspace"}),
           ("grid_barrier", "table", 8, 8, {"table": "grid_barrier"}),
           ("alpha", "table", 8, 8, {"table": "alpha"})]
        + [(v, "scalar", 4, 4, {"value": v}) for v in ("num_groups", "rows", "n", "k")])


def offsets_entry(name: str = "ep.sm_90a.acc1.bf16", **over):
    e, _ = entry(name, set_=name.split(".")[0], constraints=DYN, params=offsets_params(),
                 out_dtype="bfloat16", **over)
    return e


# ------------------------------------------------------------------ spec


def test_expert_sets_build_device_offsets_kernels_and_only_they_may() -> None:
    fams = load_families()
    head = "schema_version: 1\ndefaults: {archs: [sm_90a, sm_100a]}\nsets:\n"
    spec = parse_spec_text(head + "  - {name: layer, experts: 8, n: 512, k: 1024}\n"
                           "  - {name: lists, m: dynamic, groups: [[512, 1024]]}\n",
                           "shapes.yaml", fams)
    layer, lists = spec.sets
    opts = {b.arch: dict(b.options) for b in layer.builds}
    assert opts == {"sm_90a": {"device_offsets": True}, "sm_100a": {"device_offsets": True}}
    assert all(dict(b.options) == {} for b in lists.builds)
    off = parse_spec_text(head + "  - {name: layer, experts: 8, n: 512, k: 1024, options: "
                          "{sm_90a: {device_offsets: false}}}\n", "shapes.yaml", fams)
    assert dict(off.sets[0].builds[0].options) == {"device_offsets": False}  # the set's word
    with pytest.raises(SpecError) as info:
        parse_spec_text(head + "  - {name: lists, m: dynamic, groups: [[512, 1024]], options: "
                        "{sm_90a: {device_offsets: true}}}\n", "shapes.yaml", fams)
    assert "sets[lists].options.sm_90a: device_offsets is only for expert sets (experts, n, k" \
        in str(info.value)
    # Inherited from defaults while the set gives options of its own for the same arch: the
    # merged options still hold it (they were merged per set, not per arch, and passed).
    inherited = ("schema_version: 1\ndefaults: {archs: [sm_90a], options: {sm_90a: "
                 "{device_offsets: true}}}\nsets:\n  - {name: lists, groups: [[128, 256, 512]], "
                 "options: {sm_90a: {tile_m: 64}}}\n")
    with pytest.raises(SpecError) as info:
        parse_spec_text(inherited, "shapes.yaml", fams)
    assert str(info.value).startswith(
        "shapes.yaml: sets[lists].options.sm_90a (with device_offsets from "
        "defaults.options.sm_90a): device_offsets is only for expert sets")


def test_device_offsets_needs_the_barrier_kernel() -> None:
    from kernels.sm90.config import Config, check

    assert check(Config(device_offsets=True)) == []
    (reason,) = check(Config(device_offsets=True, stream_a=True))
    assert reason == ("device_offsets needs stream_a: false (the device-offsets prologue is "
                      "built on the kernel with the grid barrier), but got stream_a True")
    assert check(Config(device_offsets=1)) == ["device_offsets must be true or false, but "
                                                "got 1"]


def test_blocked_tiles_needs_device_offsets() -> None:
    from kernels.sm90.config import Config, check

    assert check(Config(device_offsets=True, blocked_tiles=True)) == []
    assert check(Config(blocked_tiles=True)) == [
        "blocked_tiles needs device_offsets: true (the list kernels keep the strided tile "
        "order their bit-identical cubins were measured with)"]
    assert check(Config(device_offsets=True, blocked_tiles="yes")) == [
        "blocked_tiles must be true or false, but got 'yes'"]


# ------------------------------------------------------------------ manifest and dispatch


def test_operand_params_parse_and_name_the_call_tensor() -> None:
    rec = {"name": "offs", "kind": "operand", "offset": 512, "size": 8, "align": 8,
           "operand": "offs"}
    p = _parse_param(_Reader(rec, "k.params[4]"))
    assert (p.kind, p.operand, p.offset) == ("operand", "offs", 512)
    with pytest.raises(ManifestError) as info:
        _parse_param(_Reader({**rec, "operand": "bias"}, "k.params[4]"))
    assert ("k.params[4].operand must be one of ['a', 'b', 'sfa', 'sfb', 'c', 'offs', "
            "'masked_m']") in str(info.value)
    with pytest.raises(ManifestError) as info:
        _parse_param(_Reader({**rec, "size": 4, "align": 4}, "k.params[4]"))
    assert "an operand parameter must have size 8 and align 8" in str(info.value)


def test_list_api_never_selects_a_device_offsets_kernel() -> None:
    off = offsets_entry()
    lists, _ = entry("ep.sm_90a.acc1.f16", set_="ep", constraints=DYN)
    assert off.takes_offsets and not lists.takes_offsets
    index = KernelIndex((off, lists))
    shapes = tuple((7, N, K) for _ in range(E))
    assert index.select(shapes, "sm_90a", out_dtype="float16") is lists
    with pytest.raises(NoKernelError) as info:
        index.select(shapes, "sm_90a", out_dtype="bfloat16")
    assert (f"  - set 'ep' sm_90a bfloat16 (ep.sm_90a.acc1.bf16): scaled_grouped_mm only: {E} "
            f"experts of (n, k) = ({N}, {K}), offsets on the device") in str(info.value)
    assert served(off).startswith("scaled_grouped_mm only")


def test_serving_prefers_the_device_offsets_kernel() -> None:
    tables, _ = entry("lists.sm_90a.acc1.bf16", set_="lists", constraints=DYN,
                      out_dtype="bfloat16")
    off = offsets_entry()
    assert select_serving((tables, off), "sm_90a", E, N, K, 64, "bfloat16") is off
    assert select_serving((tables,), "sm_90a", E, N, K, 64, "bfloat16") is tables


def test_serving_takes_the_smallest_tier_covering_t() -> None:
    """The decode / mid / prefill tiers of shapes.yaml: bounds 64 and 256 rows, then none;
    the choice depends on T alone, whatever the order the manifest lists them in."""
    def tier(name: str, bound: int | None):
        e, _ = entry(f"{name}.sm_90a.acc1.bf16", set_=name, params=offsets_params(),
                     out_dtype="bfloat16",
                     constraints={"dynamic_m": {"groups": [[N, K]] * E, "max_m": bound}})
        return e

    prefill, mid, decode = tier("layer", None), tier("layer_mid", 256), tier("layer_decode", 64)
    for kernels in ((prefill, mid, decode), (decode, prefill, mid)):
        got = [select_serving(kernels, "sm_90a", E, N, K, t, "bfloat16").set
               for t in (1, 64, 65, 256, 257, 10**6)]
        assert got == ["layer_decode", "layer_decode", "layer_mid", "layer_mid", "layer",
                       "layer"]


# ------------------------------------------------------------------ launch facts and launch


def test_tables_slot_and_workspace_arithmetic() -> None:
    assert [offsets_tables_bytes(g) for g in (1, 2, 32, 256)] == [128, 256, 2176, 16512]
    # 64 bytes per group (5 pointers, 4 sizes, 1 prefix cell, 1 row end) and the total cell,
    # 128-aligned
    assert offsets_tables_bytes(256) == -(-(64 * 256 + 4) // 128) * 128
    e = offsets_entry(tables={"problem_sizes": {"dtype": "int32", "columns": list("mnkl")},
                              "pointers": {"dtype": "int64",
                                           "columns": ["a", "b", "sfa", "sfb", "c"]},
                              "cta_prefix": {"dtype": "int32"},
                              "tensormap_workspace": {"bytes_per_cta": 2560, "align": 128,
                                                      "header_bytes": 128,
                                                      "bytes_per_a_element": 2}})
    grid, ws = offsets_launch_facts(e, 256, 7168, 512, sm_count=132)
    assert grid == 132
    assert ws == 128 + 132 * (2560 + 16512) + 512 * 7168 * 2


def test_launch_offsets_writes_the_call_addresses_eager_and_captured(dev) -> None:  # noqa: F811
    from test_dynamic_m import TEMPLATES, FakeArena

    e = offsets_entry()
    templates = {f"tma_{op}": TEMPLATES[f"tma_{op}"] for op in ("a", "b", "sfa", "sfb")}
    loaded = type("Loaded", (), {"function": dev.drv.real.CUfunction(0x5000)})()
    prepared = dev.mod.PreparedKernel(loaded=loaded, templates=templates)
    op = dev.mod.OffsetsPlan(e, prepared, 132, 4096,
                             {"num_groups": E, "rows": 64, "n": N, "k": K}, ones=0xABC000)
    by_role = {p.operand if p.kind == "operand" else (p.table or p.value): p for p in e.params}

    def launched() -> dict[str, int]:
        raw = op._slot()[0].raw()
        out = {}
        for role, p in by_role.items():
            if p.kind in ("operand", "table"):
                out[role] = struct.unpack_from("<Q", raw, p.offset)[0]
            elif p.kind == "scalar":
                out[role] = struct.unpack_from("<I", raw, p.offset)[0]
        return out

    call = (0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000)
    dev.rt.launch_offsets(op, call, 0)
    ws = dev.rt._workspaces[(7, 0)][2]
    assert launched() == {"offs": 0x1000, "a": 0x2000, "b": 0x3000, "sfa": 0x4000,
                          "sfb": 0x5000, "c": 0x6000, "tensormap_workspace": ws,
                          "grid_barrier": ws, "alpha": 0xABC000, "num_groups": E, "rows": 64,
                          "n": N, "k": K}
    assert dev.drv.launches[-1][0] == 7
    dev.rt.launch_offsets(op, call, 0x1234)
    assert launched()["alpha"] == 0x1234
    dev.rt._arena = FakeArena()
    dev.drv.capturing = True
    dev.rt.launch_offsets(op, call, 0)
    got = launched()
    assert got["tensormap_workspace"] not in (0, ws)  # the graph pool's, not the stream's
    assert got["alpha"] == 0xABC000 and got["offs"] == 0x1000
    assert len(dev.drv.launches) == 3


def test_alpha_params_fixture_is_not_an_offsets_kernel() -> None:
    e, _ = entry(constraints=DYN, params=alpha_params())
    assert not e.takes_offsets and e.takes_alpha


# ------------------------------------------------------------------ host fast path


def test_fast_path_launches_only_for_a_matching_validated_signature() -> None:
    import torch

    from runtime import serving
    from runtime.api import tensor_guard_type

    guard_type = tensor_guard_type()
    if guard_type is None:
        pytest.skip("this torch has no usable TensorGuards: no fast path")

    class Rt:
        def __init__(self) -> None:
            self.launches: list = []

        def launch_offsets(self, op, operands, alpha) -> None:
            self.launches.append((op, operands, alpha))

    def tensors(t: int = 64):
        return (torch.zeros(t, K // 2, dtype=torch.uint8),
                torch.zeros(E, N, K // 2, dtype=torch.uint8),
                torch.zeros(4096, dtype=torch.uint8), torch.zeros(E, 8192, dtype=torch.uint8),
                torch.zeros(E, dtype=torch.int32))

    gg = type("GG", (), {})()
    gg._serving_signatures = {}
    a, b, sfa, sfb, offs = tensors()
    out = torch.empty(64, N, dtype=torch.bfloat16)
    rt = Rt()
    sig = serving._Signature(
        guard=guard_type(a, b, sfa, sfb, offs, out, dynamic_dims_sizes=None,
                         dynamic_dims_strides=None),
        op="plan", out_dtype=torch.bfloat16, out_shape=(64, N),
        out_torch_dtype=torch.bfloat16, rt=rt,
        in_bytes=tuple(x.numel() * x.element_size() for x in (a, b, sfa, sfb, offs)) + (0,),
        out_bytes=out.numel() * 2)
    assert serving._fast(gg, a, b, sfa, sfb, offs, None, out, torch.bfloat16) is None  # none kept
    gg._serving_signatures[(id(b), True, False)] = (sig,)
    got = serving._fast(gg, a, b, sfa, sfb, offs, None, out, torch.bfloat16)
    aligned = all(x.data_ptr() % 16 == 0 for x in (a, b, sfa, sfb, out))
    if aligned:
        assert got is out
        assert rt.launches == [("plan", (offs.data_ptr(), a.data_ptr(), b.data_ptr(),
                                          sfa.data_ptr(), sfb.data_ptr(), out.data_ptr()), 0)]
    # Anything the guard or the fast checks do not vouch for takes the full path.
    n = len(rt.launches)
    a2 = tensors(t=65)[0]
    assert serving._fast(gg, a2, b, sfa, sfb, offs, None, out, torch.bfloat16) is None
    assert serving._fast(gg, a, b, sfa, sfb, offs, None, out, torch.float16) is None
    assert serving._fast(gg, a, b, sfa, sfb, offs.to(torch.int64), None, out,
                         torch.bfloat16) is None
    assert serving._fast(gg, a[:, :-8].contiguous().view(64, -1), b, sfa, sfb, offs, None,
                         out, torch.bfloat16) is None
    bad = torch.zeros(64 * (K // 2) + 1, dtype=torch.uint8)[1:].view(64, K // 2)  # misaligned
    assert serving._fast(gg, bad, b, sfa, sfb, offs, None, out, torch.bfloat16) is None
    # An out sharing bytes with any input (here the tail of a's storage, or offs) passes the
    # guard (same shapes and strides) but not the span check.
    store = torch.zeros(64 * (K // 2) + out.numel() * 2, dtype=torch.uint8)
    a_in = store[:64 * (K // 2)].view(64, K // 2)
    aliased = store[64 * (K // 2) - 16:][:out.numel() * 2].view(torch.bfloat16).view(64, N)
    assert serving._fast(gg, a_in, b, sfa, sfb, offs, None, aliased, torch.bfloat16) is None
    over_offs = torch.zeros(out.numel(), dtype=torch.bfloat16)
    offs_in = over_offs[:8].view(torch.int32)  # out's first 16 bytes
    assert serving._fast(gg, a, b, sfa, sfb, offs_in, None, over_offs.view(64, N),
                         torch.bfloat16) is None
    assert len(rt.launches) == n


# ------------------------------------------------------------------ the sfa helper


@pytest.mark.parametrize("counts", [[5, 0, 130, 1], [0, 0, 0, 0], [300, 0, 0, 0], [1, 2, 3, 4]])
def test_to_blocked_grouped_matches_per_expert_blocks_at_torch_offsets(counts) -> None:
    import torch

    from runtime.formats import scale_cols
    from runtime.nvfp4 import to_blocked, to_blocked_grouped
    from runtime.serving import sfa_rows_needed

    t, k = 320, 512
    gen = torch.Generator().manual_seed(sum(counts))
    plain = torch.randint(1, 255, (t, k // 16), dtype=torch.uint8, generator=gen)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    got = to_blocked_grouped(plain.view(torch.float8_e4m3fn), offs)
    assert got.dtype == torch.float8_e4m3fn
    got = got.view(torch.uint8)
    cols = scale_cols(k)
    want = torch.zeros(sfa_rows_needed(t, len(counts)) * cols, dtype=torch.uint8)
    row = srow = 0
    for m in counts:  # expert g's scales start at row sum_{i<g} round_up(m_i, 128)
        if m:
            blk = to_blocked(plain[row:row + m])
            want[srow * cols:srow * cols + blk.numel()] = blk
        row += m
        srow += -(-m // 128) * 128
    assert torch.equal(got, want)


def test_to_blocked_grouped_clamps_bad_offsets() -> None:
    import torch

    from runtime.nvfp4 import to_blocked_grouped

    plain = torch.ones(64, 32, dtype=torch.uint8)
    bad = to_blocked_grouped(plain, torch.tensor([40, 10, 500, -3], dtype=torch.int32))
    fixed = to_blocked_grouped(plain, torch.tensor([40, 40, 64, 64], dtype=torch.int32))
    assert torch.equal(bad, fixed)


@pytest.mark.parametrize("offs,message", [
    ([10, 64], "offs must be an int32 or int64 torch.Tensor, but got list"),
    ("float", "offs must be an int32 or int64 torch.Tensor, but got torch.float32"),
    ("meta", "offs must be on scales' device cpu, but got meta"),
])
def test_to_blocked_grouped_names_a_bad_offs(offs, message) -> None:
    import torch

    from runtime.errors import InputError
    from runtime.nvfp4 import to_blocked_grouped

    if offs == "float":
        offs = torch.tensor([10.7, 64.2])  # was truncated silently
    elif offs == "meta":
        offs = torch.tensor([10, 64], device="meta")
    with pytest.raises(InputError) as info:
        to_blocked_grouped(torch.ones(64, 32, dtype=torch.uint8), offs)
    assert str(info.value) == message


def test_long_lived_buffers_are_allocated_off_the_calling_thread(dev, monkeypatch) -> None:  # noqa: F811
    """torch.compile's reduce-overhead warm-up routes every allocation of the calling thread to
    its graph pool (torch/_inductor/cudagraph_trees.py): a stream's workspace, kept across
    calls, must come from another thread. Its zeroed header is written by the caller."""
    import threading

    import torch

    real_empty = torch.empty
    threads = []

    def empty(*args, **kw):
        threads.append(threading.get_ident())
        return real_empty(*args, **kw).fill_(7)  # garbage, as fresh device memory may hold

    monkeypatch.setattr(torch, "empty", empty)
    ws = dev.rt._workspace(7, 5000, 128)
    assert threads and all(t != threading.get_ident() for t in threads)
    assert ws[1] >= 5000 and bool((ws[0][:128] == 0).all()) and int(ws[0][128]) == 7
    assert dev.rt._workspace(7, 100, 128) is ws  # kept: no second allocation
    assert len(threads) == 1


def test_k_multiple_is_64_and_256_with_stream_a() -> None:
    from kernels.sm90.config import Config, check_groups, k_multiple

    assert k_multiple(Config()) == 64
    assert check_groups(Config(), [2880, 64]) == []
    assert check_groups(Config(), [2880, 2900]) == [
        "k must be a multiple of 64 with these options (one 64-K fp16 A slot and one scale "
        "atom), but the groups have k [2900]"]
    assert k_multiple(Config(stream_a=True)) == 256
    assert check_groups(Config(stream_a=True), [2880]) == [
        "k must be a multiple of 256 with these options (stream_a stages A in whole K_TILE "
        "stages), but the groups have k [2880]"]


def test_check_out_overlap_names_the_first_input_out_shares_a_byte_with() -> None:
    import torch

    from runtime.errors import InputError
    from runtime.validate import check_out_overlap

    store = torch.zeros(1024, dtype=torch.uint8)
    out = store[256:512]
    inputs = {"a": store[:256], "offs": store[512:528], "alpha": None}
    check_out_overlap(out, tuple(inputs.items()))  # adjacent spans share no byte
    check_out_overlap(None, tuple(inputs.items()))
    check_out_overlap(store[0:0], (("a", store),))  # an empty out writes nothing
    for name, x in (("a", store[:257]), ("offs", store[511:527]), ("alpha", store[300:304])):
        with pytest.raises(InputError) as info:
            check_out_overlap(out, tuple({**inputs, name: x}.items()))
        assert str(info.value) == ("out must not overlap any other argument, but it overlaps "
                                   f"{name}")
