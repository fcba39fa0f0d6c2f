// Jinja values and the Python-compatible conversions the evaluator (jinja.cpp) needs: truthiness,
// str() / repr() of JSON values, tojson, strip / split, int(). Internal to the tokenizer library.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tokenizer/jinja.h"

namespace deltaserve::tokenizer::jinja {

[[noreturn]] void fail(const std::string& message);

// A Jinja value: JSON (insertion-ordered), undefined, a namespace or a macro.
struct Value {
  enum class K { kUndef, kJson, kNs, kMacro } k = K::kUndef;
  Json j;
  std::shared_ptr<Json> ns;
  const Node* macro = nullptr;
  static Value of(Json v) {
    Value r;
    r.k = K::kJson;
    r.j = std::move(v);
    return r;
  }
  bool undefined() const { return k == K::kUndef; }
  bool is_string() const { return k == K::kJson && j.is_string(); }
  const Json& json() const {
    static const Json kNull;
    return k == K::kJson ? j : k == K::kNs ? *ns : kNull;
  }
};

bool truthy(const Value& v);
// Code points of a UTF-8 string (what Python's len() counts).
size_t utf8_length(const std::string& s);
// Python's str() of a float.
std::string py_float(double d);
// tojson: Python json.dumps formatting (", " and ": " separators; indent when > 0).
void dump_json(const Json& j, int indent, int depth, std::string& out);
// Python's str() of a JSON value (repr() of nested strings).
std::string py_str(const Json& j, bool nested = false);
std::string to_str(const Value& v);
std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right);
// str.split(sep) (whitespace runs when sep is null or undefined).
Json py_split(const std::string& s, const Value* sep);
int64_t to_int(const Value& v, const char* what);

}  // namespace deltaserve::tokenizer::jinja
