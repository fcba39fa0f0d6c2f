#!/usr/bin/env bash
# Starts five deltaserve servers on free ports (the embedded default model with the real Qwen3
# tokenizer), runs the openai-client e2e tests against them, and stops the servers with SIGTERM
# (checking that they exit cleanly). Usage: run_e2e.sh DELTASERVE_BINARY
# E2E_SERVER_FLAGS adds flags to both servers (e.g. --tensor-parallel-size 2).
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
# ctest runs the three e2e tests at once: one `npm ci` at a time (it empties node_modules first, so
# a second one racing it, or a test reading it meanwhile, fails), the check under the same lock.
(
  flock 9
  if [ ! -f "$here/node_modules/openai/package.json" ]; then
    npm ci --prefix "$here" --no-audit --no-fund --silent
  fi
) 9>"$here/.npm-ci.lock"
logs=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$logs"; }
trap cleanup EXIT

# Starts a server in this shell (so that its pid can be waited for) with its logs under $logs.
start() {  # name, extra flags...
  local name=$1
  shift
  # shellcheck disable=SC2086
  "$bin" serve --port 0 --max-model-len 512 --kv-cache-gib 0.25 ${E2E_SERVER_FLAGS:-} "$@" \
    >"$logs/$name.out" 2>"$logs/$name.err" &
  pids+=($!)
}
url_of() {  # name: waits for the ready line, prints the server's URL
  for _ in $(seq 1 300); do
    if grep -q "ready" "$logs/$1.out" 2>/dev/null; then break; fi
    sleep 0.1
  done
  grep -o 'http://127.0.0.1:[0-9]*' "$logs/$1.out" | head -1
}
start main --api-key sk-e2e --max-num-seqs 64 --max-body-bytes 200000
# Its API key from the environment, as vLLM's VLLM_API_KEY.
export VLLM_API_KEY=sk-small
start small --max-pending 1 --max-num-seqs 4
unset VLLM_API_KEY
# Every reply of this one is a fixed token script (reasoning + answer), parsed by the Qwen3
# reasoning parser.
start script --reasoning-parser qwen3 \
  --debug-output-script $'<think>\nsix times seven\n</think>\n\nThe answer is 42.'
# ... and one whose every reply is a qwen3_coder tool call.
start tools --enable-auto-tool-choice --tool-call-parser qwen3_coder --debug-output-script \
  $'Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>'
# ... and one (no tool-call parser flag) whose every reply calls get_time: tool_choice "required"
# and named functions force the call's opening.
start forced --debug-output-script \
  $'<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>'
url=$(url_of main)
small=$(url_of small)
script=$(url_of script)
tools=$(url_of tools)
forced=$(url_of forced)
if [ -z "$url" ] || [ -z "$small" ] || [ -z "$script" ] || [ -z "$tools" ] || [ -z "$forced" ]; then
  echo "a server did not start:"; cat "$logs"/*.err; exit 1
fi
status=0
DS_URL=$url DS_URL_SMALL=$small DS_URL_SCRIPT=$script DS_URL_TOOLS=$tools DS_URL_FORCED=$forced DS_KEY=sk-e2e node --test "$here/openai.test.mjs" || status=$?
for p in "${pids[@]}"; do
  kill -TERM "$p"
  for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$p" 2>/dev/null; then
    echo "server $p did not stop within 30 s of SIGTERM"; kill -9 "$p"; status=1
  fi
  if ! wait "$p"; then echo "server $p did not exit cleanly"; status=1; fi
done
pids=()
exit $status
