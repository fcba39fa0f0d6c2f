#include "tokenizer/jinja_values.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace deltaserve::tokenizer::jinja {

void fail(const std::string& m) { throw Error("chat template: " + m); }

bool truthy(const Value& v) {
  if (v.k == Value::K::kUndef) return false;
  if (v.k != Value::K::kJson) return true;
  const Json& j = v.j;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>() != 0;
  if (j.is_number()) return j.get<double>() != 0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();
  return !j.empty();
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string py_float(double d) {
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (std::isnan(d)) return "nan";
  std::string s = Json(d).dump();
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// Python's json.dumps(x, ensure_ascii=False) (with indent when >= 0), as HF's tojson filter.
void dump_json(const Json& j, int indent, int depth, std::string& out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  if (j.is_string()) {
    out += '"';
    for (unsigned char c : j.get_ref<const std::string&>()) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
          } else {
            out += static_cast<char>(c);
          }
      }
    }
    out += '"';
  } else if (j.is_object() || j.is_array()) {
    const bool obj = j.is_object();
    out += obj ? '{' : '[';
    if (j.empty()) {
      out += obj ? '}' : ']';
      return;
    }
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out += indent < 0 ? ", " : ",";
      first = false;
      newline(depth + 1);
      if (obj) {
        dump_json(Json(it.key()), indent, depth + 1, out);
        out += ": ";
      }
      dump_json(it.value(), indent, depth + 1, out);
    }
    newline(depth);
    out += obj ? '}' : ']';
  } else if (j.is_boolean()) {
    out += j.get<bool>() ? "true" : "false";
  } else if (j.is_null()) {
    out += "null";
  } else if (j.is_number_float()) {
    const double d = j.get<double>();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float(d);
  } else {
    out += j.dump();
  }
}

// Python's str() of a value, which is what {{ x }} prints.
std::string py_str(const Json& j, bool nested) {
  if (j.is_string()) {
    if (!nested) return j.get<std::string>();
    std::string s = "'";
    for (char c : j.get_ref<const std::string&>())
      s += c == '\'' ? "\\'" : c == '\n' ? "\\n" : std::string(1, c);
    return s + "'";
  }
  if (j.is_boolean()) return j.get<bool>() ? "True" : "False";
  if (j.is_null()) return "None";
  if (j.is_number_float()) return py_float(j.get<double>());
  if (j.is_number()) return j.dump();
  std::string s = j.is_object() ? "{" : "[";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) s += ", ";
    first = false;
    if (j.is_object()) s += py_str(Json(it.key()), true) + ": ";
    s += py_str(it.value(), true);
  }
  return s + (j.is_object() ? "}" : "]");
}

std::string to_str(const Value& v) { return v.undefined() ? "" : py_str(v.json()); }

std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && chars.find(s[b]) != std::string::npos) ++b;
  if (right)
    while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

Json py_split(const std::string& s, const Value* sep) {
  Json out = Json::array();
  if (!sep || sep->json().is_null()) {
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
      size_t j = i;
      while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j > i) out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string d = sep->json().get<std::string>();
  if (d.empty()) fail("split: empty separator");
  size_t i = 0;
  for (;;) {
    const size_t j = s.find(d, i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + d.size();
  }
  return out;
}

int64_t to_int(const Value& v, const char* what) {
  if (!v.json().is_number()) fail(std::string(what) + " must be a number");
  return v.json().is_number_integer() ? v.json().get<int64_t>()
                                      : static_cast<int64_t>(v.json().get<double>());
}

}  // namespace deltaserve::tokenizer::jinja
