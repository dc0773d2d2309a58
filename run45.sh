#!/usr/bin/env bash
# Session 39, run 1 (an H200 only): (1) the issue 27 standing at HEAD (bench_models --tokens 64
# 128 256 512); (2) the owed A/B of the 8-byte weight loads: HEAD against cd1a544
# (.artifacts_before) at 64 / 512 / 4096 x 8; (3) diagnostic builds of the long-K decode step; the GPU test suite; (4) no scale boost (0a3936c's kernels,
# .artifacts_noboost) against HEAD at 64 / 512 x 8, as time allows; (5) cold start, 5 processes.
# Each step is cut to the time left.
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=${OUT:-.}; B=${BUDGET:-570}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $card"; date -u
H100=""; if [[ "$card" != *H200* ]]; then
    [ -z "${ANY_CARD:-}" ] && { echo "not an H200: stop"; exit 3; }
    H100=1; echo "not an H200: the diagnostic builds and the GPU suite only"
fi
python -m compileall -q runtime
step() {  # name limit args...: run bench_models within min(limit, time left)
    local name=$1 lim=$2; shift 2
    local left=$(( B - SECONDS - 40 )); [ $left -lt $lim ] && lim=$left
    if [ $lim -lt 45 ]; then echo "$name skipped: $left s left"; return; fi
    local t0=$SECONDS
    timeout $lim python bench/bench_models.py --artifacts artifacts --reps 20 --json "$O/$name.json" "$@" \
        > "$O/$name.log" 2>&1
    echo "$name rc=$? took $((SECONDS - t0)) s; DIFFERS: $(grep -c DIFFERS "$O/$name.log")"
    grep -E "decode-sized|MISMATCH|geomean|^ours/before" "$O/$name.log" | tail -6
}
[ -z "$H100" ] && step standing 160 --tokens 64 128 256 512
[ -z "$H100" ] && step ab_before 230 --compare .artifacts_before --tokens 64 512 4096
# What the long-K decode step spends (experiments/diag_decode_long.yaml): the shipped tiny tier
# of DeepSeek-V3 E256 gate-up and four diagnostic builds of it. (a) L2-warm (--copies 1): 2
# experts' weights (33 MB) at 16 and 32 rows, so 32 / 64 SMs each run one or two 112-step tiles
# from L2 and the time is the per-SM step rate, on any Hopper; 0x0 is the no-tile call.
# (b) bench_models' 64 x 8 routing from DRAM (the real call).
diag() {  # variant mode
    local v=$1 mode=$2 d=.artifacts_dg_$1; [ $v = base ] && d=artifacts
    [ $(( B - SECONDS )) -lt 100 ] && { echo "diag $v $mode skipped"; return; }
    if [ $mode = l2 ]; then
        timeout 40 python experiments/decode_bound.py --artifacts $d --only dsv3_gateup_e256_tiny \
            --copies 1 --hit 0x0 2x16 2x32 --hit-only --reps 30 > "$O/diag_${v}_$mode.log" 2>&1
    else
        timeout 40 python experiments/decode_bound.py --artifacts $d --only dsv3_gateup_e256_tiny \
            --route 64 --hit-only --reps 20 > "$O/diag_${v}_$mode.log" 2>&1
    fi
    echo "diag $v $mode rc=$?: $(grep -E ' us ' "$O/diag_${v}_$mode.log" | tail -3 | awk '{print $2, $3}' | tr '\n' ' ')"
}
for v in base noconv nomma nohmul wait0; do diag $v l2; done
for v in base noconv nomma nohmul wait0; do diag $v dram; done
left=$(( B - SECONDS - 40 )); lim=$(( left < 150 ? left : 150 ))
if [ $lim -ge 60 ]; then
    t0=$SECONDS; timeout $lim python -m pytest -q -rs -m gpu tests > "$O/pytest.log" 2>&1
    echo "pytest rc=$? took $((SECONDS - t0)) s: $(tail -1 "$O/pytest.log")"
fi
[ -z "$H100" ] && step ab_noboost 130 --compare .artifacts_noboost --tokens 64 512
if [ $(( B - SECONDS )) -gt 40 ]; then
    timeout 35 python bench/cold_start.py --artifacts artifacts --runs 5 > "$O/cold.log" 2>&1
    echo "cold rc=$?: $(tail -4 "$O/cold.log" | tr -s ' ' | tr '\n' '|')"
fi
date -u
