// Byte-level matching of a JsonGrammar: the state after some output bytes is a set of stacks of
// frames (several where anyOf, enum literals or a number's end leave more than one reading open),
// each stack persistent (frames shared with the state it came from), so that a state is copied in
// O(stacks). A state with no stacks is dead: the bytes so far cannot start a matching document.
//
// Bounds that keep a sampled document finite: at most kMaxWhitespace whitespace bytes in a row,
// numbers of at most kMaxNumberBytes bytes, object / array nesting at most kMaxNesting deep, keys
// of at most kMaxKeyBytes bytes. Nothing may follow the document (only the end: EOS). Strings are
// matched as bytes (a token may split a UTF-8 character, as BPE tokens do): the text a client gets
// is decoded lossily, so a sequence left broken shows as U+FFFD inside a string, never as bad JSON.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "structured/json_grammar.h"

namespace deltaserve::structured {

constexpr int kMaxWhitespace = 32, kMaxNumberBytes = 32, kMaxNesting = 32;
// Readings kept side by side (anyOf alternatives that accept the same bytes multiply with nesting):
// past this many the first ones are kept, so a pathological schema costs bounded work a byte (and
// may narrow what it allows; never widen it).
constexpr size_t kMaxReadings = 64;

// A byte that a string (or a free key) takes as it is, leaving the matcher's state unchanged.
inline bool string_plain(uint8_t b) { return b >= 0x20 && b != '"' && b != '\\'; }

struct Frame;
using FramePtr = std::shared_ptr<const Frame>;

class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonGrammar> grammar);

  // The state after one more byte (dead if the byte cannot come next).
  JsonMatcher advance(uint8_t byte) const;
  JsonMatcher advance(std::string_view bytes) const;
  bool dead() const { return tops_.empty(); }
  // True when the bytes so far are a whole document (the output may end here).
  bool complete() const;
  // True when `byte` leaves the state as it is (a plain byte inside a string or a free key):
  // the token mask's walk then needs no new state.
  bool absorbs(uint8_t byte) const;
  // Identifies the state: equal keys, equal futures (the token masks' cache key).
  std::string key() const;

 private:
  JsonMatcher(std::shared_ptr<const JsonGrammar> g, std::vector<FramePtr> tops)
      : grammar_(std::move(g)), tops_(std::move(tops)) {}
  std::shared_ptr<const JsonGrammar> grammar_;
  std::vector<FramePtr> tops_;
};

}  // namespace deltaserve::structured
