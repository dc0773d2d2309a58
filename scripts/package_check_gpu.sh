#!/usr/bin/env bash
# Issue 7's "done when": a fresh venv installs the project wheel and an artifact wheel offline and
# runs grouped_gemm on the GPU with no path configuration and no CuTe DSL installed.
#
#   bash scripts/package_check_gpu.sh build [ARTIFACTS]   # CPU machine: writes dist/*.whl
#   bash scripts/package_check_gpu.sh check [DIST]        # GPU machine: venv, install, run
#   bash scripts/package_check_gpu.sh all [ARTIFACTS]     # both, on one machine
#   bash scripts/package_check_gpu.sh check --dry-run     # no GPU: install + discovery only
#
# build: `build_kernels.py verify` + `package` (stdlib only; NAME and ARCH env, default
# hopper / sm_90a) and the project wheel (`pip wheel --no-build-isolation --no-index`, needs
# setuptools; built from a temporary copy so the checkout gets no build/ or egg-info).
# check: `python -m venv --system-site-packages`. That flag is acceptable on the GPU machine
# and not in CI's check (tests/test_package.py): there torch and cuda.bindings are installed
# system-wide and cannot be downloaded (no network), while nvidia-cutlass-dsl is NOT installed
# (the Python check below asserts that `cutlass` cannot be found). Both wheels are installed
# with `pip install --no-index --no-deps`; the check runs outside the checkout, with PYTHONPATH
# unset, and asserts that `runtime` comes from the venv.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python}"
MODE="${1:-check}"
shift || true
WORK=""
trap 'rm -rf "$WORK"' EXIT

