#!/usr/bin/env bash
# Session 35, run 2. (1) Mixtral down's prefill tiles at many rows per expert
# (experiments/mixtral_down_large_ab.yaml). (2) An A/A of bench_models --compare (main's build
# against a byte-identical copy of it) on every model layer: the A/B tool's noise floor and any
# order bias.
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=${OUT:-.}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $card"; date -u; git log --oneline -1
t0=$SECONDS
timeout 100 python experiments/decode_ab.py --artifacts .artifacts_mdl --topk 2 --reps 20 \
    --tokens 1024 2048 4096 8192 16384 > "$O/mdl2.log" 2>&1; echo "mdl top-2 rc=$?"
timeout 60 python experiments/decode_ab.py --artifacts .artifacts_mdl --topk 8 --reps 20 \
    --tokens 256 512 1024 4096 > "$O/mdl8.log" 2>&1; echo "mdl top-8 rc=$? took $((SECONDS - t0)) s"
cat "$O/mdl2.log" "$O/mdl8.log" | grep -v "^\s*$" | tail -14
t0=$SECONDS
timeout 330 python bench/bench_models.py --artifacts artifacts --compare .artifacts_copy \
    --reps 20 --tokens 64 512 4096 --json "$O/aa.json" > "$O/aa.log" 2>&1
echo "aa rc=$? took $((SECONDS - t0)) s"; grep -E "FAILED|decode-sized" "$O/aa.log" | tail -3
