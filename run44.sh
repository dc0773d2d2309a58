#!/usr/bin/env bash
# Session 38, run 4 (run43.sh cut to a smaller budget: A/Bs at 64 and 512 x 8 only) (an H200 only): (1) the issue 27 standing at HEAD (bench_models --tokens 64 128
# 256 512); (2) the owed A/B of the 8-byte weight loads: HEAD against cd1a544 (.artifacts_before)
# at 64 / 512 / 4096 x 8; (3) no scale boost (W_SCALE_EXP 0, HEAD + 2 lines, .artifacts_noboost)
# against HEAD, as time allows; (4) cold start, 5 processes. Each step is cut to the time left.
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=${OUT:-.}; B=${BUDGET:-560}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $card"; date -u
echo "run on this card anyway"  # the second call lifted the H200 guard (an H100 came)
python -m compileall -q runtime
step() {  # name limit args...: run bench_models within min(limit, time left)
    local name=$1 lim=$2; shift 2
    local left=$(( B - SECONDS - 40 )); [ $left -lt $lim ] && lim=$left
    if [ $lim -lt 45 ]; then echo "$name skipped: $left s left"; return; fi
    local t0=$SECONDS
    timeout $lim python bench/bench_models.py --artifacts artifacts --reps 20 --json "$O/$name.json" "$@" \
        > "$O/$name.log" 2>&1
    echo "$name rc=$? took $((SECONDS - t0)) s; DIFFERS: $(grep -c DIFFERS "$O/$name.log")"
    grep -E "decode-sized|MISMATCH" "$O/$name.log" | tail -3
}
step standing 160 --tokens 64 128 256 512
# step ab_before: dropped in the second call (no H200)
step ab_noboost 200 --compare .artifacts_noboost --tokens 64 512
if [ $(( B - SECONDS )) -gt 40 ]; then
    timeout 35 python bench/cold_start.py --artifacts artifacts --runs 5 > "$O/cold.log" 2>&1
    echo "cold rc=$?: $(grep -E '^\((a|b|c)\)|^\(a\) \+' "$O/cold.log" | tr -s ' ' | tr '\n' '|')"
fi
python - "$O" <<'PY'
import json, math, sys
for side in ("before", "noboost"):
    try:
        rows = json.load(open(f"{sys.argv[1]}/ab_{side}.json"))["rows"]
    except Exception as e:
        print(side, "no json:", e); continue
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
                            r["before_us"], r["check"], r.get("before_same", True)))
    for name, L in parts.items():
        if not L:
            continue
        g = math.exp(sum(math.log(x[0]) for x in L) / len(L))
        print(f"HEAD vs {side} {name}: {len(L)} calls, HEAD/{side} geomean {g:.3f} (min "
              f"{min(L)[0]:.3f}, max {max(L)[0]:.3f}); same {sum(bool(x[6]) for x in L)}/{len(L)}; "
              f"checks {sorted(set(x[5] for x in L))}")
        for x in sorted(L)[:3] + sorted(L)[-3:]:
            print("   %.3f %s T=%d HEAD %.1f %s %.1f" % (*x[:4], side, x[4]))
PY
