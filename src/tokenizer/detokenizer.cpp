#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace deltaserve::tokenizer {

std::string IncrementalDetokenizer::push(int32_t id) {
  const std::string& b = tok_.token_bytes(id);
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += b;
  std::string out;
  const size_t used = append_utf8_lossy(pending_, false, out);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace deltaserve::tokenizer
