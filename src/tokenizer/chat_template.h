// ChatTemplate: renders OpenAI-style messages into a prompt by running the checkpoint's own Jinja
// chat_template (from tokenizer_config.json) the way HF apply_chat_template does.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "tokenizer/jinja.h"

namespace deltaserve::tokenizer {

class ChatTemplate {
 public:
  // Reads tokenizer_config.json: chat_template (a string, or a list of {name, template} where
  // "default" is used) and the special tokens passed to the template. Throws deltaserve::Error.
  static std::unique_ptr<ChatTemplate> from_config(
      const std::filesystem::path& tokenizer_config_json);
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
