#include "server/tool_choice.h"

#include <vector>

#include "server/request_fields.h"

namespace deltaserve::server {

namespace {

// The function names of a request's tools (entries without one are skipped).
std::vector<std::string> tool_names(const json& tools) {
  std::vector<std::string> names;
  if (!tools.is_array()) return names;
  for (const json& t : tools)
    if (t.is_object() && t.contains("function") && t["function"].is_object() &&
        t["function"].contains("name") && t["function"]["name"].is_string())
      names.push_back(t["function"]["name"].get<std::string>());
  return names;
}

std::string named_function(const json& c) {
  if (c.is_object() && c.contains("function") && c["function"].is_object() &&
      c["function"].contains("name") && c["function"]["name"].is_string() &&
      (!c.contains("type") || c["type"] == "function"))
    return c["function"]["name"].get<std::string>();
  bad_request(
      "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
      "\"function\": {\"name\": ...}}",
      "tool_choice");
}

}  // namespace

ToolChoice parse_tool_choice(const json& b, bool tool_call_parser) {
  const bool has_tools = present(b, "tools") && b["tools"].is_array() && !b["tools"].empty();
  ToolChoice out;
  if (!present(b, "tool_choice")) {
    if (has_tools && tool_call_parser) out.kind = ToolChoiceKind::kAuto;
    return out;
  }
  const json& c = b["tool_choice"];
  if (c == "none") return out;
  if (c == "auto") {
    if (!tool_call_parser)
      bad_request(
          "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be "
          "set",
          "tool_choice");
    out.kind = has_tools ? ToolChoiceKind::kAuto : ToolChoiceKind::kNone;
    return out;
  }
  out.kind = c == "required" ? ToolChoiceKind::kRequired : ToolChoiceKind::kNamed;
  if (out.kind == ToolChoiceKind::kNamed) out.name = named_function(c);
  if (!has_tools) bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice");
  const std::vector<std::string> names = tool_names(b["tools"]);
  if (names.empty()) bad_request("tools must name their functions", "tools");
  if (out.kind == ToolChoiceKind::kNamed &&
      std::find(names.begin(), names.end(), out.name) == names.end())
    bad_request("Tool '" + out.name + "' has not been passed in `tools`.", "tool_choice");
  return out;
}

void force_tool_call(const ToolChoice& choice, const json& tools, const tokenizer::Tokenizer& tok,
                     bool prompt_opens_think, engine::SamplingParams& p) {
  if (!choice.forces_call()) return;
  const std::vector<std::string> names = choice.kind == ToolChoiceKind::kNamed
                                             ? std::vector<std::string>{choice.name}
                                             : tool_names(tools);
  for (const std::string& name : names)
    p.forced_prefixes.push_back(tok.encode("<tool_call>\n<function=" + name + ">\n"));
  p.constrain_after = prompt_opens_think ? tok.token_to_id("</think>") : -1;
}

}  // namespace deltaserve::server
