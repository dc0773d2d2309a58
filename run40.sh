#!/usr/bin/env bash
# Session 37, run 2: cold start A/B of the parameter memo (runtime/manifest.py at HEAD) against
# Not run (refused: too little device time). It needs 0408287:runtime/manifest.py beside it as run40_old_manifest.py.
# its parent's parser, alternated in one lease, 3 fresh processes each, 350 set entries.
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=${OUT:-.}
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; date -u; echo "tree: HEAD (memo, linear _unique) vs 0408287 (old)"
cp runtime/manifest.py /tmp/memo.py; cp run40_old_manifest.py /tmp/old.py
timeout 30 python bench/cold_start.py --artifacts artifacts --runs 1 > "$O/cold_warmup.log" 2>&1
echo "warm-up rc=$? (file cache; discarded)"
i=0
for v in memo old memo old; do
    i=$((i + 1)); cp /tmp/$v.py runtime/manifest.py
    timeout 45 python bench/cold_start.py --artifacts artifacts --runs 3 > "$O/cold_${i}_$v.log" 2>&1
    echo "$v rc=$? (b) (c) (a+b+c) median/min: $(grep -E '^\(b\)|^\(c\) first|^\(a\) \+' "$O/cold_${i}_$v.log" | awk '{print $(NF-1) "/" $NF}' | tr '\n' ' ')"
done
cp /tmp/memo.py runtime/manifest.py
