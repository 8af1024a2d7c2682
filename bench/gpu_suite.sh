#!/usr/bin/env bash
# Every GPU check of jaxinfer in one call (see /work/shared/GPU.md and bench/results/README.md).
#
# Run from anywhere; it cd's to the repository root and uses PYTHONPATH (no pip install):
#   OUT=/some/dir bash bench/gpu_suite.sh                 # on the GPU machine ($OUT is set there)
#   JAXINFER_SUITE_SMOKE=1 OUT=/tmp/s bash bench/gpu_suite.sh   # CPU smoke check: tiny shapes, tiny model
#
# Stages, in priority order; each under `timeout`, a failure is recorded and the next stage runs; a stage
# whose time no longer fits in the overall budget (JAXINFER_SUITE_BUDGET_S, default 420 s) is skipped:
#   1. ceilings      machine info, device-to-device copy GB/s, bf16 matmul TFLOP/s
#   2. kernel_check  ragged paged attention vs its reference on the device, odd shapes/knobs (not timed)
#   3. kernel_sweep  `jaxinfer-bench kernels`: correctness, then kernel vs XLA time, % of bandwidth
#   4. latency_*     end-to-end decode TPOT at batch 1 and 16 next to its floor (pallas, then xla, then 0.5B)
#   5. spec          `jaxinfer-bench spec` on the embedded models (float32, batch 1 and 16): speculation's
#                    speedup, acceptance and greedy identity; its JSON is kept inside summary.json
#   6. quant         `jaxinfer-bench quant`: fp8 / fp8_w8a16 / int8 / fp8 KV vs bf16 at 7B shapes, batch-1 and
#                    batch-64 decode and a 512-token prefill (targets: fp8 decode >= 1.5x, prefill >= 1.3x,
#                    int8 decode >= 1.4x); its JSON is kept inside summary.json
#   7. summary       summary.json and the compact table printed last
# On the device machine, one call: `OUT=$OUT bash bench/gpu_suite.sh` with a timeout_s of about 540.
# $OUT receives at most 8 files (the device tool's limit): suite.log, summary.json, ceilings.json,
# kernels_check.json, kernels.json and three latency_*.json (spec.json and quant.json stay in the scratch folder).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export PYTHONWARNINGS="ignore:The Pallas Triton backend is deprecated"  # jax >= 0.11, on every lowering
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/jaxinfer_suite_out}
SMOKE=${JAXINFER_SUITE_SMOKE:-0}
BUDGET=${JAXINFER_SUITE_BUDGET_S:-$([ "$SMOKE" = 1 ] && echo 900 || echo 420)}
SUMMARY_RESERVE=25
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/jaxinfer_suite.XXXXXX)
STAGES=$WORK/stages.jsonl
LOG=$OUT/suite.log
: >"$LOG"
START=$(date +%s)

if [ "$SMOKE" = "1" ]; then
  export JAX_PLATFORMS=cpu
  MODEL_DIR=$WORK/tiny-llama
  CEIL_ARGS=(--copy-bytes $((64 << 20)) --matmul-size 512)
  CHECK_ARGS=(--cases cpu-check --timing off)
  SWEEP_ARGS=(--cases cpu --max-cases 3 --timing on --repeats 3 --warmup 1 --page-sets 2 --time-budget-s @BUDGET@)
  LAT_COMMON=(--dtype float32 --batch-sizes 1 2 --input-len 8 --output-len 8)
  LAT_BIG=(--model "$MODEL_DIR"); LAT_BIG_NAME=tiny
  LAT_SMALL=(--model "$MODEL_DIR"); LAT_SMALL_NAME=tiny_again
  SPEC_ARGS=(--batch-sizes 1 --tasks copy --passage-tokens 48 --output-len 16 --repeats 1 --warmup-passes 2)
  QUANT_ARGS=(--quick --model "$MODEL_DIR" --agreement-model "$MODEL_DIR" --big-batch 4 --prefill-len 32 --steps 2
              --agreement-tokens 8 --no-llamacpp)
  LIMITS=(ceilings=60 kernel_check=120 kernel_sweep=150 latency_big_pallas=150 latency_big_xla=90 latency_small=90
          spec=240 quant=240)
