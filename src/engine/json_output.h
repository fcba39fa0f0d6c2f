// A request's JSON output (SamplingParams::json, from response_format): the matcher state of its
// output so far, the next token's mask handed to the sampler — as +kForcedBias on the allowed
// tokens where they are fewer than half the vocabulary, else as bans of the others, so the CUDA
// sampler needs nothing new — and the replacement of a sampled token the mask rules out (possible
// only where the bias form meets a raw logit lead over kForcedBias). The constraint starts at the
// first output token, or after the first `constrain_after` token (the end of the reasoning).
// The end tokens (EOS, stop_token_ids) are allowed once the document is complete, and only then.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "backend/sampling.h"
#include "structured/token_mask.h"

namespace deltaserve::engine {

class JsonOutput {
 public:
  JsonOutput(std::shared_ptr<const structured::JsonConstraint> c, int32_t constrain_after);

  // Adds the next token's mask to s.
  void restrict(const structured::VocabTrie& trie, std::span<const int32_t> end_tokens,
                backend::SampleSpec& s) const;
  // `sampled`, or the first token the mask allows where it rules `sampled` out.
  int32_t choose(const structured::VocabTrie& trie, std::span<const int32_t> end_tokens,
                 int32_t sampled) const;
  // Takes an emitted token (its decoded bytes); end tokens are not taken.
  void take(int32_t token, std::string_view bytes);
  // True once the output is a whole document.
  bool complete() const { return active_ && state_.complete(); }

 private:
  // The mask of state_, looked up once a state (restrict and choose of a step share it).
  const structured::TokenMask& mask(const structured::VocabTrie& trie) const;

  std::shared_ptr<const structured::JsonConstraint> c_;
  structured::JsonMatcher state_;
  mutable std::shared_ptr<const structured::TokenMask> mask_;  // of state_; null until looked up
  int32_t constrain_after_;
  bool active_;
};

}  // namespace deltaserve::engine
