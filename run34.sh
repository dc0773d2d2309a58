#!/usr/bin/env bash
# Session 34 device run: exactness of the 8-byte weight loads (GPU suite), then the A/B against
# main's build on every decode-sized model case.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
date -u; git log --oneline -1
t0=$SECONDS
timeout 240 python -m pytest -q -x -m gpu tests -p no:cacheprovider 2>&1 | tail -4
echo "pytest took $((SECONDS - t0)) s"
t0=$SECONDS
timeout ${AB_LIMIT:-330} python bench/bench_models.py --artifacts artifacts --compare .artifacts_before \
    --reps 20 --tokens ${AB_TOKENS:-64 128 256 512 4096} --json "${OUT:-.}/ab.json" 2>&1 | tail -${AB_TAIL:-90}
echo "bench took $((SECONDS - t0)) s"
