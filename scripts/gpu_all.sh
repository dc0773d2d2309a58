#!/usr/bin/env bash
# Every GPU check of the project in one batch on the lent H200 (artifacts and dist/ are built
# beforehand on a CPU machine and carried). Steps run in priority order, each under its own time
# limit, so a hang costs one step; a one-line verdict per step is printed last.
#
#   bash scripts/gpu_all.sh [STEP...]      # default: all steps below
#   GPU_REQUIRE=H200 bash scripts/gpu_all.sh ...   # exit 3 at once on any other card
#
# Logs go to $OUT (the device tool's output folder) or ./gpu_logs.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
LOG="${OUT:-gpu_logs}"
mkdir -p "$LOG"
# A call for an H200 may be given an H100 (tool library, device README); H200-only figures
# (issue 27's standing, the step-rate A/Bs) must not be taken on it by mistake.
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "card: ${CARD:-none}; $(date -u)"
if [ -n "${GPU_REQUIRE:-}" ] && [[ "$CARD" != *"$GPU_REQUIRE"* ]]; then
    echo "GPU_REQUIRE=$GPU_REQUIRE but the card is ${CARD:-none}: nothing run"
    exit 3
fi
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(pytest dynamic sanitize cold host package moe_ep)
declare -A VERDICT
RAN=()  # step names in the order they ran (a step such as diag_step runs several)

step() {  # step NAME SECONDS COMMAND...
    local name=$1 secs=$2
    shift 2
    local t0=$SECONDS
    timeout "$secs" "$@" >"$LOG/$name.log" 2>&1
    local rc=$?
    RAN+=("$name")
    VERDICT[$name]="rc=$rc in $((SECONDS - t0)) s: $(tail -n 1 "$LOG/$name.log" | cut -c1-150)"
}

