#!/usr/bin/env bash
# Session 35, run 2: an A/A of bench_models --compare (main's build against a byte-identical
# copy of it) on every model layer: the noise floor and any order bias of the A/B tool.
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=${OUT:-.}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $card"; date -u; git log --oneline -1
t0=$SECONDS
timeout 400 python bench/bench_models.py --artifacts artifacts --compare .artifacts_copy \
    --reps 20 --tokens 64 512 4096 --json "$O/aa.json" > "$O/aa.log" 2>&1
echo "aa rc=$? took $((SECONDS - t0)) s"; grep -E "FAILED|decode-sized" "$O/aa.log" | tail -3
