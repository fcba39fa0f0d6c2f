#include "tokenizer/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace deltaserve::tokenizer {

using jinja::Json;

std::unique_ptr<ChatTemplate> ChatTemplate::from_config(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  const Json j = Json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(path.string() + ": bad JSON");
  std::string source;
  const Json& t = j.contains("chat_template") ? j["chat_template"] : Json();
  if (t.is_string()) {
    source = t.get<std::string>();
  } else if (t.is_array()) {
    for (const Json& e : t)
      if (e.value("name", "") == "default") source = e.value("template", "");
  }
  if (source.empty()) throw Error(path.string() + ": no chat_template");
  Json special = Json::object();
  for (const char* k : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    if (!j.contains(k)) continue;
    const Json& v = j[k];
    if (v.is_string())
      special[k] = v;
    else if (v.is_object() && v.contains("content"))
      special[k] = v["content"];
  }
  try {
    return std::make_unique<ChatTemplate>(source, special);
  } catch (const Error& e) {
    throw Error(path.string() + ": " + e.what());
  }
}

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
