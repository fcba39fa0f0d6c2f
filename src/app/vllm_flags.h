// vLLM's serve flags that deltaserve accepts for drop-in command lines: those that mean nothing
// here are no-ops (documented in README), those with one meaningful value are checked, so that a
// value deltaserve cannot honour is a clear error instead of a silent difference.
#pragma once

#include <set>
#include <string>

#include "app/args.h"

namespace deltaserve::app {

// Flags that take a value: dtype, seed, block-size, tokenizer-mode, swap-space,
// max-log-len, uvicorn-log-level, limit-mm-per-prompt.
const std::set<std::string>& vllm_value_flags();
// Switches: trust-remote-code, disable-log-requests, disable-log-stats, enable-chunked-prefill,
// disable-frontend-multiprocessing, language-model-only.
const std::set<std::string>& vllm_switches();
// Throws deltaserve::Error for a value deltaserve cannot honour (e.g. --dtype float16).
void check_vllm_flags(const Args& a);

}  // namespace deltaserve::app
