#include "engine/request.h"

#include <cmath>

namespace deltaserve::engine {

std::string SamplingParams::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature)) return "temperature must be >= 0";
  if (!(top_p > 0 && top_p <= 1)) return "top_p must be in (0, 1]";
  if (!(min_p >= 0 && min_p <= 1)) return "min_p must be in [0, 1]";
  if (top_k < -1) return "top_k must be -1 (off), 0 (off) or positive";
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty))
    return "repetition_penalty must be > 0";
  if (!(presence_penalty >= -2 && presence_penalty <= 2))
    return "presence_penalty must be in [-2, 2]";
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2))
    return "frequency_penalty must be in [-2, 2]";
  if (max_tokens < 1) return "max_tokens must be >= 1";
  if (min_tokens < 0 || min_tokens > max_tokens) return "min_tokens must be in [0, max_tokens]";
  if (top_logprobs < 0 || top_logprobs > 20) return "top_logprobs must be in [0, 20]";
  for (const std::string& s : stop)
    if (s.empty()) return "stop strings must not be empty";
  for (const auto& [t, b] : logit_bias)
    if (!(b >= -100 && b <= 100)) return "logit_bias values must be in [-100, 100]";
  for (const std::vector<int32_t>& f : forced_prefixes)
    if (f.empty()) return "forced prefixes must not be empty";
  if (json && !forced_prefixes.empty())
    return "a JSON response_format cannot be combined with a forced tool call";
  if (json && ignore_eos) return "a JSON response_format cannot be combined with ignore_eos";
  return "";
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

OutputDelta RequestStream::take() {
  OutputDelta d = std::move(q_[head_++]);
  if (empty()) {
    q_.clear();
    head_ = 0;
  } else if (head_ >= 64 && 2 * head_ >= q_.size()) {  // a reader that never quite catches up
    q_.erase(q_.begin(), q_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
  return d;
}

bool RequestStream::next(OutputDelta& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return !empty(); })) return false;
  out = take();
  return true;
}

bool RequestStream::try_next(OutputDelta& out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (empty()) return false;
  out = take();
  return true;
}

void RequestStream::set_listener(std::function<void()> f) {
  auto listener = f ? std::make_shared<const std::function<void()>>(std::move(f)) : nullptr;
  bool pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = listener;
    pending = !empty();
  }
  if (pending && listener) (*listener)();
}

void RequestStream::push(OutputDelta d) {
  std::shared_ptr<const std::function<void()>> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (empty()) listener = listener_;  // else a call for the queued deltas is under way
    q_.push_back(std::move(d));
  }
  cv_.notify_all();
  if (listener) (*listener)();
}

}  // namespace deltaserve::engine
