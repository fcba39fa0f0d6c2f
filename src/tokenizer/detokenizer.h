// IncrementalDetokenizer: turns a stream of token ids into text pieces for streaming. A piece is
// emitted only once it is valid UTF-8 that no later token can change, so the concatenation of all
// pieces (after finish()) equals Tokenizer::decode of the whole sequence.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace deltaserve::tokenizer {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
      : tok_(tok), skip_special_(skip_special_tokens) {}

  // Adds one token; returns the text that became stable (possibly empty). Throws
  // deltaserve::Error for an id outside the vocabulary.
  std::string push(int32_t id);
  // Flushes what is left (an incomplete UTF-8 tail becomes U+FFFD, as in a full decode).
  std::string finish();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted: at most an incomplete UTF-8 sequence
};

}  // namespace deltaserve::tokenizer
