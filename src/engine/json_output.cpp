#include "engine/json_output.h"

#include <algorithm>

#include "engine/output_constraint.h"

namespace deltaserve::engine {

namespace {
bool contains(std::span<const int32_t> ids, int32_t t) {
  return std::find(ids.begin(), ids.end(), t) != ids.end();
}
}  // namespace

JsonOutput::JsonOutput(std::shared_ptr<const structured::JsonConstraint> c, int32_t constrain_after)
    : c_(std::move(c)),
      state_(c_->grammar),
      constrain_after_(constrain_after),
      active_(constrain_after < 0) {}

const structured::TokenMask& JsonOutput::mask(const structured::VocabTrie& trie) const {
  if (!mask_) mask_ = c_->masks.mask(trie, state_);
  return *mask_;
}

void JsonOutput::restrict(const structured::VocabTrie& trie, std::span<const int32_t> end_tokens,
                          backend::SampleSpec& s) const {
  if (!active_) return;
  const structured::TokenMask& m = mask(trie);
  const bool ends = state_.complete();
  if (m.complement) {
    for (int32_t t : m.ids)
      if (!(ends && contains(end_tokens, t))) s.banned.push_back(t);
    return;
  }
  for (int32_t t : m.ids) s.bias.emplace_back(t, kForcedBias);
  if (ends || m.ids.empty())
    for (int32_t t : end_tokens) s.bias.emplace_back(t, kForcedBias);
}

int32_t JsonOutput::choose(const structured::VocabTrie& trie, std::span<const int32_t> end_tokens,
                           int32_t sampled) const {
  if (!active_) return sampled;
  const structured::TokenMask& m = mask(trie);
  const bool ends = state_.complete();
  if (m.allows(sampled) || (ends && contains(end_tokens, sampled))) return sampled;
  if (!m.complement && !m.ids.empty()) return m.ids.front();
  if (m.complement)  // the first id not left out
    for (int32_t t = 0; t < trie.vocab_size(); ++t)
      if (m.allows(t)) return t;
  return end_tokens.empty() ? sampled : end_tokens.front();
}

void JsonOutput::take(int32_t token, std::string_view bytes) {
  if (!active_) {
    active_ = token == constrain_after_;
    return;
  }
  state_ = state_.advance(bytes);
  mask_.reset();
}

}  // namespace deltaserve::engine
