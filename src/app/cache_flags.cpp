#include "app/cache_flags.h"

#include "core/error.h"

namespace deltaserve::app {

const std::set<std::string>& cache_value_flags() {
  static const std::set<std::string> kFlags = {"mamba-block-size", "prefix-cache-snapshot-fraction",
                                               "mamba-ssm-cache-dtype", "kv-cache-dtype"};
  return kFlags;
}

const std::set<std::string>& cache_switches() {
  static const std::set<std::string> kSwitches = {"enable-prefix-caching",
                                                  "no-enable-prefix-caching"};
  return kSwitches;
}

DType ssm_state_dtype_flag(const Args& a) {
  const std::string state = a.get("mamba-ssm-cache-dtype", "auto");
  if (state == "auto" || state == "float32") return DType::kF32;
  if (state == "bfloat16") return DType::kBF16;
  throw Error("--mamba-ssm-cache-dtype must be auto, float32 or bfloat16, got '" + state + "'");
}

bool kv_cache_fp8_flag(const Args& a) {
  const std::string kv = a.get("kv-cache-dtype", "auto");
  if (kv == "auto") return false;
  if (kv == "fp8" || kv == "fp8_e4m3") return true;
  throw Error("--kv-cache-dtype " + kv +
              " is not supported: use auto (the activations' dtype) or fp8 / fp8_e4m3");
}

double apply_cache_flags(const Args& a, engine::EngineConfig& cfg) {
  if (a.has("enable-prefix-caching") && a.has("no-enable-prefix-caching"))
    throw Error("--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  cfg.enable_prefix_caching = !a.has("no-enable-prefix-caching");
  cfg.mamba_block_size = static_cast<int32_t>(a.get_int("mamba-block-size", 64, 64, 1 << 20));
  if (cfg.mamba_block_size % 64 != 0)
    throw Error("--mamba-block-size must be a multiple of 64 (the delta rule's chunk), got " +
                std::to_string(cfg.mamba_block_size));
  cfg.ssm_state_dtype = ssm_state_dtype_flag(a);
  cfg.kv_cache_fp8 = kv_cache_fp8_flag(a);
  const double share = a.get_double("prefix-cache-snapshot-fraction", 0.25, 0, 0.9);
  return cfg.enable_prefix_caching ? share : 0.0;
}

}  // namespace deltaserve::app
