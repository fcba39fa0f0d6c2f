#include "server/response_format.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "server/request_fields.h"

namespace deltaserve::server {

namespace {

using Constraint = std::shared_ptr<const structured::JsonConstraint>;

// A grammar for each schema seen lately (cleared when full), shared across requests.
Constraint constraint_for(const json& schema) {
  static std::mutex mu;
  static std::map<std::string, Constraint> kept;
  const std::string text = schema.dump();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = kept.find(text); it != kept.end()) return it->second;
  }
  auto c = std::make_shared<const structured::JsonConstraint>(
      structured::JsonGrammar::from_schema(schema));
  std::lock_guard<std::mutex> lock(mu);
  if (kept.size() >= kKeptGrammars) kept.clear();
  kept.emplace(text, c);
  return c;
}

Constraint json_object() {
  static const Constraint c =
      std::make_shared<const structured::JsonConstraint>(structured::JsonGrammar::any_object());
  return c;
}

// A schema given as an object, or as its JSON text (parsed with the body's bounds: a schema's
// nesting is recursed into later).
json schema_of(const json& v, const char* field) {
  if (v.is_object() || v.is_boolean()) return v;
  json parsed;
  std::string error;
  if (v.is_string() && parse_json_body(v.get<std::string>(), parsed, error)) return parsed;
  bad_request(std::string("'") + field + "' must be a JSON Schema (an object, or its text)", field);
}

Constraint from_response_format(const json& f) {
  const char* field = "response_format";
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    bad_request("'response_format' must be an object with a string 'type'", field);
  const std::string type = f["type"].get<std::string>();
  if (type == "text") return nullptr;
  if (type == "json_object") return json_object();
  if (type != "json_schema")
    bad_request("response_format type '" + type +
                    "' is not supported (text, json_object and json_schema are)",
                field);
  if (!f.contains("json_schema") || !f["json_schema"].is_object() ||
      !f["json_schema"].contains("schema"))
    bad_request("response_format of type json_schema needs json_schema.schema", field);
  return constraint_for(schema_of(f["json_schema"]["schema"], field));
}

// vLLM's choice: a list of strings, one of which is the whole output.
Constraint choice_of(const json& v, const char* field) {
  std::vector<std::string> texts;
  if (v.is_array())
    for (const json& t : v) {
      if (!t.is_string()) break;
      texts.push_back(t.get<std::string>());
    }
  if (!v.is_array() || texts.size() != v.size() || texts.empty() ||
      std::any_of(texts.begin(), texts.end(), [](const std::string& t) { return t.empty(); }))
    bad_request(std::string("'") + field + "' must be a non-empty list of non-empty strings",
                field);
  return std::make_shared<const structured::JsonConstraint>(structured::JsonGrammar::choice(texts));
}

Constraint from_structured_outputs(const json& s) {
  const char* field = "structured_outputs";
  if (!s.is_object()) bad_request("'structured_outputs' must be an object", field);
  for (const char* kind : {"regex", "grammar", "structural_tag"})
    if (present(s, kind))
      bad_request(std::string("structured_outputs.") + kind +
                      " is not supported (json, json_object and choice are)",
                  field);
  if (present(s, "choice")) return choice_of(s["choice"], field);
  if (present(s, "json")) return constraint_for(schema_of(s["json"], field));
  if (get_bool(s, "json_object").value_or(false)) return json_object();
  return nullptr;
}

}  // namespace

Constraint parse_json_output(const json& b) {
  for (const char* field : {"guided_regex", "guided_grammar"})
    if (present(b, field)) bad_request(std::string(field) + " is not supported", field);
  std::vector<Constraint> asked;
  if (present(b, "response_format")) asked.push_back(from_response_format(b["response_format"]));
  if (present(b, "structured_outputs"))
    asked.push_back(from_structured_outputs(b["structured_outputs"]));
  if (present(b, "guided_choice")) asked.push_back(choice_of(b["guided_choice"], "guided_choice"));
  if (present(b, "guided_json"))
    asked.push_back(constraint_for(schema_of(b["guided_json"], "guided_json")));
  Constraint out;
  for (Constraint& c : asked) {
    if (!c) continue;
    if (out)
      bad_request("give one of response_format, structured_outputs and guided_json",
                  "response_format");
    out = std::move(c);
  }
  return out;
}

}  // namespace deltaserve::server
