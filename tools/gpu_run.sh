#!/usr/bin/env bash
# Runs on the H200 test machine (device tool) over binaries staged by tools/stage_device.sh.
# Usage: tools/gpu_run.sh STAGE...   stages: ops gdn gdntest gdnbench gdnab gdnenvab mixedab overlap ncu trace ncudecode ncuskinny ncusrc ncufull ncuattn attn fla model nccl bench1 prof bench mixed linear linearab envab ab hf real serve prefix
#        prefixab serve8k offline8k longctx
#        benchtp[:MODELS] servetp   (multi-GPU: TP1 vs TP2 vs TP4 on the visible GPUs)
# Logs go to $OUT (or ./gpu_logs); a summary line is printed as each stage ends.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.device_out/lib:${LD_LIBRARY_PATH:-}
export DS_TEST_DATA=$PWD/test_data
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-$PWD/.device_out/bin}  # BIN=... for another staged set of binaries
LOG=${OUT:-$PWD/gpu_logs}
M=bench/configs/qwen3.5-4b
mkdir -p "$LOG"
summary=()
note() { summary+=("$1"); echo "$1"; }  # printed as it happens: a deadline may cut the run
# serve_start NAME FLAGS...: serve (4B shape, dummy) on port 8011 in the background, waiting for
# /health; its log is $LOG/NAME.log. serve_stop NAME: SIGTERM, then checks it exits within 30 s.
serve_start() {
  local name=$1; shift
  $BIN/deltaserve serve --model $M --load-format dummy --device cuda --tokenizer .device_out/qwen3 \
    --port 8011 "$@" >"$LOG/$name.log" 2>&1 &
  SERVE_PID=$!
  for i in $(seq 1 180); do
    python3 -c "import urllib.request;urllib.request.urlopen('http://127.0.0.1:8011/health')" \
      2>/dev/null && break
    sleep 1
  done
}
serve_stop() {
  local name=$1 waited=0
  kill -TERM $SERVE_PID
  while kill -0 $SERVE_PID 2>/dev/null && [ $waited -lt 30 ]; do sleep 1; waited=$((waited + 1)); done
  if kill -0 $SERVE_PID 2>/dev/null; then
    kill -KILL $SERVE_PID; wait $SERVE_PID; note "$name DID NOT EXIT within 30 s of SIGTERM (killed)"
  else
    wait $SERVE_PID; note "$name rc=$? (exited ${waited} s after SIGTERM)"
  fi
}
# serve_bench TP C...: serve at tensor-parallel size TP, bench serve 1k in / 256 out at each
# concurrency, one JSON line each into bench_serve.jsonl (tagged with the TP size).
serve_bench() {
  local tp=$1; shift
  serve_start serve_tp$tp --max-num-seqs 64 --max-model-len 1536 --max-num-batched-tokens 2048 \
    --tensor-parallel-size "$tp"
  for c in "$@"; do
    local n=$((c < 4 ? 4 : 2 * c))
    echo -n "{\"tp\": $tp, \"run\": " >>"$LOG/bench_serve.jsonl"
    timeout 200 $BIN/deltaserve bench serve --port 8011 --num-prompts $n --input-len 1024 \
      --output-len 256 --max-concurrency $c --vocab 150000 --seed $c >>"$LOG/bench_serve.jsonl" \
      2>>"$LOG/bench_serve.err" || echo "null" >>"$LOG/bench_serve.jsonl"
    echo "}" >>"$LOG/bench_serve.jsonl"
  done
  serve_stop serve_tp$tp
}
# prefix_bench on|off WORKLOAD...: the multi-turn chat workload (multi) and a never-hitting random
# workload (random) against a server with prefix caching on or off, one JSON line each into
# prefix_bench.jsonl.
prefix_bench() {
  local mode=$1 flag=--enable-prefix-caching
  shift
  [ "$mode" = off ] && flag=--no-enable-prefix-caching
  serve_start serve_prefix_$mode $flag --max-num-seqs 128 --max-model-len 4096 \
    --max-num-batched-tokens 2048
  grep -E "memory plan|ready" "$LOG/serve_prefix_$mode.log" | head -2
  for w in "$@"; do
    echo -n "{\"prefix_caching\": \"$mode\", \"run\": " >>"$LOG/prefix_bench.jsonl"
    if [ $w = multi ]; then
      timeout 240 $BIN/deltaserve bench serve --port 8011 --workload multi-turn --num-clients 128 \
        --turns 4 --system-len 1024 --turn-len 256 --output-len 128 --vocab 150000 \
        >>"$LOG/prefix_bench.jsonl" 2>>"$LOG/prefix_bench.err" || echo "null" >>"$LOG/prefix_bench.jsonl"
    else
      timeout 200 $BIN/deltaserve bench serve --port 8011 --num-prompts 256 --input-len 1024 \
        --output-len 256 --max-concurrency 64 --vocab 150000 --seed 7 \
        >>"$LOG/prefix_bench.jsonl" 2>>"$LOG/prefix_bench.err" || echo "null" >>"$LOG/prefix_bench.jsonl"
    fi
    echo "}" >>"$LOG/prefix_bench.jsonl"
    tail -1 "$LOG/prefix_bench.jsonl"
  done
  python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8011/metrics').read().decode())" |
    grep -E "^vllm:prefix_cache" | sed "s/^/$mode: /" >>"$LOG/prefix_bench.metrics"
  serve_stop serve_prefix_$mode
}
# ab_rounds FN: FN BINARY SETTING TAG ROUND for each BINARY:VAR=VALUE[,VAR=VALUE...] of $AB_RUNS
# present in $BIN, the runs alternating, twice (rounds 1 and 2), so that a lease's drift falls on
# every setting.
ab_rounds() {
  local fn=$1 i run b setting
  for i in 1 2; do
    for run in ${AB_RUNS:?AB_RUNS=BINARY:VAR=VALUE ...}; do
      b=${run%%:*} setting=${run#*:}
      [ -x $BIN/$b ] || continue
      $fn "$b" "$setting" "${run//[:=]/_}" $i
    done
  done
}
envab_run() {  # BINARY SETTING TAG ROUND: gpu_bench's decode table + per-op profile
  env ${2//,/ } timeout 200 $BIN/$1 --model $M --batches ${AB_BATCHES:-1,16,64,256} \
    ${AB_CONTEXT:+--context $AB_CONTEXT} --prefill ${AB_PREFILL:-512} --profile \
    >"$LOG/envab_$3_$4.md" 2>>"$LOG/envab.err"
  note "envab $1:$2 $4 rc=$? $(grep -E '^\| [0-9]+ \| [0-9]+ \|' "$LOG/envab_$3_$4.md" |
    cut -d'|' -f2,5 | tr '\n' ' ') ${AB_OP:+$(grep -E "^ +$AB_OP " "$LOG/envab_$3_$4.md" |
    awk '{print $2 "/" $3}' | tr '\n' ' ')}"
}
linearab_run() {  # BINARY SETTING TAG ROUND: linear_bench's per-projection table
  env ${2//,/ } timeout 120 $BIN/$1 --rows ${AB_ROWS:-16,32,64} >"$LOG/linearab_$3_$4.md" \
    2>>"$LOG/linearab.err"
  note "linearab $1:$2 $4 rc=$? $(grep -F '**step**' "$LOG/linearab_$3_$4.md" | tr '\n' ' ')"
}
mixedab_run() {  # BINARY SETTING TAG ROUND: gpu_bench's mixed steps ($MIXED_ROWS decode rows, default
                 # 64 and 256, at context $MIXED_CONTEXT, default 8k — 4k fits an 80 GB card — + a
                 # prefill chunk filling 8,192 tokens), no profile
  env ${2//,/ } timeout 300 $BIN/$1 --model $M --batches ${MIXED_ROWS:-64,256} \
    --context ${MIXED_CONTEXT:-8192} --prefill 8192 --mixed ${MIXED_ROWS:-64,256} --iters 10 \
    >"$LOG/mixedab_$3_$4.md" 2>>"$LOG/mixedab.err"
  note "mixedab $1:$2 $4 rc=$? $(grep -E '^\| (64|256) \| [0-9]+ \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \|$' \
    "$LOG/mixedab_$3_$4.md" | tr '\n' ' ')"
}
gdnenvab_run() {  # BINARY SETTING TAG ROUND: gdn_bench's per-layer table
  env ${2//,/ } timeout 90 $BIN/$1 >"$LOG/gdnenvab_$3_$4.md" 2>>"$LOG/gdnenvab.err"
  note "gdnenvab $1:$2 $4 rc=$? $(grep -E '^\| [0-9]' "$LOG/gdnenvab_$3_$4.md" | cut -d'|' -f2,3,5 |
    tr '\n' ' ')"
}
# ncu_source NAME KERNEL_REGEX CMD...: one launch of the kernel (after $NCU_SKIP of them) under
# ncu's full set with source counters, as $LOG/NAME.ncu-rep, its SASS with stall samples
# (NAME_sass.csv) and its details page.
ncu_source() {
  local name=$1 kernel=$2
  shift 2
  timeout 250 ncu --clock-control none --set full --import-source yes -k regex:$kernel -s ${NCU_SKIP:-0} -c 1 \
    -o "$LOG/$name" "$@" >"$LOG/ncu_src_$name.log" 2>&1
  ncu -i "$LOG/$name.ncu-rep" --page source --csv --print-source sass >"$LOG/${name}_sass.csv" 2>&1
  ncu -i "$LOG/$name.ncu-rep" --page details >"$LOG/${name}_details.txt" 2>&1
}

for stage in "$@"; do
  case $stage in
    ops)
      timeout 240 $BIN/cuda_ops_test >"$LOG/ops.log" 2>&1; note "ops rc=$? $(tail -1 "$LOG/ops.log")"
      $BIN/gdn_mixer_test >"$LOG/gdn_mixer.log" 2>&1; note "gdn_mixer rc=$? $(tail -1 "$LOG/gdn_mixer.log")"
      $BIN/linear_silu_mul_test >"$LOG/silu_mul.log" 2>&1; note "linear_silu_mul rc=$? $(tail -1 "$LOG/silu_mul.log")" ;;
    skinny)  # the weight-streaming GEMM's direct test alone (e.g. under DS_SKINNY_DEFER_MID=0)
      timeout 120 $BIN/cuda_ops_test --gtest_filter='SkinnyGemm*' >"$LOG/skinny.log" 2>&1
      note "skinny rc=$? $(tail -1 "$LOG/skinny.log")" ;;
    gdn)  # the chunked delta rule: its op test against the CPU chunked form, then its per-layer bench
      $BIN/gdn_chunk_test >"$LOG/gdn_chunk.log" 2>&1
      note "gdn_chunk rc=$? $(grep -cE '^gdn chunk' "$LOG/gdn_chunk.log") cases $(tail -1 "$LOG/gdn_chunk.log")"
      $BIN/gdn_bench >"$LOG/gdn_bench.md" 2>"$LOG/gdn_bench.err"
      note "gdn_bench rc=$? $(tr '\n' ' ' <"$LOG/gdn_bench.md")" ;;
    gdntest)  # the chunked delta rule's op test alone (no timing: may share the GPU)
      $BIN/gdn_chunk_test >"$LOG/gdn_chunk.log" 2>&1
      note "gdn_chunk rc=$? $(grep -cE '^gdn chunk' "$LOG/gdn_chunk.log") cases $(tail -1 "$LOG/gdn_chunk.log")" ;;
    gdnbench)  # the chunked delta rule's per-layer bench alone
      $BIN/gdn_bench >"$LOG/gdn_bench.md" 2>"$LOG/gdn_bench.err"
      note "gdn_bench rc=$? $(tr '\n' ' ' <"$LOG/gdn_bench.md")" ;;
    gdnab)  # A/B of the per-layer bench against a base build's (.device_out/bin/gdn_bench_base,
            # staged from another commit by tools/stage_base.sh), interleaved: new, base, new, base
      for i in 1 2; do
        for v in gdn_bench gdn_bench_base; do
          [ -x $BIN/$v ] || continue
          timeout 90 $BIN/$v >"$LOG/gdnab_${v}_$i.md" 2>>"$LOG/gdnab.err"
          note "gdnab $v $i rc=$? $(grep -E '^\| [0-9]' "$LOG/gdnab_${v}_$i.md" | cut -d'|' -f2,3,5 | tr '\n' ' ')"
        done
      done ;;
    ncu)  # kernel times (with L2 and DRAM bytes) of one GDN layer call at 8k (ncu, clocks untouched)
      timeout 200 ncu --clock-control none \
        --metrics gpu__time_duration.sum,lts__t_bytes.sum,dram__bytes.sum \
        $BIN/gdn_bench --len 8192 --rounds 1 --calls 2 ${GDN_ARGS:-} >"$LOG/ncu_gdn${GDN_ARGS:+_mixer}.log" 2>&1
      note "ncu gdn rc=$? $(grep -E 'kernel|gpu__time_duration' "$LOG/ncu_gdn${GDN_ARGS:+_mixer}.log" | tr -s ' ' | tail -12 | tr '\n' ' ')" ;;
    trace)  # the kernel timeline of gpu_bench's graphed decode steps at each B of $TRACE_B (default
            # 1 16 64), ctx 1k: .device_out/lib/libkernel_trace.so (and libcupti.so.13) staged by
            # tools/stage_device.sh; each kernel's share of a step by tools/kernel_trace/timeline.py
      for b in ${TRACE_B:-1 16 64}; do
        CUDA_INJECTION64_PATH=$PWD/.device_out/lib/libkernel_trace.so DS_KERNEL_TRACE="$LOG/trace_b$b.csv" \
          timeout 120 $BIN/gpu_bench --model $M --batches $b --prefill 512 >"$LOG/traced_b$b.md" 2>&1
        python3 tools/kernel_trace/timeline.py "$LOG/trace_b$b.csv" --top 40 >"$LOG/timeline_b$b.md" 2>&1
        note "trace B=$b rc=$? $(head -1 "$LOG/timeline_b$b.md")"
      done ;;
    ncudecode)  # every kernel's time of gpu_bench's decode steps at B = $NCU_B (default 1), ctx 1k
                # (ncu serializes kernels: bodies without launch gaps or programmatic overlap)
      timeout 300 ncu --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        $BIN/gpu_bench --model $M --batches ${NCU_B:-1} --iters 1 --prefill 512 \
        >"$LOG/ncu_decode_b${NCU_B:-1}.csv" 2>"$LOG/ncu_decode.err"
      note "ncu decode rc=$? $(wc -l <"$LOG/ncu_decode_b${NCU_B:-1}.csv") lines"
      python3 tools/ncu_step.py "$LOG/ncu_decode_b${NCU_B:-1}.csv" >"$LOG/ncu_decode_b${NCU_B:-1}.md" 2>&1
      note "ncu decode B=${NCU_B:-1} step: $(head -1 "$LOG/ncu_decode_b${NCU_B:-1}.md")" ;;
    ncusrc)  # ncu's source-level counters (SASS with stall samples) of a GDN kernel at 8k
             # ($NCU_KERNEL, default prep_kernel; $GDN_ARGS e.g. --mixer)
      k=${NCU_KERNEL:-prep_kernel}
      ncu_source $k $k $BIN/gdn_bench --len 8192 --rounds 1 --calls 1 ${GDN_ARGS:-}
      note "ncu src $k rc=$? $(wc -l <"$LOG/${k}_sass.csv") lines"
      python3 tools/ncu_phases.py "$LOG/${k}_sass.csv" >"$LOG/${k}_phases.md" 2>&1
      note "ncu phases $k: $(sed -n '/^| phase/,/^$/p' "$LOG/${k}_phases.md" | cut -d'|' -f2,4 | tr '\n' ' ')" ;;
    ncufull)  # ncu's full sections for the GDN prep / scan and the prefill attention kernels at 8k
      timeout 200 ncu --clock-control none --set full -k regex:'prep_kernel|scan_kernel' -c 2 \
        $BIN/gdn_bench --len 8192 --rounds 1 --calls 1 >"$LOG/ncu_gdn_full.log" 2>&1
      note "ncu gdn full rc=$?"
      timeout 200 ncu --clock-control none --set full -k regex:attn_prefill -c 1 \
        $BIN/attn_bench --len 8192 --rounds 1 --calls 1 >"$LOG/ncu_attn_full.log" 2>&1
      note "ncu attn full rc=$?" ;;
    ncuattn)  # ncu's source-level counters of the prefill attention kernel at 1 x 8192
              # ($ATTN_BINS: attn_bench builds to profile, default attn_bench)
      for ab in ${ATTN_BINS:-attn_bench}; do
        ncu_source $ab attn_prefill $BIN/$ab --len 8192 --rounds 1 --calls 1
        note "ncu attn $ab rc=$? $(grep -E 'Duration|Registers' "$LOG/${ab}_details.txt" | tr -s ' ' | tr '\n' ' ')"
      done ;;
    ncuattndecode)  # ncu's full set with source counters of the decode attention kernel at B =
                    # ${NCU_B:-16}, context ${NCU_CTX:-8192}: its 17th launch in gpu_bench (the first
                    # was near-empty in session t, likely a start-up padding step's; check the
                    # pick's DRAM bytes against a full step's K / V)
      NCU_SKIP=16 ncu_source attn_decode attn_split $BIN/gpu_bench --model $M --batches ${NCU_B:-16} \
        --context ${NCU_CTX:-8192} --iters 1 --prefill 512
      note "ncu attn decode rc=$? $(grep -E 'Duration|DRAM Throughput' "$LOG/attn_decode_details.txt" | tr -s ' ' | tr '\n' ' ')" ;;
    attn)  # prefill attention alone: ms per layer and causal TFLOP/s at the 4B shape
      $BIN/attn_bench >"$LOG/attn_bench.md" 2>"$LOG/attn_bench.err"
      note "attn_bench rc=$? $(tr '\n' ' ' <"$LOG/attn_bench.md")" ;;
    fla)  # the peer: flash-linear-attention's chunk kernel at the same shapes (.peers carried)
      timeout $((${FLA_BUDGET_S:-400} + 20)) python3 .peers/fla_bench.py --sections ${FLA_SECTIONS:-env,a} \
        --budget-s ${FLA_BUDGET_S:-400} \
        --out "$LOG/fla_bench.jsonl" >"$LOG/fla_bench.log" 2>&1
      note "fla rc=$? $(grep -iE 'ms_graph|chunk' "$LOG/fla_bench.log" | tail -8 | tr '\n' ' ')" ;;
    model)
      $BIN/cuda_model_test >"$LOG/model.log" 2>&1
      rc=$?
      note "model rc=$rc $(grep -E 'totals' "$LOG/model.log" | tr '\n' ' ') $(tail -1 "$LOG/model.log")"
      if [ $rc != 0 ] && [ -n "${STOP_ON_FAIL:-}" ]; then exit 1; fi ;;
    nccl)
      $BIN/nccl_test >"$LOG/nccl.log" 2>&1; note "nccl rc=$? $(tail -1 "$LOG/nccl.log")"
      # The rank-fault test in a process of its own: an aborted NCCL kernel must not touch the
      # other tests' CUDA contexts.
      timeout ${TP_TIMEOUT:-120} stdbuf -oL $BIN/tp_gpu_test --gtest_filter=-*RankFault* >"$LOG/tp_gpu.log" 2>&1
      note "tp_gpu rc=$? $(grep -E 'GPU TP|engine GPU|FAILED|OK \]' "$LOG/tp_gpu.log" | tr '\n' ' ') $(tail -1 "$LOG/tp_gpu.log")"
      timeout ${TP_TIMEOUT:-120} stdbuf -oL $BIN/tp_gpu_test --gtest_filter=*RankFault* >>"$LOG/tp_gpu.log" 2>&1
      note "tp_gpu fault rc=$? $(grep -E 'fault \(|FAILED|Failure' "$LOG/tp_gpu.log" | tr '\n' ' ') $(tail -1 "$LOG/tp_gpu.log")" ;;
    bench1)
      $BIN/deltaserve bench offline --device cuda --model $M --load-format dummy --num-prompts 4 \
        --input-len 1024 --output-len 64 --max-concurrency 1 --max-num-seqs 16 >"$LOG/bench1.log" 2>&1
      note "bench1 rc=$? $(grep -E '^\{' "$LOG/bench1.log" | tail -1)" ;;
    prof)
      DS_CUDA_PROFILE=1 $BIN/deltaserve bench offline --device cuda --model $M --load-format dummy \
        --num-prompts 2 --input-len 1024 --output-len 64 --max-concurrency 1 --max-num-seqs 4 \
        >"$LOG/prof.log" 2>&1
      note "prof rc=$?" ;;
    bench)  # the model-level table: decode B=1/16/64/256 at ctx 1k, prefill $PREFILLS, per-op
            # ($BENCH_FLAGS e.g. --mamba-ssm-cache-dtype bfloat16)
      $BIN/gpu_bench --model $M --profile --prefill ${PREFILLS:-512,2048,8192} ${BENCH_FLAGS:-} \
        >"$LOG/gpu_bench.md" 2>"$LOG/gpu_bench.err"
      note "bench rc=$?" ;;
    mixed)  # serving's steps under load: decode at context 8k, then B decode rows + a prefill
            # chunk filling 8,192 tokens (per-op tables)
      $BIN/gpu_bench --model $M --profile --batches 64,256 --context 8192 --prefill 8192 \
        --mixed 64,256 --iters 10 >"$LOG/mixed.md" 2>"$LOG/mixed.err"
      note "mixed rc=$? $(grep -E '^\| (64|256) \| 8192 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \|$' "$LOG/mixed.md" | tr '\n' ' ')" ;;
    linear)  # the decode projections alone: weight-streaming GEMM / GEMV / cuBLASLt
      $BIN/linear_bench >"$LOG/linear_bench.md" 2>"$LOG/linear_bench.err"
      note "linear_bench rc=$? $(grep -F '**step**' "$LOG/linear_bench.md" | tr '\n' ' ')" ;;
    ab)  # A/B of the model-level bench against a base build's (.device_out/bin/gpu_bench_base,
         # staged from another commit by tools/stage_base.sh), interleaved: new, base, new, base
      for i in 1 2; do
        for v in gpu_bench gpu_bench_base; do
          [ -x $BIN/$v ] || continue
          timeout 280 $BIN/$v --model $M --batches 1,16,64,256 --prefill 8192 --iters 30 \
            >"$LOG/ab_${v}_$i.md" 2>>"$LOG/ab.err"
          note "ab $v $i rc=$? $(grep -E '^\| (1|16|64|256|8192) \|' "$LOG/ab_${v}_$i.md" | tr '\n' ' ')"
        done
      done ;;
    envab)  # decode steps of several runs, interleaved twice in one lease: each of $AB_RUNS is
            # BINARY:VAR=VALUE (e.g. gpu_bench:DS_GDN_DECODE_SPLIT=0, gpu_bench_base:DS_PDL=1 for
            # a base build staged by tools/stage_base.sh), at batches $AB_BATCHES (default
            # 1,16,64,256), context $AB_CONTEXT (default gpu_bench's 1k) and prefill $AB_PREFILL
            # (default 512), with per-op tables; the ms and calls of op $AB_OP noted per B
      ab_rounds envab_run ;;
    linearab)  # the decode projections alone (linear_bench at $AB_ROWS, default 16,32,64) for each
               # of $AB_RUNS (BINARY:VAR=VALUE, e.g. linear_bench:DS_SKINNY_GEMM=0,
               # linear_bench_base:X=1 for a base build), interleaved twice in one lease
      ab_rounds linearab_run ;;
    overlap)  # decode steps beside prefills, two lanes (backends) at once: whether decode work runs
              # beside prefill work on the GPU ($OVERLAP_FLAGS e.g. --context 4096 on an 80 GB card,
              # --decode-sms 32: SMs of their own, --eager-decode)
      timeout 300 $BIN/overlap_bench --model $M ${OVERLAP_FLAGS:-} >>"$LOG/overlap.md" 2>>"$LOG/overlap.err"
      note "overlap rc=$? $(grep -E '^\| [0-9]' "$LOG/overlap.md" | tr '\n' ' ')" ;;
    mixedab)  # serving's mixed steps for each of $AB_RUNS (BINARY:VAR=VALUE, e.g.
              # gpu_bench:DS_GDN_FUSED=0, gpu_bench_base:X=1), interleaved twice in one lease
      ab_rounds mixedab_run ;;
    gdnenvab)  # the GDN per-layer bench for each of $AB_RUNS (BINARY:VAR=VALUE, e.g.
               # gdn_bench:DS_GDN_DECODE_SPLIT=0, gdn_bench_base:X=1), interleaved twice in one lease
      ab_rounds gdnenvab_run ;;
    ncuskinny)  # ncu's source-level counters of the weight-streaming GEMM at T = $NCU_T (default 1)
                # on one projection group ($NCU_ONLY, default "gdn out")
      ncu_source skinny_t${NCU_T:-1} skinny_gemm_kernel $BIN/linear_bench --rows ${NCU_T:-1} --rounds 1 \
        --only "${NCU_ONLY:-gdn out}"
      note "ncu skinny rc=$? $(grep -E 'Duration|Registers|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput' "$LOG/skinny_t${NCU_T:-1}_details.txt" | tr -s ' ' | tr '\n' ' ')" ;;
    hf)  # HF transformers on the same shapes (the peer in the table)
      python3 tools/hf_bench.py >"$LOG/hf_bench.md" 2>"$LOG/hf_bench.err"
      note "hf rc=$?" ;;
    real)  # the real-size check: random 4B checkpoint + HF logits, then our forward against them
      [ -f /tmp/q4b_check/ref.safetensors ] ||
        timeout 240 python3 tools/make_4b_check.py --out /tmp/q4b_check >"$LOG/make_4b_check.log" 2>&1
      note "make_4b_check rc=$? $(tail -3 "$LOG/make_4b_check.log" | tr '\n' ' ')"
      DS_REAL_CHECK_DIR=/tmp/q4b_check timeout 150 stdbuf -oL $BIN/real_size_test >"$LOG/real_size.log" 2>&1
      note "real_size rc=$? $(grep -E 'TP[0-9] |FAILED|Failure' "$LOG/real_size.log" | tr '\n' ' ') $(tail -1 "$LOG/real_size.log")" ;;
    serve)  # end to end: serve --device cuda (4B shape, dummy) + bench serve 1k in / 256 out
      serve_bench 1 1 16 64
      note "serve $(wc -l <"$LOG/bench_serve.jsonl") bench lines" ;;
    serve8k)  # SGLang's benchmark workload (8,192 in / 1,024 out) at concurrency $CONCURRENCY
              # (default 1 and 64): serve (4B shape, dummy) + bench serve, a JSON line each
      # MAX_SEQS=auto leaves --max-num-seqs to the memory plan's default; BATCHED_TOKENS (8192) the
      # step budget, SERVE_EXTRA more serve flags (e.g. --long-prefill-token-threshold 2048)
      seqs_flag="--max-num-seqs ${MAX_SEQS:-64}"
      [[ ${MAX_SEQS:-} == auto ]] && seqs_flag=""
      serve_start serve8k $seqs_flag --max-model-len 9300 \
        --max-num-batched-tokens ${BATCHED_TOKENS:-8192} ${SERVE_EXTRA:-}
      grep -E "memory plan|ready" "$LOG/serve8k.log" | head -3
      for c in ${CONCURRENCY:-1 64}; do
        n=${NPROMPTS:-$((c < 4 ? 4 : 2 * c))}
        echo -n "{\"concurrency\": $c, \"run\": " >>"$LOG/serve8k.jsonl"
        # A seed per concurrency: the same seed's prompts would hit the prefix cache an earlier
        # run left in this server (session r: c=256 after c=1 and 64 read 43.8k tok/s, 39.4k alone).
        timeout ${SERVE_TIMEOUT:-240} $BIN/deltaserve bench serve --port 8011 --num-prompts $n \
          --input-len 8192 --output-len 1024 --max-concurrency $c --vocab 150000 --seed $c \
          >>"$LOG/serve8k.jsonl" 2>>"$LOG/serve8k.err" || echo "null" >>"$LOG/serve8k.jsonl"
        echo "}" >>"$LOG/serve8k.jsonl"
        note "serve8k c=$c $(tail -2 "$LOG/serve8k.jsonl" | tr -d '\n' | cut -c1-400)"
      done
      # The engine thread's seconds in forwards and around them (host work the device waits on),
      # and the prefix cache's hits (none expected: each run's prompts are its own seed's).
      python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8011/metrics').read().decode())" |
        grep -E "^deltaserve_(engine_(steps|forward_seconds|host_seconds)|num_preemptions|prefix_cache_(queries|hits))_total" >"$LOG/serve8k.metrics"
      note "serve8k engine $(sed 's/{[^}]*}//' "$LOG/serve8k.metrics" | tr '\n' ' ')"
      serve_stop serve8k ;;
    longctx)  # serve with its defaults (--max-model-len auto: the 4B's 262,144 context, the
              # auto --max-num-seqs), then one request of each of $LONG_LENS (default 131072 and
              # 250000) prompt tokens and 128 out, alone: TTFT / TPOT at long context
      serve_start longctx
      grep -E "memory plan|max_model_len|KV room|ready" "$LOG/longctx.log" | head -5
      for len in ${LONG_LENS:-131072 250000}; do
        echo -n "{\"input_len\": $len, \"run\": " >>"$LOG/longctx.jsonl"
        timeout ${SERVE_TIMEOUT:-240} $BIN/deltaserve bench serve --port 8011 --num-prompts 1 \
          --input-len $len --output-len 128 --max-concurrency 1 --vocab 150000 --seed $len \
          >>"$LOG/longctx.jsonl" 2>>"$LOG/longctx.err" || echo "null" >>"$LOG/longctx.jsonl"
        echo "}" >>"$LOG/longctx.jsonl"
        note "longctx $len $(tail -2 "$LOG/longctx.jsonl" | tr -d '\n' | cut -c1-400)"
      done
      serve_stop longctx ;;
    offline8k)  # serve8k's workload in-process (bench offline, no HTTP) at $CONCURRENCY (default 1
                # and 64), same engine flags: HTTP's cost is serve8k's TPOT over this one's
      for c in ${CONCURRENCY:-1 64}; do
        n=${NPROMPTS:-$((c < 4 ? 4 : 2 * c))}
        timeout ${SERVE_TIMEOUT:-240} $BIN/deltaserve bench offline --device cuda --model $M \
          --load-format dummy --num-prompts $n --input-len 8192 --output-len 1024 \
          --max-concurrency $c --max-num-seqs 64 --max-model-len 9300 \
          --max-num-batched-tokens 8192 >>"$LOG/offline8k.jsonl" 2>>"$LOG/offline8k.err" ||
          echo "null" >>"$LOG/offline8k.jsonl"
        note "offline8k c=$c $(tail -1 "$LOG/offline8k.jsonl" | cut -c1-400)"
      done ;;
    prefixab)  # the cost of prefix caching when nothing hits, without HTTP: bench offline 1k in /
               # 256 out, 256 requests at concurrency 64, on / off interleaved three times
      for i in 1 2 3; do
        for flag in --enable-prefix-caching ""; do
          $BIN/deltaserve bench offline --device cuda --model $M --load-format dummy --num-prompts 256 \
            --input-len 1024 --output-len 256 --max-concurrency 64 --max-num-seqs 64 \
            --max-num-batched-tokens 2048 $flag 2>>"$LOG/prefixab.err" | tail -1 >>"$LOG/prefixab.jsonl"
        done
      done
      note "prefixab $(wc -l <"$LOG/prefixab.jsonl") runs" ;;
    prefix)  # prefix caching on vs off: multi-turn chat and a never-hitting workload
      prefix_bench on multi random
      prefix_bench off multi random
      prefix_bench on random
      prefix_bench off random
      note "prefix $(grep -c hit_rate "$LOG/prefix_bench.jsonl") multi-turn lines" ;;
    benchtp*)  # TP1 vs TP2 vs TP4 (those the GPUs allow) per model shape, one table each
      models=${stage#benchtp}; models=${models#:}
      for size in ${models//,/ }; do
        timeout ${BENCH_TIMEOUT:-400} stdbuf -oL $BIN/gpu_bench --model bench/configs/qwen3.5-$size --tp 1,2,4 --batches 1,16,64 \
          --prefill 2048,8192 --iters 20 >"$LOG/tp_bench_$size.md" 2>>"$LOG/tp_bench.err"
        note "benchtp $size rc=$?"
        cat "$LOG/tp_bench_$size.md"
      done ;;
    servetp)
      gpus=$(nvidia-smi -L | wc -l)
      for tp in 1 2; do
        if [ "$tp" -le "$gpus" ]; then serve_bench $tp 16 64; else note "serve tp$tp skipped: $gpus GPU(s)"; fi
      done
      cat "$LOG/bench_serve.jsonl" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
