#!/usr/bin/env bash
# Session 35, run 3: Mixtral down's catch-all set on the 128 x 192 prefill tiles past 2048 rows
# (mixtral_down_prefill128 keeps 128 x 128 up to it): the GPU suite, then the A/B through
# scaled_grouped_mm against main's build (.artifacts_copy), top-2 and top-8.
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=${OUT:-.}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $card"; date -u; git log --oneline -1
t0=$SECONDS
timeout 200 python -m pytest -q -m gpu tests -p no:cacheprovider > "$O/pytest.log" 2>&1
echo "pytest rc=$? took $((SECONDS - t0)) s: $(tail -1 "$O/pytest.log")"
for k in 2 8; do
    if [ $k = 2 ]; then toks="1024 2048 4096 8192 16384"; else toks="256 512 1024 4096"; fi
    timeout 150 python bench/bench_models.py --artifacts artifacts --compare .artifacts_copy \
        --only mixtral_down --topk $k --reps 20 --tokens $toks --json "$O/mix$k.json" > "$O/mix$k.log" 2>&1
    echo "mixtral_down top-$k rc=$?"
done
python - "$O" <<'PY'
import json, sys
for k in (2, 8):
    for r in json.load(open(f"{sys.argv[1]}/mix{k}.json"))["rows"]:
        print(f"top-{k} T={r['tokens']:5d} ours {r['ours_us']:8.1f} before {r['before_us']:8.1f} "
              f"x{r['before_us'] / r['ours_us']:.3f} grouped_mm {r['grouped_mm_us']:8.1f} "
              f"({r['grouped_mm_us'] / r['ours_us']:.2f}x) {r['check']} {r['kernel'][:28]}")
PY
