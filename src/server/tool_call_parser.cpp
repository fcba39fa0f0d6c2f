#include "server/tool_call_parser.h"

#include <algorithm>

namespace deltaserve::server {

namespace {

constexpr std::string_view kCall = "<tool_call>";

std::string_view trim_newlines(std::string_view s) {
  while (!s.empty() && (s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// The body of the call opening at or after `from` (up to </tool_call>, or to the end of a reply
// that ends inside it, as vLLM's parser reads a call cut by a stop token); empty when none.
std::string_view next_call(std::string_view s, size_t& from) {
  const size_t a = s.find(kCall, from);
  if (a == std::string_view::npos) return {};
  const size_t b = s.find("</tool_call>", a + kCall.size());
  const size_t end = b == std::string_view::npos ? s.size() : b;
  from = b == std::string_view::npos ? s.size() : b + 12;
  return s.substr(a + kCall.size(), end - a - kCall.size());
}

}  // namespace

std::string ToolCallParser::push(std::string_view text) {
  if (in_calls_) {
    calls_.append(text);
    return "";
  }
  std::string all = std::move(held_);
  held_.clear();
  all.append(text);
  const size_t at = all.find(kCall);
  if (at != std::string::npos) {
    in_calls_ = true;
    calls_ = all.substr(at);
    return all.substr(0, at);
  }
  for (size_t n = std::min(all.size(), kCall.size() - 1); n > 0; --n)
    if (std::string_view(all).substr(all.size() - n) == kCall.substr(0, n)) {
      held_ = all.substr(all.size() - n);
      return all.substr(0, all.size() - n);
    }
  return all;
}

std::string ToolCallParser::finish(std::vector<ToolCall>& calls) {
  std::string rest = std::move(held_);
  held_.clear();
  if (in_calls_) parse_calls(calls_, calls);
  return rest;
}

json ToolCallParser::typed_value(const std::string& function, const std::string& arg,
                                 std::string value) const {
  std::string type;
  if (tools_.is_array())
    for (const json& t : tools_) {
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
      const json& f = t["function"];
      if (!f.contains("name") || f["name"] != function) continue;
      if (f.contains("parameters") && f["parameters"].is_object() &&
          f["parameters"].contains("properties") && f["parameters"]["properties"].is_object() &&
          f["parameters"]["properties"].contains(arg) &&
          f["parameters"]["properties"][arg].is_object() &&
          f["parameters"]["properties"][arg].contains("type") &&
          f["parameters"]["properties"][arg]["type"].is_string())
        type = f["parameters"]["properties"][arg]["type"].get<std::string>();
    }
  if (type == "string") return value;
  json parsed;
  std::string error;
  if (type == "integer" || type == "number" || type == "boolean" || type == "object" ||
      type == "array" || type.empty())
    if (parse_json_body(value, parsed, error) && !parsed.is_string()) return parsed;
  return value;  // not valid JSON of the declared type: the text itself
}

void ToolCallParser::parse_calls(std::string_view text, std::vector<ToolCall>& calls) const {
  size_t pos = 0;
  while (pos < text.size()) {
    const std::string_view call = next_call(text, pos);
    if (call.empty()) return;
    size_t f = 0;
    const size_t name_at = call.find("<function=");
    if (name_at == std::string_view::npos) continue;
    const size_t name_end = call.find('>', name_at);
    if (name_end == std::string_view::npos) continue;
    ToolCall tc;
    tc.name = std::string(call.substr(name_at + 10, name_end - name_at - 10));
    json args = json::object();
    f = name_end + 1;
    for (;;) {  // a parameter left open ends at the next one, at </function> or at the end
      const size_t p = call.find("<parameter=", f);
      if (p == std::string_view::npos) break;
      const size_t pe = call.find('>', p);
      if (pe == std::string_view::npos) break;
      const size_t close = call.find("</parameter>", pe);
      const size_t end = std::min({close, call.find("<parameter=", pe), call.find("</function>", pe),
                                   call.size()});
      const std::string arg(call.substr(p + 11, pe - p - 11));
      args[arg] =
          typed_value(tc.name, arg, std::string(trim_newlines(call.substr(pe + 1, end - pe - 1))));
      f = end == close ? close + 12 : end;
    }
    tc.arguments = dump_json(args);
    calls.push_back(std::move(tc));
  }
}

}  // namespace deltaserve::server
