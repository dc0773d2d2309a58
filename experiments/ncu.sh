#!/usr/bin/env bash
# Nsight Compute profile of our sm_90a kernel on one benchmark set (on the GPU machine):
#   bash experiments/ncu.sh [SET] [ARTIFACTS]
#   bash experiments/ncu.sh serving:LAYER [ARTIFACTS]   # a decode set through the serving call
#                                                       # (experiments/decode_bound.py --profile;
#                                                       # DECODE_ARGS="--route 64": that routing)
# Writes to $OUT (or ./ncu_out): the report, the raw metrics as CSV, the details page and the
# per-SASS-instruction source page (stall samples per instruction), then prints the lines that
# say what limits the kernel. Clocks are not locked (--clock-control none), as in bench runs.
set -u
cd "$(dirname "$0")/.."
SET=${1:-moe_gateup}
ART=${2:-artifacts}
DIR="${OUT:-ncu_out}"
mkdir -p "$DIR"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -z "$NCU" ]; then echo "ncu not found"; exit 3; fi
export PYTHONPATH=.
if [[ $SET == serving:* ]]; then
    SET=${SET#serving:}
    TARGET=(python experiments/decode_bound.py --artifacts "$ART" --only "$SET" --profile
            ${DECODE_ARGS:-})
else
    TARGET=(python experiments/profile_target.py --artifacts "$ART" --set "$SET" --iters 2)
fi
"$NCU" --clock-control none --set full --import-source no -k regex:nvfp4_gg_sm90 \
    --launch-skip 1 --launch-count 1 -f -o "$DIR/$SET" "${TARGET[@]}" >"$DIR/$SET.ncu.log" 2>&1
tail -n 3 "$DIR/$SET.ncu.log"
"$NCU" -i "$DIR/$SET.ncu-rep" --page details >"$DIR/$SET.details.txt" 2>&1
"$NCU" -i "$DIR/$SET.ncu-rep" --page raw --csv >"$DIR/$SET.raw.csv" 2>&1
"$NCU" -i "$DIR/$SET.ncu-rep" --page source --csv --print-source sass >"$DIR/$SET.sass.csv" 2>&1
grep -E "DRAM Throughput|Memory Throughput|L2 Hit Rate|Duration|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy" \
    "$DIR/$SET.details.txt" | head -n 20
