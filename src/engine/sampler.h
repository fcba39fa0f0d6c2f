// Sampler: picks the next token of one request from its logits row (penalties, temperature,
// top-k / top-p / min-p, seeded draw) and reports log-probabilities (log-softmax of the raw
// logits in f32, as vLLM's default "raw" logprobs).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/request.h"

namespace deltaserve::engine {

struct SampleResult {
  int32_t token = 0;
  TokenLogprob logprob;  // filled when params.logprobs or top_logprobs
};

// logits: the row, of which only [0, vocab) may be sampled (vocab excludes padding rows);
// tokens/num_prompt: the request's history for penalties; banned: ids that must not be chosen
// (EOS and stop ids before min_tokens). Uses `rng` only when sampling (not greedy).
SampleResult sample(std::span<const float> logits, int32_t vocab, const SamplingParams& params,
                    std::span<const int32_t> tokens, int32_t num_prompt,
                    std::span<const int32_t> banned, std::mt19937_64& rng);

}  // namespace deltaserve::engine
