#include "tokenizer/chat_template_source.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"

namespace deltaserve::tokenizer {
namespace fs = std::filesystem;
using jinja::Json;

namespace {

// A file's contents; nullopt when it cannot be opened (a missing file, a directory).
std::optional<std::string> read_text(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A JSON object file; nullopt when there is no such file; throws when it is not a JSON object.
std::optional<Json> read_json_object(const fs::path& path) {
  const std::optional<std::string> text = read_text(path);
  if (!text) return std::nullopt;
  Json j = Json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(path.string() + ": bad JSON");
  return j;
}

// A config's chat_template: a string, or the "default" entry of a list of {name, template};
// empty when it has none.
std::string template_of(const Json& config) {
  const Json& t = config.contains("chat_template") ? config["chat_template"] : Json();
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (const Json& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
  return "";
}

// bos_token, eos_token, pad_token and unk_token as strings (a string, or an added token's
// {"content": ...}).
Json special_tokens_of(const Json& config) {
  Json special = Json::object();
  for (const char* k : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    if (!config.contains(k)) continue;
    const Json& v = config[k];
    if (v.is_string())
      special[k] = v;
    else if (v.is_object() && v.contains("content") && v["content"].is_string())
      special[k] = v["content"];
  }
  return special;
}

// The checkpoint's own template and where it was found; empty when no file holds one.
std::pair<std::string, std::string> checkpoint_template(const fs::path& dir,
                                                        const std::optional<Json>& config) {
  if (std::optional<std::string> jinja = read_text(dir / "chat_template.jinja"))
    return {*jinja, (dir / "chat_template.jinja").string()};
  if (config) {
    std::string t = template_of(*config);
    if (!t.empty()) return {t, (dir / "tokenizer_config.json").string()};
  }
  if (const std::optional<Json> processor = read_json_object(dir / "chat_template.json")) {
    std::string t = template_of(*processor);
    if (!t.empty()) return {t, (dir / "chat_template.json").string()};
  }
  return {"", ""};
}

char escaped(char c) {
  switch (c) {
    case 'n':
      return '\n';
    case 't':
      return '\t';
    case 'r':
      return '\r';
    case '\\':
    case '\'':
    case '"':
      return c;
    default:
      return 0;
  }
}

std::string decode_escapes(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char e = s[i] == '\\' && i + 1 < s.size() ? escaped(s[i + 1]) : 0;
    if (e) {
      out += e;
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::string chat_template_flag_source(const std::string& value) {
  if (std::optional<std::string> text = read_text(value)) return *text;
  if (value.find_first_of("{}\n") == std::string::npos)
    throw Error("--chat-template " + value +
                ": looks like a file path, but no such file can be read (a template itself holds "
                "'{' or '}')");
  return decode_escapes(value);
}

std::unique_ptr<ChatTemplate> load_chat_template(const fs::path& dir, const std::string& flag) {
  const std::optional<Json> config = read_json_object(dir / "tokenizer_config.json");
  const auto [source, from] =
      flag.empty()
          ? checkpoint_template(dir, config)
          : std::pair<std::string, std::string>{chat_template_flag_source(flag), "--chat-template"};
  if (source.empty())
    throw Error(dir.string() +
                ": no chat template (looked for chat_template.jinja, tokenizer_config.json's "
                "chat_template and chat_template.json; --chat-template FILE gives one)");
  try {
    return std::make_unique<ChatTemplate>(source,
                                          config ? special_tokens_of(*config) : Json::object());
  } catch (const Error& e) {
    throw Error(from + ": " + e.what());
  }
}

}  // namespace deltaserve::tokenizer
