// Sampling of next tokens from logits rows: what a request asks for (SampleSpec), what comes back
// (Sampled), the counter-based draw both backends share, and the host reference that the CPU
// backend runs and the CUDA sampling kernel is tested against.
//
// Semantics (as vLLM's): banned ids -> -inf; repetition penalty (HF style) over prompt and output
// tokens; presence / frequency penalties (OpenAI style) over output tokens; then greedy
// (temperature < 1e-5) or: logits / temperature, top-k, then top-p over the top-k set's mass, then
// min-p against the most likely token, and one draw u = sample_uniform(seed, counter) by inverse
// CDF over the kept tokens in id order. Logprobs are the log-softmax of the raw logits (vLLM's
// default "raw" logprobs), in f32.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace deltaserve::backend {

struct SampleSpec {
  float temperature = 0.0f;  // < 1e-5: greedy
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0, counter = 0;      // the draw: sample_uniform(seed, counter)
  int32_t num_logprobs = -1;           // -1: none; 0: the chosen token's; n (<= 20): also the top n
  std::vector<int32_t> prompt_tokens;  // for the repetition penalty (repeats are fine)
  std::vector<int32_t> output_tokens;  // for all three penalties
  std::vector<int32_t> banned;         // never chosen (e.g. EOS before min_tokens)
  std::vector<std::pair<int32_t, float>> bias;  // added to those tokens' logits (logit_bias)

  bool greedy() const { return temperature < 1e-5f; }
};

struct Sampled {
  int32_t token = 0;
  float logprob = 0.0f;                        // with num_logprobs >= 0
  std::vector<std::pair<int32_t, float>> top;  // num_logprobs most likely, most likely first
};

constexpr int32_t kMaxTopLogprobs = 20;

// A uniform draw in [0, 1) from (seed, counter) (splitmix64; 24 bits), the same on host and GPU.
inline float sample_uniform(uint64_t seed, uint64_t counter) {
  uint64_t z = seed ^ (counter * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// The tokens a non-greedy draw chooses from, in id order, with their unnormalised probabilities.
std::vector<std::pair<int32_t, double>> kept_distribution(std::span<const float> logits,
                                                          int32_t vocab, const SampleSpec& spec);

// The host reference: samples one row; only ids < vocab may be chosen (vocab <= logits.size()).
Sampled sample_row(std::span<const float> logits, int32_t vocab, const SampleSpec& spec);

}  // namespace deltaserve::backend
