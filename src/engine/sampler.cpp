#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace deltaserve::engine {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// log-softmax over x[0, n) in f32 (max-subtracted, accumulated in double for the sum).
std::vector<float> log_softmax(std::span<const float> x, int32_t n) {
  const float mx = *std::max_element(x.begin(), x.begin() + n);
  double sum = 0;
  for (int32_t i = 0; i < n; ++i)
    sum += std::exp(static_cast<double>(x[static_cast<size_t>(i)] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  std::vector<float> out(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = x[static_cast<size_t>(i)] - lse;
  return out;
}

// Candidates sorted by logit, descending: the top `k` (all when k <= 0 or k >= n) — found with
// nth_element so large vocabularies are not fully sorted.
std::vector<int32_t> top_candidates(const std::vector<float>& x, int32_t k) {
  const int32_t n = static_cast<int32_t>(x.size());
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&x](int32_t a, int32_t b) {
    return x[static_cast<size_t>(a)] != x[static_cast<size_t>(b)]
               ? x[static_cast<size_t>(a)] > x[static_cast<size_t>(b)]
               : a < b;
  };
  if (k > 0 && k < n) {
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), by_logit);
    idx.resize(static_cast<size_t>(k));
  }
  std::sort(idx.begin(), idx.end(), by_logit);
  return idx;
}

}  // namespace

SampleResult sample(std::span<const float> logits, int32_t vocab, const SamplingParams& p,
                    std::span<const int32_t> tokens, int32_t num_prompt,
                    std::span<const int32_t> banned, std::mt19937_64& rng) {
  std::vector<float> x(logits.begin(), logits.begin() + vocab);
  for (int32_t b : banned)
    if (b >= 0 && b < vocab) x[static_cast<size_t>(b)] = kNegInf;

  if (p.repetition_penalty != 1.0f) {
    std::vector<uint8_t> seen(static_cast<size_t>(vocab), 0);
    for (int32_t t : tokens)
      if (t >= 0 && t < vocab) seen[static_cast<size_t>(t)] = 1;
    for (int32_t t = 0; t < vocab; ++t) {
      float& v = x[static_cast<size_t>(t)];
      if (seen[static_cast<size_t>(t)])
        v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (size_t i = static_cast<size_t>(num_prompt); i < tokens.size(); ++i) ++counts[tokens[i]];
    for (const auto& [t, c] : counts)
      if (t >= 0 && t < vocab)
        x[static_cast<size_t>(t)] -=
            p.frequency_penalty * static_cast<float>(c) + p.presence_penalty;
  }

  SampleResult r;
  if (p.temperature < 1e-5f) {
    r.token = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  } else {
    for (float& v : x) v /= p.temperature;
    // Candidates by descending logit: the top-k set, or (no top-k) a window grown until it holds
    // top-p's share of the mass, so the whole vocabulary is rarely sorted.
    const bool use_k = p.top_k > 0 && p.top_k < vocab;
    const float mx = *std::max_element(x.begin(), x.end());
    std::vector<int32_t> cand;
    std::vector<double> prob;
    double total = 0;
    if (!use_k)
      for (float v : x) total += std::exp(static_cast<double>(v - mx));
    for (int32_t window = use_k ? p.top_k : (p.top_p < 1.0f ? std::min(vocab, 64) : vocab);;
         window = std::min(vocab, window * 4)) {
      cand = top_candidates(x, window);
      prob.clear();
      double mass = 0;
      for (int32_t c : cand) {
        prob.push_back(std::exp(static_cast<double>(x[static_cast<size_t>(c)] - mx)));
        mass += prob.back();
      }
      if (use_k) total = mass;
      if (use_k || window == vocab || mass >= p.top_p * total) break;
    }
    size_t keep = prob.size();
    if (p.top_p < 1.0f) {
      double cum = 0;
      for (size_t i = 0; i < prob.size(); ++i) {
        cum += prob[i];
        if (cum >= p.top_p * total) {
          keep = i + 1;
          break;
        }
      }
    }
    if (p.min_p > 0.0f) {
      const double floor = p.min_p * prob[0];
      size_t i = 1;
      while (i < keep && prob[i] >= floor) ++i;
      keep = i;
    }
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += prob[i];
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * sum;
    double acc = 0;
    r.token = cand[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      acc += prob[i];
      if (u < acc) {
        r.token = cand[i];
        break;
      }
    }
  }

  if (p.logprobs || p.top_logprobs > 0) {
    const std::vector<float> lp = log_softmax(logits, vocab);
    r.logprob.token = r.token;
    r.logprob.logprob = lp[static_cast<size_t>(r.token)];
    if (p.top_logprobs > 0)
      for (int32_t t : top_candidates(lp, p.top_logprobs))
        r.logprob.top.emplace_back(t, lp[static_cast<size_t>(t)]);
  }
  return r;
}

}  // namespace deltaserve::engine
