#!/usr/bin/env bash
# GPU check of branch inline-no-a-workspace (3a3557d): inline_a kernels whose manifest records
# no fp16 A area in the tensormap workspace (only phase 1 writes one; inline_a has no phase 1).
# The cubins are main's; only the workspace size changes. Build the artifacts from a worktree
# with 3a3557d applied (python build_kernels.py build --out .artifacts_noa), carry them, then:
#
#   bash experiments/noa_check.sh [DIR]    # serving_check on every inline_a entry, memcheck on one
set -eu
cd "$(dirname "$0")/.."
DIR=${1:-.artifacts_noa}
ONLY=$(python - "$DIR" <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/manifest.json"))
kernels = {k["key"]: k for k in m["kernels"]}
print(" ".join(f"--only {e['name']}" for e in m["sets"]
               if kernels[e["kernel"]]["options"].get("inline_a")))
PY
)
# shellcheck disable=SC2086
python scripts/serving_check.py --artifacts "$DIR" --reps 3 $ONLY
NVFP4_ARTIFACTS=$DIR SANITIZE_TOOLS=memcheck SANITIZE_SERVING=qwen3_30b_down_tiny.sm_90a.acc1.bf16 \
    bash scripts/sanitize_gpu.sh mixed_2.sm_90a.acc1.f16
