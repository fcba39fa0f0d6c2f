#include "backend/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace deltaserve::backend {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Candidates sorted by value, descending (ties: lower id first): the top `k` (all when k <= 0 or
// k >= n), found with nth_element so large vocabularies are not fully sorted.
std::vector<int32_t> top_candidates(const std::vector<float>& x, int32_t k) {
  const int32_t n = static_cast<int32_t>(x.size());
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto by_value = [&x](int32_t a, int32_t b) {
    return x[static_cast<size_t>(a)] != x[static_cast<size_t>(b)]
               ? x[static_cast<size_t>(a)] > x[static_cast<size_t>(b)]
               : a < b;
  };
  if (k > 0 && k < n) {
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), by_value);
    idx.resize(static_cast<size_t>(k));
  }
  std::sort(idx.begin(), idx.end(), by_value);
  return idx;
}

// The logits after penalties, biases and bans.
std::vector<float> penalized(std::span<const float> logits, int32_t vocab, const SampleSpec& p) {
  std::vector<float> x(logits.begin(), logits.begin() + vocab);
  if (p.repetition_penalty != 1.0f) {
    std::vector<uint8_t> seen(static_cast<size_t>(vocab), 0);
    for (const auto* list : {&p.prompt_tokens, &p.output_tokens})
      for (int32_t t : *list)
        if (t >= 0 && t < vocab) seen[static_cast<size_t>(t)] = 1;
    for (int32_t t = 0; t < vocab; ++t) {
      float& v = x[static_cast<size_t>(t)];
      if (seen[static_cast<size_t>(t)])
        v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (int32_t t : p.output_tokens) ++counts[t];
    for (const auto& [t, c] : counts)
      if (t >= 0 && t < vocab)
        x[static_cast<size_t>(t)] -=
            p.frequency_penalty * static_cast<float>(c) + p.presence_penalty;
  }
  for (const auto& [t, b] : p.bias)
    if (t >= 0 && t < vocab) x[static_cast<size_t>(t)] += b;
  for (int32_t b : p.banned)
    if (b >= 0 && b < vocab) x[static_cast<size_t>(b)] = kNegInf;

  return x;
}

}  // namespace

std::vector<std::pair<int32_t, double>> kept_distribution(std::span<const float> logits,
                                                          int32_t vocab, const SampleSpec& p) {
  std::vector<float> x = penalized(logits, vocab, p);
  for (float& v : x) v /= p.temperature;
  // Every cut is a threshold on the value, so tokens tied with the last one kept are kept too
  // (as vLLM's masks do): top-k keeps x >= the k-th largest value; top-p then the tokens down to
  // the one at which the running mass (largest first, of the top-k set) reaches top_p; min-p x >=
  // max + ln(min_p).
  const float mx = *std::max_element(x.begin(), x.end());
  float t = -std::numeric_limits<float>::infinity();
  if (p.top_k > 0 && p.top_k < vocab) {
    std::vector<float> y = x;
    std::nth_element(y.begin(), y.begin() + (p.top_k - 1), y.end(), std::greater<float>());
    t = y[static_cast<size_t>(p.top_k - 1)];
  }
  if (p.top_p < 1.0f) {
    double total = 0;
    for (float v : x)
      if (v >= t) total += std::exp(static_cast<double>(v - mx));
    // Candidates by descending value: a window grown until it holds top-p's share of the mass,
    // so the whole vocabulary is rarely sorted.
    for (int32_t window = std::min(vocab, 64);; window = std::min(vocab, window * 4)) {
      const std::vector<int32_t> cand = top_candidates(x, window);
      double cum = 0;
      bool found = false;
      for (int32_t c : cand) {
        const float v = x[static_cast<size_t>(c)];
        if (v < t) break;
        cum += std::exp(static_cast<double>(v - mx));
        if (cum >= p.top_p * total) {
          t = std::max(t, v);
          found = true;
          break;
        }
      }
      if (found || window == vocab) break;
    }
  }
  if (p.min_p > 0.0f) t = std::max(t, mx + std::log(p.min_p));
  std::vector<std::pair<int32_t, double>> kept;
  for (int32_t i = 0; i < vocab; ++i) {
    const float v = x[static_cast<size_t>(i)];
    if (v >= t && v > -std::numeric_limits<float>::infinity())
      kept.emplace_back(i, std::exp(static_cast<double>(v - mx)));
  }
  return kept;
}

Sampled sample_row(std::span<const float> logits, int32_t vocab, const SampleSpec& p) {
  Sampled r;
  if (p.greedy()) {
    const std::vector<float> x = penalized(logits, vocab, p);
    r.token = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  } else {
    // Inverse CDF over the kept tokens in id order.
    const std::vector<std::pair<int32_t, double>> kept = kept_distribution(logits, vocab, p);
    double sum = 0;
    for (const auto& k : kept) sum += k.second;
    const double u = static_cast<double>(sample_uniform(p.seed, p.counter)) * sum;
    double acc = 0;
    r.token = kept.back().first;
    for (const auto& [id, pr] : kept) {
      acc += pr;
      if (u < acc) {
        r.token = id;
        break;
      }
    }
  }

  if (p.num_logprobs >= 0) {
    const float mx = *std::max_element(logits.begin(), logits.begin() + vocab);
    double sum = 0;
    for (int32_t i = 0; i < vocab; ++i)
      sum += std::exp(static_cast<double>(logits[static_cast<size_t>(i)] - mx));
    const float lse = mx + static_cast<float>(std::log(sum));
    r.logprob = logits[static_cast<size_t>(r.token)] - lse;
    if (p.num_logprobs > 0) {
      const std::vector<float> raw(logits.begin(), logits.begin() + vocab);
      for (int32_t t : top_candidates(raw, p.num_logprobs))
        r.top.emplace_back(t, logits[static_cast<size_t>(t)] - lse);
    }
  }
  return r;
}

}  // namespace deltaserve::backend
