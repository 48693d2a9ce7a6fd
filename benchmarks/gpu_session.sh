#!/usr/bin/env bash
# Issue 45's GPU session in one command: the profiles and the targets' rows, all in one tar.
#
# On the lent H200 / H100 (the device tool; one call, timeout_s 600, carry [".gpu_wheels"] built
# here first by `bash benchmarks/gpu_bundle.sh`):
#   bash benchmarks/gpu_session.sh
# writes $OUT/gpu_session.tar.gz (logs, JSON results, breakdowns, the step's optimized HLO) and
# $OUT/gpu_session_traces.tar.gz (the perfetto traces, when under the tool's 16 MiB per file).
# Phases, in priority order, each skipped when its estimate no longer fits the budget
# (GPU_SESSION_BUDGET seconds, default 540: the command's 600 s less the wheels and the tar),
# each under `timeout` so one stuck phase cannot take the rest; the tars are rewritten after
# every phase, so what finished comes back even if the command is killed:
#   1 profile_small      benchmarks/profile_step.py, ELECTRA-small bf16, batch 128, 10 steps
#   2 profile_base       the same for ELECTRA-base, 5 steps
#   3 base_options       gpu_step.py electra_tf_jax base bf16 batch 128, the matmul peak (MFU),
#                        --model-variants noattndrop,noattndrop+fused+pad128 (the options' gain,
#                        both rows at attention dropout 0, which fused attention needs)
#   4 trainer_small_128  gpu_step.py electra_tf_jax_trainer (run_pretraining.py --backend jax's
#                        trainer) small bf16 batch 128, 16 steps per call (target >= 12,000 seq/s)
#   5 trainer_small_512  the same at batch 512 (target >= 20,000 seq/s)
#   6 trainer_small_options  the trainer rows of 4 with --model-variants
#                        noattndrop,noattndrop+fused+pad128 (the hparams attention dropout 0,
#                        fused_attention and vocab_padding_multiple 128, as a user sets them)
#   7 profile_base_options  the base profile with noattndrop+fused+pad128
#   8 base_xla_flags     phase 3's noattndrop row again under XLA_FLAGS=$GPU_XLA_FLAGS (XLA's
#                        GPU scheduling: the latency-hiding scheduler, command buffers, no Triton
#                        GEMMs): the A/B against phase 3, each flag set a process of its own
#
#   bash benchmarks/gpu_session.sh --dry-run   # CPU: the same phases on gpu_step.py's --tiny
#                                              # model, batch 8, a few steps (tests/scripts)
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_host.sh

DRY_RUN=0
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
OUT=${OUT:-$(mktemp -d)}
WORK=$(mktemp -d)/gpu_session
mkdir -p "$WORK" "$OUT"
OUT=$(cd "$OUT" && pwd)
trap 'rm -rf "$(dirname "$WORK")"' EXIT
START=$(date +%s)
BUDGET=${GPU_SESSION_BUDGET:-540}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 HF_HUB_OFFLINE=1

if [ "$DRY_RUN" = 1 ]; then
  PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
  SIZE_SMALL=(--tiny) SIZE_BASE=(--tiny) BATCH=8 BATCH_BIG=16 DEVICE=(--device cpu)
  SMALL_STEPS=(--steps 2) BASE_STEPS=(--steps 2)
  STEP_ARGS=(--steps 2 --windows 1 --warmup 0 --min-window 0) SPE=2
else
  PYTHON=${PYTHON:-python3}
  SIZE_SMALL=(--size small) SIZE_BASE=(--size base) BATCH=128 BATCH_BIG=512 DEVICE=()
  SMALL_STEPS=(--steps 10) BASE_STEPS=(--steps 5) STEP_ARGS=() SPE=16
  install_gpu_wheels
fi

elapsed() { echo $(( $(date +%s) - START )); }

pack() {  # the results tar (no traces) and the traces tar, each under the 16 MiB a file
  tar -C "$(dirname "$WORK")" --exclude='*/trace' -czf "$OUT/gpu_session.tar.gz" gpu_session
  (cd "$(dirname "$WORK")" && find gpu_session -name perfetto_trace.json.gz -print0 \
    | tar --null -T - -czf "$OUT/gpu_session_traces.tar.gz" 2>/dev/null)
  if [ "$(stat -c %s "$OUT/gpu_session_traces.tar.gz" 2>/dev/null || echo 0)" -gt 16000000 ]; then
    rm -f "$OUT/gpu_session_traces.tar.gz"
    echo "traces over 16 MB: not returned" >> "$WORK/session.log"
  fi
}

