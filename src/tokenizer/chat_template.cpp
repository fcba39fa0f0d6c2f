#include "tokenizer/chat_template.h"

#include <utility>

namespace deltaserve::tokenizer {

using jinja::Json;

ChatTemplate::ChatTemplate(const std::string& source, Json special_tokens)
    : tmpl_(source), special_tokens_(std::move(special_tokens)) {}

std::string ChatTemplate::render(const Json& messages, const Json& tools,
                                 bool add_generation_prompt, const Json& kwargs) const {
  Json vars = special_tokens_;
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it) vars[it.key()] = it.value();
  vars["messages"] = messages;
  vars["tools"] = tools;
  vars["add_generation_prompt"] = add_generation_prompt;
  return tmpl_.render(vars);
}

}  // namespace deltaserve::tokenizer
