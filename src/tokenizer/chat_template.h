// ChatTemplate: renders OpenAI-style messages into a prompt by running the checkpoint's own Jinja
// chat template (chat_template_source.h finds it) the way HF apply_chat_template does.
#pragma once

#include <string>

#include "tokenizer/jinja.h"

namespace deltaserve::tokenizer {

class ChatTemplate {
 public:
  // source: the Jinja template; special_tokens: {bos_token: "...", ...}, passed to it. Throws
  // deltaserve::Error when the template does not parse.
  ChatTemplate(const std::string& source, jinja::Json special_tokens);

  // messages: [{role, content, ...}]; tools: array or null; kwargs: extra template variables
  // such as {"enable_thinking": false}. Throws deltaserve::Error for template errors.
  std::string render(const jinja::Json& messages, const jinja::Json& tools,
                     bool add_generation_prompt,
                     const jinja::Json& kwargs = jinja::Json::object()) const;

 private:
  jinja::Template tmpl_;
  jinja::Json special_tokens_;  // bos_token, eos_token, ... as strings
};

}  // namespace deltaserve::tokenizer
