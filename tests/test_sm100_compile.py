"""Compile-only tier of the sm_100a kernel: no GPU, no driver; the DSL runs in a subprocess.

No B200 is available, so these checks are what stands between a source change and a wrong cubin:
the cubin builds for both acc-stage settings and both output types, the recorded launch ABI equals
the PTX `.entry` list, the TMA templates equal what the DSL itself would encode, the tile
coordinates of every TMA load are computed from the run-time tile index, the epilogue scales every
accumulator by the group's alpha before rounding to out_dtype, and the SASS holds the tcgen05
instructions.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.introspect import nvdisasm_path
from runtime.manifest import pack_offsets

pytestmark = [
    pytest.mark.dsl,
    pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                       reason="nvidia-cutlass-dsl is not installed"),
]

REPO = Path(__file__).resolve().parents[1]
GROUPS = [[80, 4096, 7168], [176, 4096, 7168], [40, 7168, 2048]]
SM100_MAX_SMEM = 232448
STAGE_BYTES = 2 * 128 * 256 // 2 + 2 * 128 * 16  # A + B fp4 tiles, SFA + SFB: 36864
OUT_DTYPES = ("float16", "bfloat16")
ACC_STAGES = (1, 2)

# Runs under CUTE_DSL_ARCH=sm_100a (the DSL reads the arch once, at import).
WORKER = r"""
import json, sys, time
from pathlib import Path
from kernels.sm100.config import Config
from kernels import introspect
from kernels.sm100 import grouped_gemm as gg

out = Path(sys.argv[1])
groups = json.loads(sys.argv[2])
result = {"kernels": {}, "errors": {}}
for out_dtype in ("float16", "bfloat16"):
    for acc in (1, 2):
        key = f"{out_dtype}.acc{acc}"
        t0 = time.perf_counter()
        ck = gg.compile_kernel(Config(acc_stages=acc, out_dtype=out_dtype), arch="sm_100a",
                               groups=groups)
        seconds = time.perf_counter() - t0
        (out / f"{key}.cubin").write_bytes(ck.cubin)
        (out / f"{key}.ptx").write_text(ck.ptx)
        result["kernels"][key] = {
            "out_dtype": out_dtype, "acc_stages": acc,
            "symbol": ck.symbol, "params": ck.params, "block": list(ck.block),
            "cluster": list(ck.cluster), "dynamic_smem": ck.dynamic_smem, "grid": ck.grid,
            "tile": ck.tile, "tables": ck.tables, "constraints": ck.constraints,
            "sm_count": ck.sm_count, "seconds": seconds,
        }
_, compiled, _, _ = gg.compile_dsl(Config(acc_stages=2))
result["descriptors"] = introspect.lowered_tma_descriptors(compiled)
for name, call in {
    "arch": lambda: gg.compile_kernel(Config(), arch="sm_90a", groups=groups),
    "k": lambda: gg.compile_kernel(Config(), arch="sm_100a", groups=[[128, 4096, 100]]),
    "n": lambda: gg.compile_kernel(Config(), arch="sm_100a", groups=[[128, 4100, 256]]),
    "config": lambda: gg.Sm100GroupedGemm(Config(acc_stages=3)),
    "stages": lambda: gg.Sm100GroupedGemm(Config(ab_stages=7)),
    "out_dtype": lambda: gg.Sm100GroupedGemm(Config(out_dtype="float32")),
}.items():
    try:
        call()
        result["errors"][name] = None
    except Exception as exc:
        result["errors"][name] = f"{type(exc).__name__}: {exc}"
