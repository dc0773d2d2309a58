#!/usr/bin/env bash
# Session 35 device run. On an H200: the owed A/B of main (8-byte weight loads) against cd1a544.
# On any card: wip-noboost (W_SCALE_EXP 0) through the GPU suite, then A/B against main.
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=${OUT:-.}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $card"; date -u; git log --oneline -1
ab() {  # ab NAME OURS BEFORE LIMIT TOKENS...
    local name=$1 ours=$2 before=$3 lim=$4; shift 4; local t0=$SECONDS
    timeout "$lim" python bench/bench_models.py --artifacts "$ours" --compare "$before" \
        --reps 20 --tokens "$@" --json "$O/$name.json" > "$O/$name.log" 2>&1
    echo "$name rc=$? took $((SECONDS - t0)) s"
}
suite() {  # suite NAME (runs on ./artifacts)
    local t0=$SECONDS
    timeout 200 python -m pytest -q -m gpu tests -p no:cacheprovider > "$O/$1.log" 2>&1
    echo "$1 rc=$? took $((SECONDS - t0)) s: $(tail -1 "$O/$1.log")"
}
suite pytest_main
if [[ $card == *H200* ]]; then ab ab_main_h200 artifacts .artifacts_before 200 64 512 4096; fi
mv artifacts .artifacts_main && mv .artifacts_noboost artifacts
suite pytest_noboost
if [[ $card == *H200* ]]; then ab ab_noboost artifacts .artifacts_main 150 64 512
else ab ab_noboost artifacts .artifacts_main 260 64 128 512 4096; fi
mv artifacts .artifacts_noboost && mv .artifacts_main artifacts
for f in "$O"/ab_*.log; do echo "== $f"; grep -E "FAILED|decode" "$f" | tail -4; done
