#include "app/cache_flags.h"

#include "core/error.h"

namespace deltaserve::app {

const std::set<std::string>& cache_value_flags() {
  static const std::set<std::string> kFlags = {"mamba-block-size",
                                               "prefix-cache-snapshot-fraction"};
  return kFlags;
}

const std::set<std::string>& cache_switches() {
  static const std::set<std::string> kSwitches = {"enable-prefix-caching",
                                                  "no-enable-prefix-caching"};
  return kSwitches;
}

double apply_cache_flags(const Args& a, engine::EngineConfig& cfg) {
  if (a.has("enable-prefix-caching") && a.has("no-enable-prefix-caching"))
    throw Error("--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  cfg.enable_prefix_caching = !a.has("no-enable-prefix-caching");
  cfg.mamba_block_size = static_cast<int32_t>(a.get_int("mamba-block-size", 64, 64, 1 << 20));
  if (cfg.mamba_block_size % 64 != 0)
    throw Error("--mamba-block-size must be a multiple of 64 (the delta rule's chunk), got " +
                std::to_string(cfg.mamba_block_size));
  const double share = a.get_double("prefix-cache-snapshot-fraction", 0.25, 0, 0.9);
  return cfg.enable_prefix_caching ? share : 0.0;
}

}  // namespace deltaserve::app
