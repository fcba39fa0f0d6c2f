// The Qwen3 reasoning parser (vLLM's `--reasoning-parser qwen3`): splits a chat reply's text into
// `reasoning_content` (inside <think> ... </think>) and `content`, incrementally, for streamed
// deltas too. Qwen3.5's chat template opens "<think>\n" at the end of the prompt when thinking is
// on, so the reply starts inside the reasoning; with thinking off the template closes an empty
// block and the reply is content (a reply that still begins with <think> is read as reasoning).
// A tag split across deltas is held back until it is whole; newlines right after </think> belong to
// neither part.
#pragma once

#include <string>
#include <string_view>

namespace deltaserve::server {

class ReasoningParser {
 public:
  struct Pieces {
    std::string reasoning, content;
  };

  // `prompt_opens_think`: the rendered prompt ends inside an open <think> block.
  explicit ReasoningParser(bool prompt_opens_think)
      : state_(prompt_opens_think ? State::kReasoning : State::kStart) {}

  // The parts of the next piece of text that can be told apart now.
  Pieces push(std::string_view text);
  // Whatever is still held back (the reply ended; a cut reasoning stays reasoning).
  Pieces finish();

  // Whether a rendered prompt leaves a <think> block open (its last tag is an opening one).
  static bool prompt_opens_think(std::string_view prompt);

 private:
  enum class State { kStart, kReasoning, kAfterThink, kContent };
  void take(Pieces& out, std::string_view text);

  State state_;
  std::string held_;  // text that may be the start of a tag
};

}  // namespace deltaserve::server
