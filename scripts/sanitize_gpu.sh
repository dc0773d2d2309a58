#!/usr/bin/env bash
# The sm_90a GPU correctness checks under compute-sanitizer: memcheck (out-of-bounds and
# misaligned global/shared accesses, API errors) and racecheck (shared-memory hazards).
#
#   scripts/sanitize_gpu.sh [KERNEL ...]        (default: mixed_2.sm_90a.acc1.f16 moe_down.sm_90a.acc1.f16)
#
# Runs `scripts/gpu_checks.py --seeds 1 --only KERNEL ...` once per tool. gpu_checks runs each
# kernel in a child process, so the sanitizer follows children (--target-processes all). Only
# our kernels are instrumented (--kernel-name kns=<symbol>, symbols read from the manifest):
# torch's own kernels (inputs, the float64 reference) run at full speed and cannot add noise.
# PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives every tensor its own cudaMalloc, so an access past a
# tensor is past an allocation, which memcheck sees (inside one caching-allocator segment it
# would not). Prints one line per tool, "sanitize <tool>: clean ..." or "sanitize <tool>:
# UNCLEAN ...", and exits non-zero unless every tool is clean.
#
# Environment:
#   NVFP4_ARTIFACTS   artifact directory (default: artifacts)
#   SANITIZE_TOOLS    tools to run (default: "memcheck racecheck"; synccheck and initcheck work too)
#   SANITIZE_SEEDS    gpu_checks --seeds (default: 1)
#   SANITIZE_FILTER   "all" instruments every kernel instead of ours only
#   SANITIZE_PYTEST   a pytest target to run under each tool as well, e.g. tests/test_oob_gpu.py
#   SANITIZE_SERVING  a kernel name: also run scripts/serving_check.py on it (the serving API,
#                     bad offs included: issue 28's "no out-of-bounds access whatever the offsets");
#                     its symbol is instrumented too. Eager calls only (--no-graph): with
#                     PYTORCH_NO_CUDA_MEMORY_CACHING=1 a graph capture that allocates fails
#                     ("operation failed due to a previous error during capture"), and the eager
#                     bad-offs calls are what memcheck must see. KERNEL arguments that serve
#                     scaled_grouped_mm only (device-offsets kernels) are left out of gpu_checks
#   SANITIZE_ARGS     extra compute-sanitizer options, e.g. "--padding 512"
#   SANITIZE_LOG_DIR  where the logs go (default: $OUT/sanitize, else /tmp/nvfp4-sanitize)
#   COMPUTE_SANITIZER the binary (default: on PATH, else the newest /usr/local/cuda*/bin one)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1

