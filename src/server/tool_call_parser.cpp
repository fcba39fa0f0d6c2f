#include "server/tool_call_parser.h"

#include <algorithm>

namespace deltaserve::server {

namespace {

constexpr std::string_view kCall = "<tool_call>", kCallEnd = "</tool_call>";
constexpr std::string_view kFunction = "<function=", kFunctionEnd = "</function>";
constexpr std::string_view kParam = "<parameter=", kParamEnd = "</parameter>";
constexpr size_t npos = std::string::npos;

std::string_view trim_newlines(std::string_view s) {
  while (!s.empty() && (s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string ToolCallParser::push(std::string_view text) {
  if (in_calls_) {
    calls_.append(text);
    scan(false);
    return "";
  }
  std::string all = std::move(held_);
  held_.clear();
  all.append(text);
  const size_t at = all.find(kCall);
  if (at != std::string::npos) {
    in_calls_ = true;
    calls_ = all.substr(at);
    scan(false);
    return all.substr(0, at);
  }
  for (size_t n = std::min(all.size(), kCall.size() - 1); n > 0; --n)
    if (std::string_view(all).substr(all.size() - n) == kCall.substr(0, n)) {
      held_ = all.substr(all.size() - n);
      return all.substr(0, all.size() - n);
    }
  return all;
}

std::vector<ToolCallDelta> ToolCallParser::take() {
  std::vector<ToolCallDelta> out(pieces_.begin() + static_cast<std::ptrdiff_t>(taken_),
                                 pieces_.end());
  taken_ = pieces_.size();
  return out;
}

std::string ToolCallParser::finish(std::vector<ToolCall>& calls) {
  std::string rest = std::move(held_);
  held_.clear();
  if (in_calls_) scan(true);
  calls.clear();
  for (const ToolCallDelta& p : pieces_) {
    if (!p.name.empty()) calls.push_back({p.name, ""});
    calls.back().arguments += p.arguments;
  }
  return rest;
}

void ToolCallParser::emit(std::string name, std::string arguments) {
  const int32_t index = name.empty() ? num_calls_ - 1 : num_calls_++;
  pieces_.push_back({index, std::move(name), std::move(arguments)});
}

void ToolCallParser::scan(bool final) {
  for (;;) {
    if (!in_call_) {
      const size_t at = calls_.find(kCall, pos_);
      if (at == npos) return;
      pos_ = at + kCall.size();
      in_call_ = true;
      named_ = false;
    }
    if (!named_) {
      const size_t end = calls_.find(kCallEnd, pos_), f = calls_.find(kFunction, pos_);
      const size_t gt = f == npos ? npos : calls_.find('>', f);
      // No whole name in this call (yet), or an empty one: no call.
      if (gt == npos || gt == f + kFunction.size() || (end != npos && gt > end)) {
        if (end == npos) return;
        pos_ = end + kCallEnd.size();
        in_call_ = false;
        continue;
      }
      function_ = calls_.substr(f + kFunction.size(), gt - f - kFunction.size());
      pos_ = gt + 1;
      named_ = true;
      keys_.clear();
      emit(function_, "");
    }
    if (!scan_arguments(final)) return;
  }
}

bool ToolCallParser::scan_arguments(bool final) {
  for (;;) {
    const size_t fe = calls_.find(kFunctionEnd, pos_), ce = calls_.find(kCallEnd, pos_);
    const size_t stop = std::min(fe, ce), p = calls_.find(kParam, pos_);
    const size_t gt = p == npos ? npos : calls_.find('>', p);
    if (p != npos && p < stop && (gt == npos || gt < stop)) {  // a parameter
      if (gt == npos && !final) return false;                  // its name is still coming
      if (gt != npos) {
        // A parameter left open ends at the next one, at </function> or at the end.
        const size_t close = calls_.find(kParamEnd, gt);
        size_t end = std::min({close, calls_.find(kParam, gt), stop});
        if (end == npos && !final) return false;
        if (end == npos) end = calls_.size();
        std::string key = calls_.substr(p + kParam.size(), gt - p - kParam.size());
        if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) {
          const json value = typed_value(
              function_, key,
              std::string(trim_newlines(std::string_view(calls_).substr(gt + 1, end - gt - 1))));
          emit("", (keys_.empty() ? "{" : ",") + dump_json(json(key)) + ":" + dump_json(value));
          keys_.push_back(std::move(key));
        }
        pos_ = end == close ? close + kParamEnd.size() : end;
        if (pos_ < calls_.size() || !final) continue;
      }
    } else if (stop == npos && !final) {
      return false;  // more parameters may come
    }
    emit("", keys_.empty() ? "{}" : "}");  // the call ends
    named_ = in_call_ = false;
    pos_ = ce != npos   ? ce + kCallEnd.size()
           : fe != npos ? fe + kFunctionEnd.size()
                        : calls_.size();
    return true;
  }
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

}  // namespace deltaserve::server
