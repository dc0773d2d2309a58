"""Every distinct kernel the default shapes.yaml ships, built once by the real builder and checked
one by one (issue 25: one compile test over the shipped configs, instead of counting PTX strings).

The build itself enforces, per kernel, what a PTX string count only hinted at: the recorded launch
ABI equals the PTX `.entry` list (builder/ptx.py), no sm_90a kernel has a stack frame or
serialized wgmma (kernels/introspect.py), and the manifest entry passes the runtime's own check
(runtime/entry_rules.py). Each parametrized case then reads its kernel's record: present, its cubin
the right arch with its symbol, shared memory within the arch's opt-in limit, the block and grid
its family uses, and the alpha table and output type of issue 24.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NEEDS_DSL, REPO

from builder.elf import cubin_arch
from builder.families import load_families
from builder.plan import expand
from builder.spec import load_spec
from builder.verify import verify_dir
from runtime.manifest import load_manifest

SMEM_LIMIT = {"sm_90a": 227 * 1024, "sm_100a": 227 * 1024}  # opt-in bytes per CTA (H200, B200)


def _distinct() -> list[tuple[str, object]]:
    """(readable id, build item) per distinct kernel key of the default spec (no DSL needed)."""
    fams = load_families("kernels.families")
    seen: dict[str, object] = {}
    for item in expand(load_spec(REPO / "shapes.yaml", fams), fams):
        seen.setdefault(item.key, item)
    out = []
    for key, item in sorted(seen.items(), key=lambda kv: kv[1].name):
        opts = dict(item.options)
        label = (f"{item.arch}.acc{item.acc_stages}.{item.out_dtype}"
                 + (f".{opts['tile_m']}x{opts['tile_n']}"
                    f"{'.stream_a' if opts.get('stream_a') else ''}"
                    f"{'.w_prefetch' if opts.get('w_prefetch') else ''}"
                    if item.arch == "sm_90a" else "") + f".{key[:6]}")
        out.append((label, item))
    return out


DISTINCT = _distinct()


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shipped") / "artifacts"
    proc = subprocess.run([sys.executable, str(REPO / "build_kernels.py"), "build", "--out",
                           str(out), "-j", "2"], cwd=REPO, capture_output=True, text=True,
                          timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert verify_dir(out) == []
    return out


@NEEDS_DSL
def test_one_kernel_per_distinct_config(shipped: Path) -> None:
    m = load_manifest(shipped)
    assert sorted(k.key for k in m.kernels) == sorted(item.key for _, item in DISTINCT)
    assert len(m.sets) > len(m.kernels)  # sets share kernels


@NEEDS_DSL
@pytest.mark.parametrize("item", [i for _, i in DISTINCT], ids=[label for label, _ in DISTINCT])
def test_shipped_kernel(shipped: Path, item) -> None:
    m = load_manifest(shipped)
    (k,) = [k for k in m.kernels if k.key == item.key]
    assert (k.arch, k.acc_stages, k.out_dtype) == (item.arch, item.acc_stages, item.out_dtype)
    cubin = (shipped / k.cubin).read_bytes()
    assert cubin_arch(cubin, k.cubin) == item.arch and k.symbol.encode() in cubin
    assert 0 < k.dynamic_smem <= SMEM_LIMIT[item.arch]
    assert k.takes_alpha  # issue 24: every shipped kernel reads a per-group alpha
    if item.arch == "sm_90a":
        opts = dict(item.options)
        # one producer warpgroup and one consumer warpgroup per 64 weight rows of the tile
        assert k.block == (128 * (1 + opts["tile_n"] // 64), 1, 1)
        assert k.tile.m == opts["tile_m"] and k.tile.n == opts["tile_n"]
        assert k.grid.cooperative  # all CTAs resident: the grid barrier, or stream_a's waits


@NEEDS_DSL
def test_expert_sets_are_served_by_device_offsets_kernels_on_both_archs(shipped: Path) -> None:
    """Issue 26/27: every experts: set entry's kernel takes the call's operands and its index
    tensor (offs, or masked_m for masked sets) in the order runtime/device.py's OffsetsPlan
    packs them, on sm_90a and (built, never run) sm_100a; list sets' kernels take none."""
    import yaml

    expert_sets = {s["name"]: s for s in yaml.safe_load((REPO / "shapes.yaml").read_text())["sets"]
                   if "experts" in s}
    m = load_manifest(shipped)
    archs = set()
    for e in m.sets:
        operands = [p.operand for p in e.params if p.kind == "operand"]
        if e.set not in expert_sets:
            assert operands == [], e.name
            continue
        masked = bool(expert_sets[e.set].get("options", {}).get(e.arch, {}).get("masked"))
        index = "masked_m" if masked else "offs"
        assert operands == [index, "a", "b", "sfa", "sfb", "c"], e.name
        assert e.takes_offsets and e.takes_masked == masked, e.name
        scalars = [p.value for p in e.params if p.kind == "scalar"]
        assert scalars == ["num_groups", "max_m" if masked else "rows", "n", "k"], e.name
        archs.add(e.arch)
    assert archs == {"sm_90a", "sm_100a"}


@NEEDS_DSL
def test_activation_quantizers_ship_for_sm90a_only(shipped: Path) -> None:
    """The two activation quantizers (kernels/sm90/act_quant.py) ship beside the GEMMs: one per
    layout for sm_90a (no sm_100a quantizer exists), their parameters in the order and under
    the roles runtime/quantize.py packs, each cubin the right arch with its symbol and no stack
    frame, and shared-memory tables for 1024 experts (the masked layout's for masked_m)."""
    from kernels.introspect import require_no_stack_frame
    from runtime.params import role

    m = load_manifest(shipped)
    assert [(q.layout, q.arch) for q in m.quantizers] == [("experts", "sm_90a"),
                                                          ("masked", "sm_90a")]
    roles = {q.layout: [(p.kind, role(p)) for p in q.params] for q in m.quantizers}
    ops = [("operand", "x"), ("operand", "offs"), ("operand", "scales"), ("operand", "a"),
           ("operand", "sfa")]
    scalars = [("scalar", "k"), ("scalar", "experts"), ("scalar", "blocks"),
               ("scalar", "sfa_chunks")]
    assert roles["experts"] == ops + [("scalar", "rows")] + scalars
    assert roles["masked"] == [ops[0], ops[2], ("operand", "masked_m"), *ops[3:],
                               ("scalar", "max_m")] + scalars + [("scalar", "quant_ctas")]
    for q in m.quantizers:
        cubin = (shipped / q.cubin).read_bytes()
        assert cubin_arch(cubin, q.cubin) == "sm_90a" and q.symbol.encode() in cubin
        require_no_stack_frame(cubin, q.symbol, "the quantizer keeps its values in registers")
        assert q.block == (256, 1, 1)
    experts, masked = m.quantizers
    assert (experts.max_experts, masked.max_experts) == (1024, 1024)
    assert experts.dynamic_smem == (2 * 1024 + 8) * 4 + 64
    assert masked.dynamic_smem == (1024 + 8) * 4 + 64  # the masked_m table
