#!/usr/bin/env bash
# Every GPU check of jaxinfer in one call (see /work/shared/GPU.md and bench/results/README.md).
#
# Run from anywhere; it cd's to the repository root and uses PYTHONPATH (no pip install):
#   OUT=/some/dir bash bench/gpu_suite.sh                 # on the GPU machine ($OUT is set there)
#   JAXINFER_SUITE_SMOKE=1 OUT=/tmp/s bash bench/gpu_suite.sh   # CPU smoke check: tiny shapes, tiny model
#
# Python 3.11 + jax 0.10.2 (the project's .venv) and Python 3.12 + jax 0.11.2 (the GPU machine's image: cuda13
# plugin, torch 2.11) and 0.12 all run it; no stage imports torch or transformers (only `jaxinfer-bench compare`,
# which the suite does not run, does).
#
# Stages, in this order; each under `timeout`, a failure is recorded and the next stage runs; a stage whose time
# no longer fits in the overall budget (JAXINFER_SUITE_BUDGET_S, default 540 s) is skipped:
#   0. gpu_compile   `jaxinfer-bench gpu-compile --targets h200 --quick --layers 1`: the attention and matmul
#                    Pallas kernels, one-layer engine steps and a Mosaic GPU kernel compiled deviceless for sm_90
#                    (CPU as jax's platform, ptxas's register / spill report), as on a machine without a GPU;
#                    verdicts ok / refused / failed / spills / over-limit. Without jax's CUDA plugin or ptxas it
#                    exits 2 (recorded as failed) and the suite goes on
#   1. ceilings      machine info, device-to-device copy GB/s, bf16 matmul TFLOP/s
#   2. kernel_check  ragged paged attention vs its reference on the device, odd shapes/knobs (not timed)
#   3. kernel_sweep  `jaxinfer-bench kernels`: correctness, then kernel vs XLA time, % of bandwidth
#   4. latency_big_pallas  end-to-end decode TPOT at batch 1 and 16 next to its floor (7B shapes, Pallas)
#   5. startup       `jaxinfer-bench startup` on 7B shapes: cold and warm-cache start, first generate vs the
#                    last, compilations after start (target: warm start <= 60 s, 0 compilations)
#   6. tp            `jaxinfer-bench tp`: all-reduces per decode step from the compiled HLO (TP 1 / 2 / 4)
#   7. moe           `jaxinfer-bench moe`: MoE decode against its dense twin, batch 1 to 32
#   8. quant         `jaxinfer-bench quant`: fp8 / fp8_w8a16 / int8 / fp8 KV vs bf16 at 7B shapes, batch-1 and
#                    batch-64 decode and a 512-token prefill (targets: fp8 decode >= 1.5x, prefill >= 1.3x,
#                    int8 decode >= 1.4x)
#   9. latency_big_xla, latency_small: the same decode with the XLA backend, and on a 0.5B model
#  10. spec          `jaxinfer-bench spec` on the embedded models (float32, batch 1 and 16): speculation's
#                    speedup, acceptance and greedy identity
#  11. phase1        `jaxinfer-bench phase1 --quick` with what is left of the budget (rows that do not fit
#                    say "skipped" / "timed out")
#  12. summary       summary.json (embedding the JSON of stages 0, 5-8, 10, 11) and the compact table printed
#                    last (gpu_compile: the count of each verdict per target)
# On the device machine, one call: `OUT=$OUT bash bench/gpu_suite.sh` with a timeout_s of about 590.
# $OUT receives at most 8 files (the device tool's limit): suite.log, summary.json, ceilings.json,
# kernels_check.json, kernels.json and three latency_*.json (the others, gpu_compile.json included, stay in the
# scratch folder and are embedded in summary.json).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export PYTHONWARNINGS="ignore:The Pallas Triton backend is deprecated"  # jax >= 0.11, on every lowering
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/jaxinfer_suite_out}
SMOKE=${JAXINFER_SUITE_SMOKE:-0}
BUDGET=${JAXINFER_SUITE_BUDGET_S:-$([ "$SMOKE" = 1 ] && echo 1200 || echo 540)}
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
  STARTUP_ARGS=(--model "$MODEL_DIR" --configs plain --batch-sizes 1 --calls 2 --output-len 4 --max-num-seqs 4
                --max-num-batched-tokens 64)
  TP_ARGS=(--model random:llama-150m --dtype float32 --tp-sizes 1 2)
  MOE_ARGS=(--batch-sizes 1 --steps 1 --context 8)
  PHASE1_ARGS=(--tiny --only tensor_parallel moe)
  QUANT_ARGS=(--quick --model "$MODEL_DIR" --agreement-model "$MODEL_DIR" --big-batch 4 --prefill-len 32 --steps 2
              --agreement-tokens 8 --no-llamacpp)
  LIMITS=(gpu_compile=150 ceilings=60 kernel_check=120 kernel_sweep=150 latency_big_pallas=150 latency_big_xla=90
          latency_small=90 startup=150 tp=90 moe=90 quant=240 spec=240 phase1=180)
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
  # the engine's default limits on 7B shapes would plan 29 executables of 32 unrolled layers: a smaller plan
  STARTUP_ARGS=(--model random:llama-2-7b --configs plain --batch-sizes 1 16 --calls 3 --output-len 32
                --max-num-seqs 16 --max-num-batched-tokens 512)
  TP_ARGS=(--model random:qwen2.5-7b --tp-sizes 1 2 4)
  MOE_ARGS=(--batch-sizes 1 4 32 --steps 8 --dtype bfloat16)
  PHASE1_ARGS=(--quick)
  QUANT_ARGS=(--model llama-2-7b --dtype bfloat16 --methods fp8 fp8_w8a16 int8 kv_fp8 --big-batch 64
              --prefill-len 512 --steps 5 --agreement-tokens 32)
  # gpu_compile: 11 compiles, 48 s in smoke mode on 2 busy cores (21 s of CPU); it takes its seconds from the
  # stages at the end (spec, phase1), which get what is left of the budget
  LIMITS=(gpu_compile=60 ceilings=45 kernel_check=60 kernel_sweep=110 latency_big_pallas=100 startup=150 tp=40 moe=50 quant=150
          latency_big_xla=70 latency_small=60 spec=100 phase1=200)
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