else
  CEIL_ARGS=(--copy-bytes $((4 << 30)) --matmul-size 8192)
  CHECK_ARGS=(--cases gpu-check --timing off)
  SWEEP_ARGS=(--cases gpu --time-budget-s @BUDGET@)
  # 64+64 tokens: every decode step of the warm-up and the measurement uses one block-table bucket (8 pages),
  # so each batch size compiles 2 step shapes (prefill, decode) of the unrolled 32-layer model, not 3.
  LAT_COMMON=(--dtype bfloat16 --batch-sizes 1 16 --input-len 64 --output-len 64)
  LAT_BIG=(--model random:llama-2-7b); LAT_BIG_NAME=llama2_7b
  LAT_SMALL=(--model random:qwen2.5-0.5b); LAT_SMALL_NAME=qwen2.5_0.5b
  SPEC_ARGS=(--batch-sizes 1 16 --repeats 3 --warmup-passes 6)
  QUANT_ARGS=(--model llama-2-7b --dtype bfloat16 --methods fp8 fp8_w8a16 int8 kv_fp8 --big-batch 64
              --prefill-len 512 --steps 5 --agreement-tokens 32)
  LIMITS=(ceilings=50 kernel_check=75 kernel_sweep=150 latency_big_pallas=120 latency_big_xla=100 latency_small=70
          spec=120 quant=180)
fi

limit_of() { local kv; for kv in "${LIMITS[@]}"; do [ "${kv%%=*}" = "$1" ] && echo "${kv#*=}"; done; }

# run_stage NAME CMD...: run under timeout (clipped to the budget left), log everything to $LOG, echo a tail.
# An argument @BUDGET@ becomes the stage's limit minus 35 s (the sweep starts no case after that).
run_stage() {
  local name=$1; shift
  local limit; limit=$(limit_of "$name")
  local left=$(( BUDGET - SUMMARY_RESERVE - ($(date +%s) - START) ))
  if [ "$left" -lt 20 ]; then
    echo "=== $name: skipped (${left}s of the budget left)" | tee -a "$LOG"
    printf '{"stage":"%s","status":"skipped","rc":-1,"seconds":0,"limit_s":%d}\n' "$name" "$limit" >>"$STAGES"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local args=() a
  for a in "$@"; do [ "$a" = "@BUDGET@" ] && a=$(( limit > 70 ? limit - 35 : limit / 2 )); args+=("$a"); done
  set -- "${args[@]}"
  echo "=== $name (limit ${limit}s, t=$(( $(date +%s) - START ))s): $*" | tee -a "$LOG"
  local t0; t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  local secs=$(( $(date +%s) - t0 ))
  local status=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status=timeout; elif [ "$rc" -ne 0 ]; then status=failed; fi
  printf '{"stage":"%s","status":"%s","rc":%d,"seconds":%d,"limit_s":%d}\n' "$name" "$status" "$rc" "$secs" "$limit" >>"$STAGES"
  echo "--- $name: $status (rc=$rc, ${secs}s); last lines:"
  tail -n 4 "$LOG"
}

{
  echo "jaxinfer GPU suite, smoke=$SMOKE, budget ${BUDGET}s, $(date -Iseconds)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  "$PY" -c 'import sys, jax; print("python", sys.version.split()[0], "jax", jax.__version__, jax.devices())'
} 2>&1 | tee -a "$LOG"

if [ "$SMOKE" = "1" ]; then
  "$PY" -m bench.gpu_suite tiny-model "$MODEL_DIR" >>"$LOG" 2>&1 || echo "tiny model: FAILED" | tee -a "$LOG"
fi

run_stage ceilings "$PY" -m bench.gpu_suite ceilings "${CEIL_ARGS[@]}" --output "$OUT/ceilings.json"
run_stage kernel_check "$PY" -m bench.cli kernels "${CHECK_ARGS[@]}" --strict --output "$OUT/kernels_check.json"
run_stage kernel_sweep "$PY" -m bench.cli kernels "${SWEEP_ARGS[@]}" --output "$OUT/kernels.json"
run_stage latency_big_pallas "$PY" -m bench.cli latency "${LAT_BIG[@]}" "${LAT_COMMON[@]}" \
  --attention-backend pallas --output "$OUT/latency_${LAT_BIG_NAME}_pallas.json"
run_stage latency_big_xla "$PY" -m bench.cli latency "${LAT_BIG[@]}" "${LAT_COMMON[@]}" \
  --attention-backend xla --output "$OUT/latency_${LAT_BIG_NAME}_xla.json"
run_stage latency_small "$PY" -m bench.cli latency "${LAT_SMALL[@]}" "${LAT_COMMON[@]}" \
  --attention-backend pallas --output "$OUT/latency_${LAT_SMALL_NAME}_pallas.json"
run_stage spec "$PY" -m bench.cli spec --dtype float32 "${SPEC_ARGS[@]}" --output "$WORK/spec.json"
run_stage quant "$PY" -m bench.cli quant "${QUANT_ARGS[@]}" --output "$WORK/quant.json"

echo "=== summary (t=$(( $(date +%s) - START ))s)" | tee -a "$LOG"
timeout 60 "$PY" -m bench.gpu_suite summary --out-dir "$OUT" --stages "$STAGES" --spec "$WORK/spec.json" \
  --quant "$WORK/quant.json" 2>&1 \
  | tee -a "$LOG"
echo "total $(( $(date +%s) - START ))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
rm -rf "$WORK"
