#include "app/vllm_flags.h"

#include "core/error.h"

namespace deltaserve::app {

const std::set<std::string>& vllm_value_flags() {
  static const std::set<std::string> kFlags = {
      "dtype",      "seed",        "block-size",        "tokenizer-mode",
      "swap-space", "max-log-len", "uvicorn-log-level", "limit-mm-per-prompt"};
  return kFlags;
}

const std::set<std::string>& vllm_switches() {
  static const std::set<std::string> kSwitches = {"trust-remote-code",
                                                  "disable-log-requests",
                                                  "disable-log-stats",
                                                  "enable-chunked-prefill",
                                                  "disable-frontend-multiprocessing",
                                                  "language-model-only"};
  return kSwitches;
}

namespace {

void one_of(const Args& a, const std::string& flag, const std::set<std::string>& allowed,
            const std::string& why) {
  if (!a.has(flag)) return;
  const std::string v = a.get(flag, "");
  if (!allowed.count(v))
    throw Error("deltaserve serve: --" + flag + " " + v + " is not supported: " + why);
}

}  // namespace

void check_vllm_flags(const Args& a) {
  one_of(a, "dtype", {"auto", "bfloat16", "bf16"},
         "deltaserve computes in bfloat16 on GPUs (float32 on the CPU); use auto or bfloat16");
  one_of(a, "tokenizer-mode", {"auto", "hf"}, "the checkpoint's tokenizer.json is used; use auto");
  one_of(a, "block-size", {"16"}, "KV pages hold 16 tokens");
  one_of(a, "uvicorn-log-level", {"critical", "error", "warning", "info", "debug", "trace"},
         "a log level");
  a.get_int("seed", 0, 0, (1LL << 62));       // per-request seeds decide sampling
  a.get_double("swap-space", 0, 0, 1 << 20);  // no CPU swap: preempted requests recompute
  a.get_int("max-log-len", 0, 0, 1LL << 30);  // requests are not logged
  // Qwen3.5's text-only recipes (--language-model-only, --limit-mm-per-prompt): deltaserve
  // serves text only, image and video inputs are refused per request.
  if (a.has("limit-mm-per-prompt")) {
    const std::string v = a.get("limit-mm-per-prompt", "");
    if (v.empty() || v.front() != '{' || v.back() != '}')
      throw Error("deltaserve serve: --limit-mm-per-prompt takes a JSON object, got '" + v + "'");
  }
}

}  // namespace deltaserve::app
