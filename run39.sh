#!/usr/bin/env bash
# Session 36 (run in session 37), run 1: cold start at 350 set entries; on an H200 also the owed A/Bs through
# scaled_grouped_mm at 64 / 512 / 4096 tokens x 8, every layer: main (7fa5b54) against cd1a544
# (before the 8-byte weight loads, .artifacts_before) and against wip-noboost on main
# (.artifacts_noboost). On an H100 both were run in sessions 34-35, so only cold start.
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=${OUT:-.}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $card"; date -u
timeout 40 python bench/cold_start.py --artifacts artifacts --runs 3 --json "$O/cold.json" > "$O/cold.log" 2>&1
echo "cold rc=$?"; tail -3 "$O/cold.log"
case "$card" in *H200*) ;; *) echo "not an H200: A/Bs skipped"; exit 0;; esac
for side in before noboost; do
    t0=$SECONDS
    if [ $side = before ]; then lim=300; toks="64 512 4096"; else lim=170; toks="64 512"; fi
    left=$(( ${BUDGET:-600} - SECONDS - 20 )); [ $left -lt $lim ] && lim=$left
    [ $lim -lt 60 ] && { echo "ab $side skipped: $left s left"; continue; }
    timeout $lim python bench/bench_models.py --artifacts artifacts --compare .artifacts_$side \
        --reps 20 --tokens $toks --json "$O/ab_$side.json" > "$O/ab_$side.log" 2>&1
    echo "ab $side rc=$? took $((SECONDS - t0)) s; $(grep -E 'decode-sized' "$O/ab_$side.log" | tail -1)"
    grep -c DIFF "$O/ab_$side.log"
done
python - "$O" <<'PY'
import json, math, sys
for side in ("before", "noboost"):
    try:
        rows = json.load(open(f"{sys.argv[1]}/ab_{side}.json"))["rows"]
    except Exception as e:
        print(side, "no json", e); continue
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
        print(f"main vs {side} {name}: {len(L)} calls, main/{side} geomean {g:.3f} "
              f"(min {min(L)[0]:.3f}, max {max(L)[0]:.3f}); same {sum(bool(x[6]) for x in L)}"
              f"/{len(L)}; checks {sorted(set(x[5] for x in L))}")
        for x in sorted(L)[:3] + sorted(L)[-3:]:
            print("   %.3f %s T=%d main %.1f %s %.1f" % (x[0], x[1], x[2], x[3], side, x[4]))
PY
