// Where a served model's chat template comes from, resolved the way transformers and vLLM resolve
// it: recent transformers versions save the template as chat_template.jinja beside
// tokenizer_config.json (no longer inside it), and multimodal checkpoints such as Qwen3.5's may
// carry a processor's chat_template.json; vLLM's --chat-template replaces whatever the checkpoint
// has.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "tokenizer/chat_template.h"

namespace deltaserve::tokenizer {

// The chat template of the tokenizer directory `dir`: its chat_template.jinja, else
// tokenizer_config.json's chat_template (a string, or the "default" of a list of {name,
// template}), else chat_template.json's; the special tokens (bos_token, eos_token, pad_token,
// unk_token) from tokenizer_config.json where there is one. `flag`, when not empty, is vLLM's
// --chat-template and replaces the template (chat_template_flag_source). Throws deltaserve::Error
// naming the files it looked for when none holds a template, or naming the file that is
// malformed or whose template does not parse.
std::unique_ptr<ChatTemplate> load_chat_template(const std::filesystem::path& dir,
                                                 const std::string& flag = "");

// vLLM's --chat-template value as a template: the contents of the file it names; where no file can
// be read and the value holds a Jinja character ('{', '}' or a newline), the value itself with its
// backslash escapes decoded (\n, \t, \r, \\, \', \"). Throws deltaserve::Error for anything else
// (a path that cannot be read).
std::string chat_template_flag_source(const std::string& value);

}  // namespace deltaserve::tokenizer
