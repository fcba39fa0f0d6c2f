// The structured-output fields of a request body, as a JSON grammar for the engine:
// OpenAI's response_format — {"type": "text"}, {"type": "json_object"} (any JSON object), or
// {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}} — and
// vLLM's structured_outputs {"json": schema} / {"json_object": true} / {"choice": [texts]},
// guided_json (a schema, or its text) and guided_choice. Structured-output kinds deltaserve does
// not implement (regex, grammar, structural tags) are refused with a 400 naming the field, never
// ignored; so are schemas outside structured/json_grammar.h's subset.
#pragma once

#include <memory>

#include "server/json_body.h"
#include "structured/token_mask.h"

namespace deltaserve::server {

// Null when the body asks for no JSON output. Compiled grammars (and the token masks learnt for
// them) are kept for the last kKeptGrammars distinct schemas, so that requests repeating a schema
// share them.
std::shared_ptr<const structured::JsonConstraint> parse_json_output(const json& body);

constexpr size_t kKeptGrammars = 32;

}  // namespace deltaserve::server