(out / "result.json").write_text(json.dumps(result))
"""


def _run(code: str, arch: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUTE_DSL_ARCH": arch, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm100")
    proc = _run(WORKER, "sm_100a", str(out), json.dumps(GROUPS))
    assert proc.returncode == 0, f"compile worker failed:\n{proc.stdout}\n{proc.stderr[-6000:]}"
    result = json.loads((out / "result.json").read_text())
    assert sorted(result["kernels"]) == sorted(_key(o, a) for o in OUT_DTYPES for a in ACC_STAGES)
    for key, k in result["kernels"].items():
        k["ptx"] = (out / f"{key}.ptx").read_text()
        k["cubin_path"] = out / f"{key}.cubin"
    return result


def _key(out_dtype: str, acc: int) -> str:
    return f"{out_dtype}.acc{acc}"


def _kernels(built, out_dtypes=OUT_DTYPES):
    """Every compiled kernel: (out_dtype, acc_stages) for out_dtype in out_dtypes, acc 1 and 2."""
    return [built["kernels"][_key(o, acc)] for o in out_dtypes for acc in ACC_STAGES]


# --------------------------------------------------------------------------------------------
# An independent PTX reader (deliberately not kernels.sm100.introspect)
# --------------------------------------------------------------------------------------------


def _entry_params(ptx: str, symbol: str) -> list[tuple[int, int]]:
    m = re.search(rf"\.entry\s+{re.escape(symbol)}\s*\((.*?)\)", ptx, re.DOTALL)
    assert m, f"no .entry {symbol}"
    out = []
    for decl in filter(None, (d.strip() for d in m.group(1).split(","))):
        if (arr := re.match(r"\.param \.align (\d+) \.b8 \w+\[(\d+)\]$", decl)):
            out.append((int(arr.group(2)), int(arr.group(1))))
        elif (sc := re.match(r"\.param \.[usbf](\d+)\b", decl)):
            out.append((int(sc.group(1)) // 8,) * 2)
        else:
            raise AssertionError(f"unparsed PTX parameter {decl!r}")
    return out


def _definitions(ptx: str) -> dict[str, list[str]]:
    """Every instruction that writes each register (PTX is not SSA: loops re-assign)."""
    defs: dict[str, list[str]] = {}
    for line in ptx.splitlines():
        m = re.match(r"\s*(?:@%p\d+\s+)?([a-z][\w.:]*)\s+(%\w+)\s*,(.*);", line)
        if m and not m.group(1).startswith(("st.", "setp", "tensormap", "mbarrier", "cp.")):
            defs.setdefault(m.group(2), []).append(f"{m.group(1)} {m.group(2)},{m.group(3)}")
    return defs


def _tma_loads(ptx: str) -> list[tuple[int, list[str]]]:
    loads = re.findall(r"cp\.async\.bulk\.tensor\.(\d)d\.shared::cta\.global\S*\s+\[[^\]]+\],\s*"
                       r"\[%\w+,\s*\{([^}]*)\}\]", ptx)
    return [(int(rank), [c.strip() for c in coords.split(",")]) for rank, coords in loads]


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def test_compiles_both_acc_stages_with_short_symbol(built):
    for k in _kernels(built):
        # "cutlass" stays in the name: NVVM / ptxas generate the original's code only then.
        assert k["symbol"] == "nvfp4_gg_sm100_cutlass_0"
        assert ".local" not in k["ptx"], "the epilogue fragment went to local memory"
        assert re.search(r"^\.target sm_100a$", k["ptx"], re.MULTILINE)
        assert k["cubin_path"].read_bytes()[:4] == b"\x7fELF"
        assert tuple(k["block"]) == (192, 1, 1) and tuple(k["cluster"]) == (1, 1, 1)
        assert re.search(r"\.reqntid 192, 1, 1", k["ptx"])
        assert k["sm_count"] is None and k["grid"] == {"policy": "persistent", "ctas_per_sm": 1}
        assert k["tile"] == {"m": 128, "n": 128, "k": 256}
        assert k["constraints"] == {"groups": GROUPS, "k_multiple": 256, "n_multiple": 8}
        assert k["tables"]["tensormap_workspace"] == {"bytes_per_cta": 512, "align": 128}
        assert k["tables"]["pointers"]["columns"] == ["a", "b", "sfa", "sfb", "c"]
        # Compile time stays in seconds (measured ~1 s on 2 cores).
        assert k["seconds"] < 60, k["seconds"]


def test_params_equal_ptx_entry(built):
    for k in _kernels(built):
        entry = _entry_params(k["ptx"], k["symbol"])
        recorded = [(p["size"], p["align"]) for p in k["params"]]
        assert recorded == entry
        assert [p["offset"] for p in k["params"]] == pack_offsets(entry)


def test_abi_kinds_in_order(built):
    for k in _kernels(built):
        got = [(p["kind"], p.get("operand") or p.get("table") or p.get("value") or p["name"])
               for p in k["params"]]
        assert got == [
            ("zeros", "tiled_mma"),
            ("tma_template", "a"), ("tma_template", "b"),
            ("tma_template", "sfa"), ("tma_template", "sfb"),
            ("table", "problem_sizes"), ("table", "pointers"), ("table", "cta_prefix"),
            ("table", "tensormap_workspace"), ("table", "alpha"),
            ("scalar", "num_groups"),
        ]
        assert k["params"][0]["size"] == 12 and k["params"][0]["align"] == 4


def test_tma_templates_are_encodable(built):
    """What cuTensorMapEncodeTiled accepts, and the boxes / swizzles the kernel relies on."""
    for k in _kernels(built):
        tma = {p["operand"]: p["tma"] for p in k["params"] if p["kind"] == "tma_template"}
        for op in ("a", "b"):
            assert tma[op]["dtype"] == "16U4_ALIGN8B" and tma[op]["box"] == [256, 128]
            assert tma[op]["swizzle"] == "128B"
        for op in ("sfa", "sfb"):
            assert tma[op]["dtype"] == "UINT16" and tma[op]["box"] == [256, 4, 1]
            assert tma[op]["swizzle"] == "NONE"
            assert tma[op]["dims"][0] == 256 and tma[op]["strides"][0] == 512
        for op, g in tma.items():
            assert len(g["dims"]) == len(g["box"]) == len(g["strides"]) + 1, op
            assert all(0 < d <= 1 << 32 for d in g["dims"]), op
            assert all(s % 16 == 0 and 0 < s < 1 << 40 for s in g["strides"]), op
            assert all(0 < b <= 256 and b <= d for b, d in zip(g["box"], g["dims"])), op
            assert g["l2_promotion"] == "128B" and g["oob_fill"] == "NONE", op


def _decode(words: list[int | None]) -> dict:
    """Fields of a packed CUtensorMap, as the DSL 4.8.1 packs it (layout read off probes with
    known ranks, dims, strides, boxes and swizzles; undocumented, pinned with the DSL)."""
    w1 = words[1]
    rank = ((w1 >> 4) & 7) + 1
    return {
        "rank": rank,
        "swizzle": ("NONE", "32B", "64B", "128B")[(w1 >> 13) & 3],
        "dims": [(words[4] & 0xFFFFFFFF) + 1, (words[4] >> 32) + 1,
                 (words[5] & 0xFFFFFFFF) + 1][:rank],
        "strides": [(w1 >> 32) << 4, (words[2] & 0xFFFFFFFF) << 4][: rank - 1],
        "box01": [(words[6] >> 56) + 1, (words[7] & 0xFF) + 1],
    }


def test_tma_templates_equal_the_dsl_encoding(built):
    """The DSL's own launcher packs a descriptor for each atom; the recorded geometry (which the
    runtime encodes with cuTensorMapEncodeTiled) must describe the same tensor map."""
    k = built["kernels"][_key("float16", 2)]  # the config the worker probes the DSL with
    tma = [p["tma"] for p in k["params"] if p["kind"] == "tma_template"]
    descriptors = built["descriptors"]
    assert len(descriptors) == len(tma) == 4
    for g, words in zip(tma, descriptors):
        assert words[0] is None  # the address, filled by the runtime
        d = _decode(words)
        assert d == {"rank": len(g["dims"]), "swizzle": g["swizzle"], "dims": g["dims"],
                     "strides": g["strides"], "box01": g["box"][:2]}


def test_dynamic_smem_is_exact_and_plausible(built):
    stages = 6  # Config().ab_stages
    for k in _kernels(built):
        # A/B/SFA/SFB stages plus < 2 KiB of barriers, tensormaps and per-stage tile info.
        assert stages * STAGE_BYTES < k["dynamic_smem"] <= SM100_MAX_SMEM
        assert k["dynamic_smem"] - stages * STAGE_BYTES < 2048
    for out_dtype in OUT_DTYPES:
        k1, k2 = _kernels(built, (out_dtype,))
        # A second accumulator stage adds its two mbarriers and stage slots.
        assert k2["dynamic_smem"] > k1["dynamic_smem"]
    # The output type changes no shared-memory buffer (C goes from registers to global).
    assert ([k["dynamic_smem"] for k in _kernels(built, ("float16",))]
            == [k["dynamic_smem"] for k in _kernels(built, ("bfloat16",))])
    # The stage buffers sit where the DSL's allocator put them: the last SFB stage must end
    # inside the dynamic allocation the runtime will request.
    for k in _kernels(built):
        offsets = [int(x) for x in re.findall(r"\[%r\d+\+(\d+)\], \[%rd\d+, \{", k["ptx"])]
        assert offsets and max(offsets) + stages * 2048 <= k["dynamic_smem"]


def test_tile_coordinates_come_from_the_tile_index(built):
    """Static placeholder extents must not fold the per-tile TMA coordinates to constants."""
    for k in _kernels(built):
        ptx = k["ptx"]
        defs = _definitions(ptx)
        loads = _tma_loads(ptx)
        ab = [c for rank, c in loads if rank == 2]
        sf = [c for rank, c in loads if rank == 3]
        assert ab and sf and len(ab) + len(sf) == len(loads)

        def scaled(reg: str, shift: int, defs: dict = defs) -> bool:
            return bool(defs.get(reg)) and all(
                re.fullmatch(rf"shl\.b32 {re.escape(reg)}, %r\d+, {shift}", d) for d in defs[reg])

        for k_coord, mn_coord in ab:  # {k_tile * 256, m_or_n_tile * 128}
            assert scaled(k_coord, 8), (k_coord, defs.get(k_coord))
            assert scaled(mn_coord, 7), (mn_coord, defs.get(mn_coord))
        for _, k_atom, mn_atom in sf:  # {0, k_tile * 4, m_or_n_tile}
            assert scaled(k_atom, 2), (k_atom, defs.get(k_atom))
            assert not all(re.fullmatch(r"mov\.b32 %r\d+, -?\d+", d) for d in defs[mn_atom])
        # The persistent schedule reads the launched grid; nothing SM-count-like is baked in.
        assert "%nctaid.x" in ptx
        # Four descriptors re-pointed per group in the per-CTA workspace.
        assert len(re.findall(r"tensormap\.replace\.tile\.global_address", ptx)) == 4


_PATCH_RE = re.compile(r"tensormap\.replace\.tile\.(?P<field>global_dim|global_stride)\.global"
                       r"\.b1024\.b\d+\s+\[(?P<desc>%rd\d+)\],\s*(?P<ord>\d+),\s*(?P<reg>%\w+);")


def test_per_group_patch_matches_the_sf_geometry(built):
    """The kernel re-points the SF descriptors per group with the same view the template records:
    dim 0 is one 512-byte atom as 256 16-bit elements, with a 512-byte stride to the next."""
    for k in _kernels(built):
        defs = _definitions(k["ptx"])
        patches: dict[str, dict[tuple[str, str], str]] = {}
        for m in _PATCH_RE.finditer(k["ptx"]):  # descriptors in a, b, sfa, sfb order
            patches.setdefault(m["desc"], {})[(m["field"], m["ord"])] = m["reg"]
        assert len(patches) == 4, list(patches)
        for desc in list(patches)[2:]:
            dim0 = patches[desc][("global_dim", "0")]
            stride0 = patches[desc][("global_stride", "0")]
            assert defs[dim0] == [f"mov.b32 {dim0}, 256"], defs.get(dim0)
            assert defs[stride0] == [f"mov.b64 {stride0}, 512"], defs.get(stride0)


def _instructions(ptx: str) -> list[tuple[str, list[str]]]:
    """(opcode, operands) of every PTX instruction (guard predicates dropped; inline-asm lines
    included), operands split at top-level commas."""
    out = []
    for line in ptx.splitlines():
        m = re.match(r"\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)\s+([^;]*);", line)
        if not m:
            continue
        ops, depth, cur = [], 0, ""
        for ch in m.group(2):
            depth += ch in "{["
            depth -= ch in "}]"
            if ch == "," and depth == 0:
                ops.append(cur.strip())
                cur = ""
            else:
                cur += ch
        ops.append(cur.strip())
        out.append((m.group(1), ops))
    return out


def _regs(operand: str) -> set[str]:
    return set(re.findall(r"%\w+", operand))


def _alpha_loads(ptx: str, symbol: str, index: int, insts) -> list[str]:
    """Destination registers of the global loads that read through parameter `index`: its
    ld.param value, followed through address arithmetic (add, mad, mov, cvta)."""
    param = f"{symbol}_param_{index}"
    addr = {ops[0] for op, ops in insts if op.startswith("ld.param") and ops[1] == f"[{param}]"}
    assert addr, f"{param} is never read"
    changed = True
    while changed:
        changed = False
        for op, ops in insts:
            if (op.startswith(("add.", "mad.", "mov.", "cvta.")) and ops[0] not in addr
                    and _regs(",".join(ops[1:])) & addr):
                addr.add(ops[0])
                changed = True
    loads = []
    for op, ops in insts:
        if op.startswith("ld.global") and len(ops) == 2:
            base = re.fullmatch(r"\[(%\w+)(?:\+-?\d+)?\]", ops[1])
            if base and base.group(1) in addr:
                loads.append((op, ops[0], base.group(1)))
    assert all(re.fullmatch(r"ld\.global(\.\w+)*\.[bfu]32", op) for op, _, _ in loads), loads
    return [(reg, base) for _, reg, base in loads]


def _index_of(address: str, insts) -> set[str]:
    """The 32-bit registers i of `address = base + i * 4` (mul.wide by 4)."""
    offsets = {r for op, ops in insts if op.startswith("add.s64") and ops[0] == address
               for r in ops[1:]}
    return {ops[1] for op, ops in insts
            if re.fullmatch(r"mul\.wide\.[su]32", op) and ops[0] in offsets and ops[2] == "4"}


def _taint(insts, seeds: set[str]) -> set[str]:
    """Registers whose value depends on `seeds`, also through shared memory (a store of a tainted
    register taints its constant offset; a load from that offset is tainted)."""
    regs, offsets = set(seeds), set()
    changed = True
    while changed:
        changed = False
        for op, ops in insts:
            if op.startswith("st.shared"):
                off = re.fullmatch(r"\[%\w+\+(\d+)\]", ops[0])
                if off and _regs(",".join(ops[1:])) & regs and off.group(1) not in offsets:
                    offsets.add(off.group(1))
                    changed = True
                continue
            if op.startswith(("st.", "setp", "bra", "mbarrier", "tcgen05", "cp.")) or not ops:
                continue
            dests = _regs(ops[0]) - regs
            if not dests:
                continue
            if op.startswith("ld.shared"):
                off = re.fullmatch(r"\[%\w+\+(\d+)\]", ops[1]) if len(ops) == 2 else None
                hit = bool(off and off.group(1) in offsets)
            else:
                hit = bool(_regs(",".join(ops[1:])) & regs)
            if hit:
                regs |= dests
                changed = True
    return regs


def test_alpha_is_a_per_group_fp32_pointer_table(built):
    """alpha: one table parameter, an 8-byte global pointer to fp32 (4-byte aligned data), in the
    .entry slot the recorded ABI says, just before num_groups."""
    for k in _kernels(built):
        alpha = [i for i, p in enumerate(k["params"])
                 if p["kind"] == "table" and p.get("table") == "alpha"]
        assert len(alpha) == 1, k["params"]
        i = alpha[0]
        p = k["params"][i]
        assert p["name"] == "alpha" and (p["size"], p["align"]) == (8, 8), p
        assert k["params"][i + 1]["name"] == "num_groups"
        assert _entry_params(k["ptx"], k["symbol"])[i] == (8, 8)
        assert re.search(rf"\.param \.u64 \.ptr \.global \.align 4 {k['symbol']}_param_{i}\b",
                         k["ptx"]), f"param {i} is not a 4-byte aligned global pointer"


def test_epilogue_scales_by_alpha_then_rounds_to_out_dtype(built):
    """alpha[g] is loaded once per group (not per element), every accumulator of a thread's row
    (128 fp32 values) is multiplied by it, and every fp32 -> out_dtype conversion takes the
    scaled values."""
    for k in _kernels(built):
        ptx, symbol = k["ptx"], k["symbol"]
        index = next(i for i, p in enumerate(k["params"]) if p.get("table") == "alpha")
        insts = _instructions(ptx)
        loads = _alpha_loads(ptx, symbol, index, insts)
        assert len(loads) == 1, f"alpha is loaded {len(loads)} times: {loads}"
        (loaded, address), = loads
        # Indexed by the group whose pointer-table row (5 columns) gives the tile's C pointer.
        group = _index_of(address, insts)
        assert group and any(op == "mul.lo.s32" and ops[1] in group and ops[2] == "5"
                             for op, ops in insts), f"alpha[{group}] is not alpha[group]"
        tainted = _taint(insts, {loaded})

        scaled_lanes = 0
        for op, ops in insts:
            if re.fullmatch(r"(mul|fma)(\.rn|\.rz|\.ftz)*\.f32(x2)?", op) and \
                    _regs(",".join(ops[1:])) & tainted:
                scaled_lanes += 2 if op.endswith("x2") else 1
        assert scaled_lanes >= 128, f"only {scaled_lanes} fp32 values are scaled by alpha"

        short = {"float16": "f16", "bfloat16": "bf16"}[k["out_dtype"]]
        other = {"f16": "bf16", "bf16": "f16"}[short]
        cvts = [(op, ops) for op, ops in insts if re.fullmatch(rf"cvt\.rn\.{short}(x2)?\.f32", op)]
        # 128 values per thread: 64 packed conversions (or 128 single ones).
        assert sum(2 if "x2" in op else 1 for op, _ in cvts) == 128, len(cvts)
        for op, ops in cvts:
            assert _regs(",".join(ops[1:])) <= tainted, f"{op} {ops} converts unscaled values"
        assert not re.search(rf"cvt\.rn\.{other}(x2)?\.f32", ptx), f"a conversion to {other}"


def test_sass_has_tcgen05_instructions(built):
    tool = nvdisasm_path()
    if tool is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm to run this check)")
    for k in _kernels(built):
        proc = subprocess.run([tool, str(k["cubin_path"])], capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        sass = proc.stdout
        assert re.search(r"\bUTC\w*MMA", sass), "no tcgen05.mma (UTC*MMA) in the SASS"
        assert "UTCCP" in sass, "no tcgen05.cp (scale factors to TMEM) in the SASS"
        assert "UTMALDG" in sass, "no TMA loads in the SASS"
        # The epilogue packs fp32 pairs into out_dtype (F2FP), and only into out_dtype.
        want, other = (("BF16", "F16") if k["out_dtype"] == "bfloat16" else ("F16", "BF16"))
        assert re.search(rf"\bF2FP\.{want}\.F32\.PACK", sass), f"no fp32 -> {want} pack"
        assert not re.search(rf"\bF2FP\.{other}\.F32", sass), f"fp32 -> {other} pack found"


def test_rejects_bad_requests(built):
    errors = built["errors"]
    assert errors["arch"].startswith("ValueError: arch must be 'sm_100a'")
    assert errors["k"].startswith("ValueError: groups[0].k must be a multiple of 256")
    assert errors["n"].startswith("ValueError: groups[0].n must be a multiple of 8")
    assert errors["config"].startswith("ValueError: invalid sm100 config: acc_stages")
    assert errors["out_dtype"].startswith(
        "ValueError: invalid sm100 config: out_dtype must be one of ['float16', 'bfloat16']")
    assert errors["stages"] == (
        "ValueError: invalid sm100 config: ab_stages 7 needs 7 x 36864 + 1024 = 259072 bytes of "
        "shared memory, more than the 232448 an sm_100 CTA may use; ab_stages must be <= 6")


def test_wrong_import_arch_is_an_error():
    code = ("from kernels.sm100.config import Config\n"
            "from kernels.sm100.grouped_gemm import compile_kernel\n"
            "try:\n"
            "    compile_kernel(Config(), arch='sm_100a', groups=[[128, 4096, 256]])\n"
            "except RuntimeError as exc:\n"
            "    print('ERR', exc)\n")
    proc = _run(code, "sm_90a")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ERR cutlass must be imported with CUTE_DSL_ARCH=sm_100a" in proc.stdout