for s in "${STEPS[@]}"; do
    case $s in
    pytest) step pytest 200 python -m pytest -q -rs -m gpu tests ;;
    dynamic) step dynamic 90 python scripts/gpu_checks.py --artifacts artifacts --seeds 2 \
        --only mixed_any_m.sm_90a.acc1.f16 --only ep4_down.sm_90a.acc1.f16 ;;
    sanitize) step sanitize 110 bash scripts/sanitize_gpu.sh ;;
    cold) step cold 35 python bench/cold_start.py --artifacts artifacts --runs 3 \
        --json "$LOG/cold.json" ;;
    host) step host 35 python bench/host_cost.py --artifacts artifacts --json "$LOG/host.json" ;;
    package) step package 45 bash scripts/package_check_gpu.sh check ;;
    moe_ep) step moe_ep 35 python examples/moe_ep.py --artifacts artifacts --seeds 3 ;;
    # Needs the two-GPU machine (nvidia-h200-x2): two ranks over NCCL, one GPU each.
    moe_ep2) step moe_ep2 90 torchrun --standalone --nproc-per-node 2 examples/moe_ep.py \
        --artifacts artifacts --seeds 3 ;;
    bench) step bench 240 python bench/bench_grouped.py --artifacts artifacts --reps 200 \
        --json "$LOG/bench.json" ;;
    # gg.scaled_grouped_mm bit-exact on every expert layer (issue 26), 3 graph replays each.
    serving) step serving 540 python scripts/serving_check.py --artifacts artifacts --reps 3 ;;
    # The model benchmark (issues 26, 27): every declared model layer at 64..16384 tokens.
    # MODELS_ARGS: more arguments (--only SETS, --tokens, --compare DIR).
    models) step models 580 python bench/bench_models.py --artifacts artifacts --reps 50 \
        --json "$LOG/models.json" ${MODELS_ARGS:-} ;;
    # A decode step's whole expert block per model against torch bf16 / fp8 (bench_layer.py;
    # about 15 s on an H100). LAYER_ARGS: --only MODEL..., --tokens.
    layer) step layer 400 python bench/bench_layer.py --artifacts artifacts \
        --json "$LOG/layer.json" ${LAYER_ARGS:-} ;;
    # Not yet run on a GPU (sixteenth session): the masked layout (issue 27).
    masked) step masked 120 python -m pytest -q -rs tests/test_masked_gpu.py ;;
    masked_bench) step masked_bench 300 python bench/bench_masked.py --artifacts artifacts \
        --reps 50 --json "$LOG/masked.json" ;;
    # The sync-free activation quantizers (the torch path and the artifacts' AOT kernels) fed
    # to both serving layouts in a graph, Inductor compiling a step that quantizes, the AOT
    # ops; then the AOT kernels against the torch path case by case, and what quantizing costs.
    activations) step activations 180 python -m pytest -q -rs tests/test_activations_gpu.py \
        tests/test_quantize_gpu.py ;;
    act_quant) step act_quant 180 python experiments/act_quant_check.py --artifacts artifacts ;;
    # The quantizers of artifacts/ against those of QUANT_BEFORE (another build), replays
    # interleaved (bench_activations --compare): a quantizer change's A/B. QUANT_AB_ARGS: more
    # arguments (--compare-fill N: the before side's launch plan, --tokens).
    quant_ab) step quant_ab 200 python bench/bench_activations.py --artifacts artifacts \
        --compare "${QUANT_BEFORE:-.artifacts_before}" --reps 30 --json "$LOG/quant_ab.json" \
        ${QUANT_AB_ARGS:-} ;;
    # Issue 27's standing: every model layer at the decode-sized token counts, floors at the
    # read bandwidth measured in the same run (about 70 s on the H200, 2026-12-07).
    standing) step standing 560 python bench/bench_models.py --artifacts artifacts --reps 20 \
        --tokens 64 128 256 512 --json "$LOG/standing.json" ;;
    # A kernel change's A/B through scaled_grouped_mm: these artifacts against MODELS_BEFORE
    # (another build), replays interleaved; each part's geomean is printed under the table.
    # MODELS_AB_TOKENS: the token counts (64 / 512 / 4096 x 8: decode, mid and prefill tiers).
    models_ab) step models_ab 400 python bench/bench_models.py --artifacts artifacts --reps 20 \
        --compare "${MODELS_BEFORE:-.artifacts_before}" --tokens ${MODELS_AB_TOKENS:-64 512 4096} \
        --json "$LOG/models_ab.json" ;;
    activations_bench) step activations_bench 300 python bench/bench_activations.py --reps 30 \
        --compiled --artifacts artifacts --json "$LOG/activations.json" ;;
    # torch.compile default / reduce-overhead, compat, host us with new routing per call.
    extras) step extras 150 python experiments/serving_extras.py --artifacts artifacts ;;
    # Decode-tile variants A/B (build .artifacts_ab from experiments/decode_ab.yaml first, or
    # AB_DIR from another A/B spec). AB_TOKENS: the token counts.
    decode_ab) step decode_ab 400 python experiments/decode_ab.py --artifacts "${AB_DIR:-.artifacts_ab}" \
        --tokens ${AB_TOKENS:-64 256 512} ;;
    # Device-offsets kernels bit-exact at E = 8..256 (both phase-1 paths: lanes up to 32 experts,
    # the ROW_ENDS search past), bad offs, graph replays with new routings.
    offsets) step offsets 200 python experiments/offsets_quick.py --artifacts artifacts \
        --only qwen3_30b_down_decode.sm_90a.acc1.bf16 --only qwen3_30b_gateup.sm_90a.acc1.bf16 \
        --only dsv3_down_e256.sm_90a.acc1.bf16 --only dsv3_gateup_e32_decode.sm_90a.acc1.bf16 \
        --only ep_e8_down.sm_90a.acc1.f16 --only qwen3_235b_down_e16.sm_90a.acc1.bf16 \
        --only gptoss_gateup.sm_90a.acc1.bf16 --only gptoss_down.sm_90a.acc1.f16 \
        --t 64 --t 512 --t 4096 ;;
    # What the long-K decode step spends (issue 27): DeepSeek-V3 E256 gate-up's tiny tier and
    # its diagnostic builds (build each first: python experiments/diag_build.py V --spec
    # experiments/diag_decode_long.yaml --out .artifacts_dg_V, V in DIAG_VARIANTS). L2-warm
    # (--copies 1): 2 experts' weights (33 MB) at 16 / 32 rows, so 32 / 64 SMs each run one or
    # two 112-step tiles from L2 and the time is the per-SM step rate on any Hopper (0x0: the
    # call without tiles); then bench_models' 64 x 8 routing from DRAM.
    diag_step) for v in base ${DIAG_VARIANTS:-noconv nomma nohmul wait0}; do
        d=.artifacts_dg_$v; [ "$v" = base ] && d=artifacts
        step "diag_$v" 90 bash -c "python experiments/decode_bound.py --artifacts $d \
            --only dsv3_gateup_e256_tiny --copies 1 --hit 0x0 2x16 2x32 --hit-only --reps 30 &&
            python experiments/decode_bound.py --artifacts $d --only dsv3_gateup_e256_tiny \
            --route 64 --hit-only --reps 20"
    done ;;
    # What bounds decode (issue 27): fixed cost and per-tile cost of the decode kernels.
    bound) step bound 200 python experiments/decode_bound.py --artifacts artifacts --reps 30 ;;
    # Nsight Compute on two decode calls (experiments/ncu.sh writes under $LOG).
    ncu_decode) step ncu_decode 240 bash -c "for s in dsv3_down_e32_decode qwen3_30b_down_decode;
        do OUT=$LOG bash experiments/ncu.sh serving:\$s artifacts; done" ;;
    # Branch inline-no-a-workspace (3a3557d): see experiments/noa_check.sh.
    noa) step noa 300 bash experiments/noa_check.sh .artifacts_noa ;;
    *) echo "unknown step $s"; RAN+=("$s"); VERDICT[$s]="unknown step: not run" ;;
    esac
done
for s in "${RAN[@]}"; do
    echo "== $s: ${VERDICT[$s]}"
done
