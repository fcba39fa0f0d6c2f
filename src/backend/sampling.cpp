#include "backend/sampling.h"

#include <algorithm>
#include <cmath>
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

// The logits after penalties and bans.
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
  for (int32_t b : p.banned)
    if (b >= 0 && b < vocab) x[static_cast<size_t>(b)] = kNegInf;

  return x;
}

}  // namespace

std::vector<std::pair<int32_t, double>> kept_distribution(std::span<const float> logits,
                                                          int32_t vocab, const SampleSpec& p) {
  std::vector<float> x = penalized(logits, vocab, p);
  for (float& v : x) v /= p.temperature;
  // Candidates by descending value: the top-k set, or (no top-k) a window grown until it holds
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
  std::vector<std::pair<int32_t, double>> kept;
  for (size_t i = 0; i < keep; ++i) kept.emplace_back(cand[i], prob[i]);
  std::sort(kept.begin(), kept.end());
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
