// A chat request's `tool_choice` (OpenAI / vLLM): "none", "auto", "required" or a named function
// {"type": "function", "function": {"name": NAME}}, and how "required" / a named function shape the
// reply: its start is forced to Qwen3.5's tool-call opening, `<tool_call>\n<function=NAME>\n`
// (one opening per tool for "required", the model choosing among them), right after the
// reasoning when the prompt leaves a <think> block open; the model writes the parameters, which
// the qwen3_coder parser reads (with or without --enable-auto-tool-choice).
#pragma once

#include <string>

#include "engine/request.h"
#include "server/json_body.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve::server {

enum class ToolChoiceKind { kNone, kAuto, kRequired, kNamed };

struct ToolChoice {
  ToolChoiceKind kind = ToolChoiceKind::kNone;
  std::string name;  // kNamed

  bool forces_call() const {
    return kind == ToolChoiceKind::kRequired || kind == ToolChoiceKind::kNamed;
  }
};

// The body's tool_choice; absent: auto when it has tools and the server a tool-call parser, else
// none. Throws Error (400): malformed; "auto" without the parser; "required" or a name without
// tools; a name not among the tools.
ToolChoice parse_tool_choice(const json& body, bool tool_call_parser);

// For "required" / a named function: the forced starts of the reply into `p`.
void force_tool_call(const ToolChoice& choice, const json& tools, const tokenizer::Tokenizer& tok,
                     bool prompt_opens_think, engine::SamplingParams& p);

}  // namespace deltaserve::server
