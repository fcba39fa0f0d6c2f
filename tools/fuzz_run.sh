#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build for SECONDS each on the corpus in fuzz/corpus/<name>
# (read only: new inputs go to a scratch directory), or for FUZZ_RUNS inputs when that is set
# (whichever ends first), and prints one summary line per target:
# executions, coverage, and crashes (a crash fails the script and leaves its input in $OUT_DIR).
#   tools/fuzz_run.sh BUILD_DIR SECONDS [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:?usage: fuzz_run.sh BUILD_DIR SECONDS [TARGET...]}
SECONDS_EACH=${2:?seconds per target}
shift 2
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(fuzz_http fuzz_openai_json fuzz_tokenizer fuzz_chat_template fuzz_checkpoint
           fuzz_output_parsers fuzz_json_grammar)
fi
OUT_DIR=${FUZZ_OUT:-$BUILD/fuzz-out}
# One OpenMP thread: a target runs one input at a time, and the API harnesses' start-up (the
# embedded model and the tokenizer, instrumented) took 6-12 s with two threads on a 2-core
# machine against a steady ~5 s with one, eating most of a 10-second smoke run (one CI run of
# fuzz_openai_json executed 12 inputs).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT_DIR"
status=0
for t in "${TARGETS[@]}"; do
  name=${t#fuzz_}
  scratch="$OUT_DIR/$name-new"
  mkdir -p "$scratch"
  log="$OUT_DIR/$name.log"
  rc=0
  ASAN_OPTIONS=detect_leaks=0 "$BUILD/fuzz/$t" -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 \
    ${FUZZ_RUNS:+-runs=$FUZZ_RUNS} \
    -timeout=20 -print_final_stats=1 -artifact_prefix="$OUT_DIR/$name-" \
    "$scratch" "fuzz/corpus/$name" >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo 0)
  crashes=$(ls "$OUT_DIR" | grep -c "^$name-\(crash\|leak\|timeout\|oom\)-" || true)
  echo "$t: execs=$execs cov=$cov crashes=$crashes rc=$rc (log $log)"
  if [ "$rc" != 0 ] || [ "$crashes" != 0 ]; then
    status=1
    tail -30 "$log"
  fi
done
exit $status