# deviceless compile check (bench/gpu_compile): CPU as jax's platform, ptxas for sm_90, in a child process
run_stage gpu_compile "$PY" -m bench.cli gpu-compile --targets h200 --quick --layers 1 \
  --groups attention matmul engine mosaic --output "$WORK/gpu_compile.json"
run_stage ceilings "$PY" -m bench.gpu_suite ceilings "${CEIL_ARGS[@]}" --output "$OUT/ceilings.json"
run_stage kernel_check "$PY" -m bench.cli kernels "${CHECK_ARGS[@]}" --strict --output "$OUT/kernels_check.json"
run_stage kernel_sweep "$PY" -m bench.cli kernels "${SWEEP_ARGS[@]}" --output "$OUT/kernels.json"
run_stage latency_big_pallas "$PY" -m bench.cli latency "${LAT_BIG[@]}" "${LAT_COMMON[@]}" \
  --attention-backend pallas --output "$OUT/latency_${LAT_BIG_NAME}_pallas.json"
run_stage startup "$PY" -m bench.cli startup "${STARTUP_ARGS[@]}" --output "$WORK/startup.json"
run_stage tp "$PY" -m bench.cli tp "${TP_ARGS[@]}" --output "$WORK/tp.json"
run_stage moe "$PY" -m bench.cli moe "${MOE_ARGS[@]}" --output "$WORK/moe.json"
run_stage quant "$PY" -m bench.cli quant "${QUANT_ARGS[@]}" --output "$WORK/quant.json"
run_stage latency_big_xla "$PY" -m bench.cli latency "${LAT_BIG[@]}" "${LAT_COMMON[@]}" \
  --attention-backend xla --output "$OUT/latency_${LAT_BIG_NAME}_xla.json"
run_stage latency_small "$PY" -m bench.cli latency "${LAT_SMALL[@]}" "${LAT_COMMON[@]}" \
  --attention-backend pallas --output "$OUT/latency_${LAT_SMALL_NAME}_pallas.json"
run_stage spec "$PY" -m bench.cli spec --dtype float32 "${SPEC_ARGS[@]}" --output "$WORK/spec.json"
# phase1 gets what is left (minus the summary's reserve); its JSON is rewritten after every row
run_stage phase1 "$PY" -m bench.cli phase1 "${PHASE1_ARGS[@]}" --time-budget-s @BUDGET@ \
  --results-dir "$WORK/phase1" --output "$WORK/phase1.json"

echo "=== summary (t=$(( $(date +%s) - START ))s)" | tee -a "$LOG"
timeout 60 "$PY" -m bench.gpu_suite summary --out-dir "$OUT" --stages "$STAGES" --spec "$WORK/spec.json" \
  --gpu-compile "$WORK/gpu_compile.json" --quant "$WORK/quant.json" --embed startup="$WORK/startup.json" tp="$WORK/tp.json" moe="$WORK/moe.json" phase1="$WORK/phase1.json" 2>&1 \
  | tee -a "$LOG"
echo "total $(( $(date +%s) - START ))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
rm -rf "$WORK"