build() {
    local art="${1:-$ROOT/artifacts}" dist="$ROOT/dist" src
    mkdir -p "$dist"
    rm -f "$dist"/nvfp4_grouped_gemm-*.whl "$dist"/nvfp4_artifacts_*.whl
    "$PY" "$ROOT/build_kernels.py" verify "$art"
    "$PY" "$ROOT/build_kernels.py" package "$art" --out "$dist" --name "${NAME:-hopper}" \
        --arch "${ARCH:-sm_90a}"
    src="$(mktemp -d)"
    cp -r "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/build_kernels.py" "$ROOT/runtime" \
        "$ROOT/builder" "$ROOT/kernels" "$src/"
    find "$src" -name __pycache__ -prune -exec rm -rf {} +
    "$PY" -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$dist" "$src"
    rm -rf "$src"
    ls -l "$dist"/*.whl
}

check() {
    local dist="$ROOT/dist" dry=0 venv
    for arg in "$@"; do
        case "$arg" in
            --dry-run) dry=1 ;;
            *) dist="$(cd "$arg" && pwd)" ;;
        esac
    done
    ls "$dist"/nvfp4_grouped_gemm-*.whl "$dist"/nvfp4_artifacts_*.whl >/dev/null || {
        echo "error: $dist must hold the project wheel and an artifact wheel; run" \
             "'bash scripts/package_check_gpu.sh build' first (on the CPU machine)" >&2
        exit 2
    }
    WORK="$(mktemp -d)"
    venv="$WORK/venv"
    "$PY" -m venv --system-site-packages "$venv"
    # On the H200 image torch lives in its own venv (/opt/torch/.venv), not in the system
    # site-packages that --system-site-packages exposes: point the new venv at the creating
    # interpreter's site-packages (which hold no cutlass; checked below).
    if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
        "$PY" -c "import site; print('\n'.join(site.getsitepackages()))" \
            >"$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/host_site.pth"
    fi
    "$venv/bin/python" -m pip install -q --no-index --no-deps \
        "$dist"/nvfp4_grouped_gemm-*.whl "$dist"/nvfp4_artifacts_*.whl
    "$venv/bin/python" -m pip list 2>/dev/null | grep -i -E "nvfp4|cutlass|torch|cuda" || true
    cd "$WORK"
    env -u PYTHONPATH DRY_RUN="$dry" "$venv/bin/python" -m runtime.packages --verify
    env -u PYTHONPATH DRY_RUN="$dry" "$venv/bin/python" - <<'EOF'
import importlib.util
import math
import os
import sys
import time

dry = os.environ.get("DRY_RUN") == "1"
dsl = importlib.util.find_spec("cutlass") is not None
print(f"nvidia-cutlass-dsl importable: {dsl}")
assert dry or not dsl, "the DSL must not be installed for this check"

import torch  # noqa: E402

import runtime  # noqa: E402
import runtime.packages as packages  # noqa: E402

print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"runtime from {os.path.dirname(runtime.__file__)}")
assert runtime.__file__.startswith(sys.prefix), "runtime must come from the venv"
print("installed artifact packages:", {k: str(v) for k, v in packages.find_artifact_dirs().items()})
try:
    gg = runtime.load()  # with the api.load change: the only installed package
    how = "runtime.load()"
except TypeError:
    gg = packages.load()
    how = "runtime.packages.load()"
print(f"loaded with {how}: {len(gg.kernels)} kernel(s)")
if dry:
    print("PACKAGE CHECK (dry run, no GPU): install and discovery OK")
    sys.exit(0)

from runtime.nvfp4 import check_close, make_grouped_problem, reference_grouped_gemm  # noqa: E402

arch = {(9, 0): "sm_90a", (10, 0): "sm_100a"}.get(torch.cuda.get_device_capability())
entries = [e for e in gg.kernels if e.arch == arch and e.constraints.get("groups")]
assert entries, f"no exact-shape kernel for {arch} in the package"
want = os.environ.get("SET")
entry = (next(e for e in entries if e.set == want) if want else
         min(entries, key=lambda e: sum(m * n * k for m, n, k in e.constraints["groups"])))
groups = [tuple(g) for g in entry.constraints["groups"]]
print(f"GPU {torch.cuda.get_device_name()}, set {entry.set} ({entry.name}), groups {groups}")
ok_all = True
cases = [("full", 0, (0, 6), (-6, -3)), ("full", 1, (-6, -3), (0, 6)), ("benchmark", 2, (0, 0), None)]
for values, seed, ea, eb in cases:
    p = make_grouped_problem(groups, seed=7000 + seed, device="cuda", values=values,
                             scale_exp=ea, scale_exp_b=eb)
    outs = [torch.full((m, n), math.nan, dtype=torch.float16, device="cuda") for m, n, _ in groups]
    gg.grouped_gemm(p.a, p.b, p.sfa, p.sfb, out=outs)
    torch.cuda.synchronize()
    ref = reference_grouped_gemm(p.a, p.b, p.sfa, p.sfb, groups)
    ok, report = check_close(outs, ref)
    exact = all(torch.equal(o, r.half()) for o, r in zip(outs, ref))
    ok_all &= ok and exact
    print(f"grouped_gemm {values}-{seed}: {'PASS' if ok and exact else 'FAIL'} "
          f"(bit-exact vs fp16(float64 reference): {exact}); {report.splitlines()[0]}")

# The torch op, with no path either: key "default" is the only installed package.
import runtime.torch_op as op  # noqa: E402

p = make_grouped_problem(groups, seed=7100, device="cuda", values="benchmark")
eager = gg.grouped_gemm(p.a, p.b, p.sfa, p.sfb)
via_op = torch.ops.nvfp4.grouped_gemm(p.a, p.b, p.sfa, p.sfb)
compiled = torch.compile(lambda a, b, sa, sb: torch.ops.nvfp4.grouped_gemm(a, b, sa, sb),
                         fullgraph=True, backend="aot_eager")
via_compile = compiled(p.a, p.b, p.sfa, p.sfb)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    via_graph = torch.ops.nvfp4.grouped_gemm(p.a, p.b, p.sfa, p.sfb)
for o in via_graph:
    o.fill_(math.nan)
graph.replay()
torch.cuda.synchronize()
for name, got in (("op", via_op), ("torch.compile", via_compile), ("CUDA graph", via_graph)):
    same = all(torch.equal(x, y) for x, y in zip(got, eager))
    ok_all &= same
    print(f"torch.ops.nvfp4.grouped_gemm via {name}: {'PASS' if same else 'FAIL'} "
          f"(equal to the eager runtime call: {same})")


def host_us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


direct = host_us(lambda: gg.grouped_gemm(p.a, p.b, p.sfa, p.sfb))
custom = host_us(lambda: torch.ops.nvfp4.grouped_gemm(p.a, p.b, p.sfa, p.sfb))
print(f"host time per call (launch only, not synchronized): direct {direct:.1f} us, "
      f"custom op {custom:.1f} us")
print(f"PACKAGE CHECK: {'PASS' if ok_all else 'FAIL'}")
sys.exit(0 if ok_all else 1)
EOF
}

case "$MODE" in
    build) build "$@" ;;
    check) check "$@" ;;
    all) build "$@"; check ;;
    *) echo "usage: $0 build [ARTIFACTS] | check [DIST] [--dry-run] | all [ARTIFACTS]" >&2; exit 2 ;;
esac