# phase NAME ESTIMATE_SECONDS COMMAND...: runs when the estimate fits what is left of the budget.
phase() {
  local name=$1 estimate=$2; shift 2
  local left=$(( BUDGET - $(elapsed) ))
  if [ "$DRY_RUN" = 0 ] && [ "$left" -lt "$estimate" ]; then
    echo "$name: skipped ($left s left, needs ~$estimate s)" | tee -a "$WORK/session.log"
    return
  fi
  echo "$name: start at $(elapsed) s" | tee -a "$WORK/session.log"
  [ "$DRY_RUN" = 1 ] && left=900  # CPU: no budget, a generous cap
  timeout "$(( left > 30 ? left : 30 ))" "$@" > "$WORK/$name.log" 2>&1
  echo "$name: exit $? at $(elapsed) s" | tee -a "$WORK/session.log"
  tail -n 30 "$WORK/$name.log"
  pack
}

machine_record > "$WORK/info.txt" 2>&1
cat "$WORK/info.txt"

PROFILE=("$PYTHON" benchmarks/profile_step.py --dtype bfloat16 --batch "$BATCH" "${DEVICE[@]}")
STEP=("$PYTHON" benchmarks/gpu_step.py --dtype bfloat16 --batch "$BATCH" "${DEVICE[@]}"
      "${STEP_ARGS[@]}")

phase profile_small 70 "${PROFILE[@]}" "${SIZE_SMALL[@]}" "${SMALL_STEPS[@]}" \
  --out-dir "$WORK/profile_small"
phase profile_base 130 "${PROFILE[@]}" "${SIZE_BASE[@]}" "${BASE_STEPS[@]}" \
  --out-dir "$WORK/profile_base"
phase base_options 200 "${STEP[@]}" --impl electra_tf_jax "${SIZE_BASE[@]}" \
  --model-variants noattndrop,noattndrop+fused+pad128 --budget 400 \
  --out "$WORK/base_options.json"
phase trainer_small_128 80 "${STEP[@]}" --impl electra_tf_jax_trainer "${SIZE_SMALL[@]}" \
  --no-peak --steps-per-execution "$SPE" --out "$WORK/trainer_small_128.json"
phase trainer_small_512 90 "${STEP[@]}" --impl electra_tf_jax_trainer "${SIZE_SMALL[@]}" \
  --no-peak --steps-per-execution "$SPE" --batch "$BATCH_BIG" \
  --out "$WORK/trainer_small_512.json"
phase trainer_small_options 130 "${STEP[@]}" --impl electra_tf_jax_trainer "${SIZE_SMALL[@]}" \
  --no-peak --steps-per-execution "$SPE" --model-variants noattndrop,noattndrop+fused+pad128 \
  --out "$WORK/trainer_small_options.json"
phase profile_base_options 130 "${PROFILE[@]}" "${SIZE_BASE[@]}" "${BASE_STEPS[@]}" \
  --model-variant noattndrop+fused+pad128 --out-dir "$WORK/profile_base_options"

# XLA reads XLA_FLAGS once per process: the B row is a child of its own (gpu_step.py spawns one
# per row, which inherits it); the CPU dry run checks that XLA accepts the flags.
GPU_XLA_FLAGS=${GPU_XLA_FLAGS:-"--xla_gpu_enable_latency_hiding_scheduler=true \
--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUDNN,CUSTOM_CALL --xla_gpu_enable_triton_gemm=false"}
echo "base_xla_flags: XLA_FLAGS=$GPU_XLA_FLAGS" >> "$WORK/session.log"
phase base_xla_flags 120 env XLA_FLAGS="$GPU_XLA_FLAGS" "${STEP[@]}" --impl electra_tf_jax \
  "${SIZE_BASE[@]}" --model-variants noattndrop --no-peak --out "$WORK/base_xla_flags.json"

echo "done at $(elapsed) s" | tee -a "$WORK/session.log"
pack
ls -l "$OUT"
