#include "engine/output_processor.h"

#include <algorithm>

#include "tokenizer/detokenizer.h"

namespace deltaserve::engine {

FinishReason OutputProcessor::stop_reason(const Request& r, int32_t token) const {
  const auto& stops = r.params.stop_token_ids;
  if ((!r.params.ignore_eos && std::find(eos_.begin(), eos_.end(), token) != eos_.end()) ||
      std::find(stops.begin(), stops.end(), token) != stops.end())
    return FinishReason::kStop;
  if (r.num_outputs() >= r.params.max_tokens ||
      static_cast<int32_t>(r.tokens.size()) >= max_model_len_)
    return FinishReason::kLength;
  return FinishReason::kNone;
}

void OutputProcessor::detokenize(Request& r, int32_t token, FinishReason& why,
                                 OutputDelta& d) const {
  r.text += r.detok->push(token);
  if (why != FinishReason::kNone) r.text += r.detok->finish();
  size_t hold = 0;  // bytes held back: they may begin a stop string
  for (const std::string& s : r.params.stop) {
    const size_t from = r.text_emitted >= s.size() ? r.text_emitted - s.size() + 1 : 0;
    const size_t pos = r.text.find(s, from);
    if (pos != std::string::npos) {
      r.text.resize(pos);
      why = FinishReason::kStop;
    }
    hold = std::max(hold, s.size() - 1);
  }
  size_t end = r.text.size();
  if (why == FinishReason::kNone) end = end > r.text_emitted + hold ? end - hold : r.text_emitted;
  // Never split a UTF-8 character when holding back.
  while (end > r.text_emitted && end < r.text.size() &&
         (static_cast<unsigned char>(r.text[end]) & 0xC0) == 0x80)
    --end;
  if (end > r.text_emitted) {
    d.text += r.text.substr(r.text_emitted, end - r.text_emitted);
    r.text_emitted = end;
  }
}

ProcessedOutput OutputProcessor::process(Request& r, std::span<const SampledToken> tokens) const {
  ProcessedOutput out;
  const bool want_logprobs = r.params.logprobs || r.params.top_logprobs > 0;
  for (const SampledToken& t : tokens) {
    r.tokens.push_back(t.token);
    ++out.tokens_taken;
    out.delta.token_ids.push_back(t.token);
    if (want_logprobs) out.delta.logprobs.push_back(t.logprob);
    FinishReason why = stop_reason(r, t.token);
    if (r.detok) detokenize(r, t.token, why, out.delta);
    if (why != FinishReason::kNone) {
      out.finish = why;
      break;
    }
  }
  out.delta.prompt_tokens = r.num_prompt;
  out.delta.completion_tokens = r.num_outputs();
  return out;
}

}  // namespace deltaserve::engine
