#include "app/scheduler_flags.h"

#include "engine/scheduler.h"

namespace deltaserve::app {

SchedulerFlags scheduler_flags(const Args& a, int32_t batched_tokens) {
  constexpr long long kMax = 1 << 24;
  SchedulerFlags f;
  f.max_num_batched_tokens =
      static_cast<int32_t>(a.get_count("max-num-batched-tokens", batched_tokens, 1, kMax));
  f.long_prefill_token_threshold =
      static_cast<int32_t>(a.get_int("long-prefill-token-threshold", 0, 0, kMax));
  f.admission_reserve_tokens = static_cast<int32_t>(a.get_int(
      "admission-reserve-tokens", engine::SchedulerConfig{}.admission_reserve_tokens, 0, kMax));
  return f;
}

}  // namespace deltaserve::app
