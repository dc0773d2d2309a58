#!/usr/bin/env bash
# Session 38, run 1: (1) cold start A/B of the parameter memo (HEAD's runtime/manifest.py against
# 0408287's, run40_old_manifest.py), alternated, 3 fresh processes each, 350 set entries; on an
# H200 also (2) the issue 27 standing at HEAD (bench_models --tokens 64 128 256 512) and (3) the
# owed A/B of the 8-byte weight loads: HEAD against cd1a544 (.artifacts_before) at 64 / 512 / 4096 x 8.
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=${OUT:-.}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $card"; date -u
python -m compileall -q runtime
cp runtime/manifest.py /tmp/memo.py; cp run40_old_manifest.py /tmp/old.py
timeout 30 python bench/cold_start.py --artifacts artifacts --runs 1 > "$O/cold_warmup.log" 2>&1
echo "warm-up rc=$? (file cache; discarded)"
i=0
for v in memo old memo old; do
    i=$((i + 1)); cp /tmp/$v.py runtime/manifest.py; python -m compileall -q runtime
    timeout 45 python bench/cold_start.py --artifacts artifacts --runs 3 > "$O/cold_${i}_$v.log" 2>&1
    echo "$v rc=$?: $(grep -E '^\((a|b|c)\)' "$O/cold_${i}_$v.log" | tr -s ' ' | tr '\n' '|')"
done
cp /tmp/memo.py runtime/manifest.py; python -m compileall -q runtime
case "$card" in *H200*) ;; *) echo "not an H200: standing and A/B skipped"; exit 0;; esac
t0=$SECONDS
timeout 200 python bench/bench_models.py --artifacts artifacts --reps 20 --tokens 64 128 256 512 \
    --json "$O/standing.json" > "$O/standing.log" 2>&1
echo "standing rc=$? took $((SECONDS - t0)) s"; grep -E "decode-sized|DIFF|FAIL" "$O/standing.log" | tail -5
t0=$SECONDS; left=$(( ${BUDGET:-560} - SECONDS - 15 )); lim=300; [ $left -lt $lim ] && lim=$left
if [ $lim -ge 60 ]; then
    timeout $lim python bench/bench_models.py --artifacts artifacts --compare .artifacts_before \
        --reps 20 --tokens 64 512 4096 --json "$O/ab_before.json" > "$O/ab_before.log" 2>&1
    echo "ab before rc=$? took $((SECONDS - t0)) s"; grep -c DIFF "$O/ab_before.log"
else echo "ab skipped: $left s left"; fi
python - "$O" <<'PY'
import json, math, sys
try:
    rows = json.load(open(f"{sys.argv[1]}/ab_before.json"))["rows"]
except Exception as e:
    print("ab: no json", e); sys.exit()
seen, parts = set(), {"decode": [], "prefill": []}
for r in rows:
    if r.get("before_us") is None:
        continue
    key = (r["kernel"], r["tokens"], r["n"], r["k"], r["experts"])
    if key in seen:
        continue
    seen.add(key)
    part = "decode" if r["rows"] / r["experts"] <= 32 else "prefill"
    parts[part].append((r["ours_us"] / r["before_us"], r["set"], r["tokens"], r["ours_us"],
                        r["before_us"], r["check"], r.get("before_same")))
for name, L in parts.items():
    if not L:
        continue
    g = math.exp(sum(math.log(x[0]) for x in L) / len(L))
    print(f"main vs before {name}: {len(L)} calls, geomean {g:.3f} (min {min(L)[0]:.3f}, max "
          f"{max(L)[0]:.3f}); same {sum(bool(x[6]) for x in L)}/{len(L)}; checks {sorted(set(x[5] for x in L))}")
    for x in sorted(L)[:3] + sorted(L)[-3:]:
        print("   %.3f %s T=%d main %.1f before %.1f" % x[:5])
PY
