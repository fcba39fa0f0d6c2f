// The forced start of a request's output (SamplingParams::forced_prefixes; the server's
// tool_choice "required" / a named function): the output must continue with one of several token
// sequences, from its first token or right after the first `constrain_after` token it emits (the
// end of the reasoning). The engine adds kForcedBias to the allowed tokens' logits, so the model
// chooses among them as it would (its preference between, say, two tool names is kept), and
// replaces a token outside them (possible only if a raw logit lead exceeded the bias) by the first.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/request.h"

namespace deltaserve::engine {

constexpr float kForcedBias = 100.0f;

// The tokens that may come after `outputs` (empty: unconstrained — no forced prefixes, the
// reasoning has not ended yet, or a prefix is complete).
std::vector<int32_t> allowed_next_tokens(const SamplingParams& p, std::span<const int32_t> outputs);

// `sampled`, or the first allowed token where the constraint rules it out.
int32_t constrain_token(const SamplingParams& p, std::span<const int32_t> outputs, int32_t sampled);

}  // namespace deltaserve::engine