artifacts="${NVFP4_ARTIFACTS:-artifacts}"
tools="${SANITIZE_TOOLS:-memcheck racecheck}"
seeds="${SANITIZE_SEEDS:-1}"
logdir="${SANITIZE_LOG_DIR:-${OUT:+$OUT/sanitize}}"
logdir="${logdir:-/tmp/nvfp4-sanitize}"
kernels=("$@")
if [ ${#kernels[@]} -eq 0 ]; then
  kernels=(mixed_2.sm_90a.acc1.f16 moe_down.sm_90a.acc1.f16)
fi

cs="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}"
if [ -z "$cs" ]; then
  cs="$(ls -d /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | sort -V | tail -n 1)"
fi
if [ -z "$cs" ] || [ ! -x "$cs" ]; then
  echo "sanitize: no compute-sanitizer found (set COMPUTE_SANITIZER)" >&2
  exit 2
fi
mkdir -p "$logdir"

# The kernel symbols to instrument, from the manifest (fails on an unknown kernel name): the
# KERNEL arguments' and SANITIZE_SERVING's. Line 2: the KERNEL arguments that the list API
# serves, which gpu_checks runs (a device-offsets kernel, e.g. an expert layer's on sm_90a, serves
# scaled_grouped_mm only: SANITIZE_SERVING checks it).
if ! info="$(python - "$artifacts" "${SANITIZE_SERVING:-}" "${kernels[@]}" <<'EOF'
import sys
from runtime.manifest import load_manifest
m = load_manifest(sys.argv[1])
by_name = {e.name: e for e in m.sets}  # set entries; .symbol is their kernel's
names = sys.argv[3:] + ([sys.argv[2]] if sys.argv[2] else [])
missing = [n for n in names if n not in by_name]
if missing:
    sys.exit(f"sanitize: kernels {missing} are not in {sys.argv[1]}; built: {sorted(by_name)}")
print(" ".join(sorted({by_name[n].symbol for n in names})))
print(" ".join(n for n in sys.argv[3:] if not by_name[n].takes_offsets))
EOF
)"; then
  exit 2
fi
symbols="$(sed -n 1p <<<"$info")"
read -r -a listed <<<"$(sed -n 2p <<<"$info")"
filters=()
if [ "${SANITIZE_FILTER:-ours}" != "all" ]; then
  for s in $symbols; do filters+=(--kernel-name "kns=$s"); done
fi
only=()
for k in "${listed[@]}"; do only+=(--only "$k"); done
if [ ${#listed[@]} -lt ${#kernels[@]} ]; then
  echo "sanitize: gpu_checks runs ${listed[*]:-none} (the others serve scaled_grouped_mm only:" \
    "name them in SANITIZE_SERVING)"
fi

commit="$(git rev-parse --short HEAD 2>/dev/null)" || commit="unknown (no git)"
if [ "$commit" != "unknown (no git)" ] && ! git diff --quiet HEAD 2>/dev/null; then
  commit="$commit+uncommitted"
fi
gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
echo "sanitize: $("$cs" --version | tail -n 1); GPU ${gpu:-unknown}; commit $commit;" \
  "$(date -u +%Y-%m-%dT%H:%MZ)"
echo "sanitize: kernels ${kernels[*]} (symbols $symbols), seeds $seeds, logs in $logdir"

status=0
for tool in $tools; do
  log="$logdir/$tool.log"  # every process's report, concatenated
  out="$logdir/$tool.out"  # what the checks printed
  rm -f "$logdir/$tool".*.log "$log" "$out"
  rc=0
  if [ ${#listed[@]} -gt 0 ]; then  # gpu_checks with no --only would run every kernel
    # shellcheck disable=SC2086  # SANITIZE_ARGS is a list of options
    "$cs" --tool "$tool" --target-processes all --error-exitcode 86 --print-limit 50 \
      --report-api-errors no --log-file "$logdir/$tool.%p.log" "${filters[@]}" \
      ${SANITIZE_ARGS:-} python scripts/gpu_checks.py --artifacts "$artifacts" \
      --seeds "$seeds" --timeout 900 "${only[@]}" >"$out" 2>&1
    rc=$?
  else
    echo "0/0 kernels correct" >"$out"
  fi
  rc_pytest=0
  if [ -n "${SANITIZE_PYTEST:-}" ]; then
    # shellcheck disable=SC2086
    NVFP4_ARTIFACTS="$artifacts" "$cs" --tool "$tool" --target-processes all \
      --report-api-errors no --error-exitcode 86 --print-limit 50 --log-file "$logdir/$tool.%p.log" "${filters[@]}" \
      ${SANITIZE_ARGS:-} python -m pytest -q -p no:cacheprovider $SANITIZE_PYTEST \
      >>"$out" 2>&1
    rc_pytest=$?
  fi
  if [ -n "${SANITIZE_SERVING:-}" ]; then
    # shellcheck disable=SC2086
    "$cs" --tool "$tool" --target-processes all --report-api-errors no --error-exitcode 86 \
      --print-limit 50 --log-file "$logdir/$tool.%p.log" "${filters[@]}" ${SANITIZE_ARGS:-} \
      python scripts/serving_check.py --artifacts "$artifacts" --no-graph \
      --only "$SANITIZE_SERVING" >>"$out" 2>&1
    rc_pytest=$(( rc_pytest | $? ))
  fi
  cat "$logdir/$tool".*.log >"$log" 2>/dev/null
  # One "ERROR SUMMARY: N errors" per process; racecheck adds "RACECHECK SUMMARY: N hazards".
  # (--report-api-errors no: torch and cuda.bindings probe driver entry points with
  # cuGetProcAddress, and the misses are reported as API errors, not memory errors.)
  summaries=$(grep -cE "(ERROR|RACECHECK) SUMMARY:" "$log" || true)
  errors=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$log" | grep -oE "[0-9]+" \
    | awk '{s += $1} END {print s + 0}')
  hazards=$(grep -oE "RACECHECK SUMMARY: [0-9]+ hazard" "$log" | grep -oE "[0-9]+" \
    | awk '{s += $1} END {print s + 0}')
  correct=$(grep -oE "^[0-9]+/[0-9]+ kernels correct" "$out" | tail -n 1)
  detail="$errors errors, $hazards hazards in $summaries processes; ${correct:-no result}"
  detail="$detail; exit $rc"
  [ -n "${SANITIZE_PYTEST:-}" ] && detail="$detail, pytest exit $rc_pytest"
  want="${#listed[@]}/${#listed[@]} kernels correct"
  if [ "$rc" -eq 0 ] && [ "$rc_pytest" -eq 0 ] && [ "$errors" -eq 0 ] && [ "$hazards" -eq 0 ] \
      && [ "$summaries" -gt 0 ] && [ "$correct" = "$want" ]; then
    echo "sanitize $tool: clean ($detail)"
  else
    status=1
    echo "sanitize $tool: UNCLEAN ($detail; see $log and $out)"
    grep -E "^========= +(Invalid|Error|Program hit|Race|Barrier|Uninitialized|Warning)" "$log" \
      | head -n 20
    tail -n 15 "$out"
  fi
done
exit $status
