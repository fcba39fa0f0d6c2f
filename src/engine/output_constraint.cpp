#include "engine/output_constraint.h"

#include <algorithm>

namespace deltaserve::engine {

std::vector<int32_t> allowed_next_tokens(const SamplingParams& p,
                                         std::span<const int32_t> outputs) {
  if (p.forced_prefixes.empty()) return {};
  size_t from = 0;
  if (p.constrain_after >= 0) {
    const auto it = std::find(outputs.begin(), outputs.end(), p.constrain_after);
    if (it == outputs.end()) return {};
    from = static_cast<size_t>(it - outputs.begin()) + 1;
  }
  const std::span<const int32_t> done = outputs.subspan(from);
  std::vector<int32_t> next;
  for (const std::vector<int32_t>& prefix : p.forced_prefixes) {
    if (done.size() >= prefix.size()) {
      if (std::equal(prefix.begin(), prefix.end(), done.begin())) return {};  // complete
      continue;
    }
    if (!std::equal(done.begin(), done.end(), prefix.begin())) continue;
    const int32_t t = prefix[done.size()];
    if (std::find(next.begin(), next.end(), t) == next.end()) next.push_back(t);
  }
  return next;
}

int32_t constrain_token(const SamplingParams& p, std::span<const int32_t> outputs,
                        int32_t sampled) {
  const std::vector<int32_t> allowed = allowed_next_tokens(p, outputs);
  if (allowed.empty() || std::find(allowed.begin(), allowed.end(), sampled) != allowed.end())
    return sampled;
  return allowed.front();
}

}  // namespace deltaserve::engine
