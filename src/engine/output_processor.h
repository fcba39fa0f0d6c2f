// OutputProcessor: what happens to a request's sampled tokens after a step — appended to the
// request, checked against its stop conditions (EOS, stop ids, max_tokens, max_model_len, stop
// strings), detokenized incrementally with text held back while it may still begin a stop string,
// and turned into one OutputDelta. It takes several tokens per request per step (speculative
// verification accepts more than one), stopping at the first that ends the request.
#pragma once

#include <span>
#include <vector>

#include "engine/request.h"

namespace deltaserve::engine {

struct SampledToken {
  int32_t token = 0;
  TokenLogprob logprob;
};

struct ProcessedOutput {
  OutputDelta delta;  // token ids, logprobs and text of this step (counts filled in)
  FinishReason finish = FinishReason::kNone;
  int32_t tokens_taken = 0;  // tokens appended (fewer than given when a stop came first)
};

class OutputProcessor {
 public:
  OutputProcessor(std::vector<int32_t> eos_token_ids, int32_t max_model_len)
      : eos_(std::move(eos_token_ids)), max_model_len_(max_model_len) {}

  ProcessedOutput process(Request& r, std::span<const SampledToken> tokens) const;

 private:
  // Why `r` stops after appending `token` (kNone: it goes on).
  FinishReason stop_reason(const Request& r, int32_t token) const;
  // Appends the text of `token` and moves what may be sent into `d`; a stop string found in the
  // text ends the request (kStop) and cuts the text before it.
  void detokenize(Request& r, int32_t token, FinishReason& why, OutputDelta& d) const;

  std::vector<int32_t> eos_;
  int32_t max_model_len_;
};

}  // namespace deltaserve::engine
