#!/usr/bin/env bash
# Session 35, run 4: cold start at 350 set entries, then the model benchmark's standing on this
# tree (every layer at 64 / 512 / 4096 tokens x 8, no A/B).
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=${OUT:-.}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $card"; date -u
timeout 40 python bench/cold_start.py --artifacts artifacts --runs 3 --json "$O/cold.json" > "$O/cold.log" 2>&1
echo "cold rc=$?"; tail -4 "$O/cold.log"
t0=$SECONDS
timeout 200 python bench/bench_models.py --artifacts artifacts --reps 20 --tokens 64 512 4096 \
    --json "$O/standing.json" > "$O/standing.log" 2>&1
echo "standing rc=$? took $((SECONDS - t0)) s"; grep -E "FAILED|decode-sized" "$O/standing.log" | tail -3
