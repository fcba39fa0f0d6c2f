#include "server/reasoning_parser.h"

namespace deltaserve::server {

namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

bool ReasoningParser::prompt_opens_think(std::string_view prompt) {
  const size_t open = prompt.rfind(kOpen), close = prompt.rfind(kClose);
  return open != std::string_view::npos && (close == std::string_view::npos || close < open);
}

void ReasoningParser::take(Pieces& out, std::string_view text) {
  while (!text.empty()) {
    switch (state_) {
      case State::kStart: {  // content, unless the reply opens with <think>
        const size_t ws = text.find_first_not_of(" \n");
        if (ws == std::string_view::npos) {  // leading blanks: undecided yet
          held_ = std::string(text);
          return;
        }
        const std::string_view rest = text.substr(ws);
        if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) {
          held_ = std::string(text);
          return;
        }
        if (rest.substr(0, kOpen.size()) == kOpen) {
          state_ = State::kReasoning;
          text = rest.substr(kOpen.size());
        } else {
          state_ = State::kContent;
        }
        break;
      }
      case State::kReasoning: {
        const size_t at = text.find(kClose);
        if (at == std::string_view::npos) {
          const size_t hold = partial_tag(text, kClose);
          out.reasoning += text.substr(0, text.size() - hold);
          held_ = std::string(text.substr(text.size() - hold));
          return;
        }
        out.reasoning += text.substr(0, at);
        text = text.substr(at + kClose.size());
        state_ = State::kAfterThink;
        break;
      }
      case State::kAfterThink: {  // the newlines after </think> belong to neither part
        const size_t nl = text.find_first_not_of('\n');
        if (nl == std::string_view::npos) return;
        text = text.substr(nl);
        state_ = State::kContent;
        break;
      }
      case State::kContent:
        out.content += text;
        return;
    }
  }
}

ReasoningParser::Pieces ReasoningParser::push(std::string_view text) {
  Pieces out;
  std::string all = std::move(held_);
  held_.clear();
  all.append(text);
  take(out, all);
  return out;
}

ReasoningParser::Pieces ReasoningParser::finish() {
  Pieces out;
  if (held_.empty()) return out;
  if (state_ == State::kReasoning)
    out.reasoning = std::move(held_);
  else
    out.content = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace deltaserve::server
