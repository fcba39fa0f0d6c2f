#include "structured/json_grammar.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace deltaserve::structured {

using json = nlohmann::ordered_json;

namespace {

// Bounds on a schema, so that one request's grammar costs the engine thread bounded work a byte:
// nodes, nesting, and the lists a matcher state scans (enum values, an object's properties, anyOf
// alternatives).
constexpr int kMaxNodes = 10000;
constexpr int kMaxDepth = 64;
constexpr size_t kMaxListed = 1024, kMaxAlternatives = 64;

[[noreturn]] void refuse(const std::string& what) {
  throw Error("response_format: " + what, "response_format");
}

const std::set<std::string>& known_keywords() {
  static const std::set<std::string> k = {
      "type",    "properties",  "required", "additionalProperties",
      "items",   "minItems",    "maxItems", "enum",
      "const",   "anyOf",       "oneOf",    "$ref",
      "$defs",   "definitions", "title",    "description",
      "default", "examples",    "format",   "$schema",
      "$id",     "$comment",    "allOf"};
  return k;
}

bool annotation(const std::string& k) {
  return k == "title" || k == "description" || k == "default" || k == "examples" || k == "format" ||
         k == "$schema" || k == "$id" || k == "$comment" || k == "$defs" || k == "definitions";
}

// The body of the JSON string of `s`: what a model types between the quotes.
std::string escaped_key(const std::string& s) {
  const std::string quoted = json(s).dump();
  return quoted.substr(1, quoted.size() - 2);
}

int count_of(const json& s, const char* key) {
  if (!s.contains(key)) return -1;
  const json& v = s[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000000)
    refuse(std::string(key) + " must be a non-negative integer");
  return static_cast<int>(v.get<int64_t>());
}

}  // namespace

JsonGrammar::JsonGrammar() {
  add({});                                                            // any value
  add({.kind = NodeKind::kObject, .additional = 0});                  // any object
  add({.kind = NodeKind::kArray, .items = 0});                        // any array
  add({.kind = NodeKind::kLiterals, .literals = {"true", "false"}});  // boolean
  add({.kind = NodeKind::kLiterals, .literals = {"null"}});           // null
  add({.kind = NodeKind::kLiterals, .literals = {"true", "false", "null"}});
}

int JsonGrammar::add(SchemaNode n) {
  if (nodes_.size() >= kMaxNodes) refuse("the schema is too large");
  nodes_.push_back(std::move(n));
  return static_cast<int>(nodes_.size()) - 1;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::any_object() {
  static const std::shared_ptr<const JsonGrammar> g = [] {
    auto grammar = std::shared_ptr<JsonGrammar>(new JsonGrammar());
    grammar->root_ = grammar->any_object_node();
    return grammar;
  }();
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::choice(const std::vector<std::string>& texts) {
  if (texts.empty() || texts.size() > kMaxListed)
    throw Error("choice must be a list of 1 to " + std::to_string(kMaxListed) + " strings",
                "choice");
  for (const std::string& t : texts)
    if (t.empty()) throw Error("choice must not hold an empty string", "choice");
  auto g = std::shared_ptr<JsonGrammar>(new JsonGrammar());
  g->root_ = g->add({.kind = NodeKind::kLiterals, .literals = texts});
  g->exact_text_ = true;
  return g;
}

// Compiles a schema's nodes into a grammar; $refs resolve to a node allocated before the target
// compiles, so recursive schemas work.
class SchemaCompiler {
 public:
  SchemaCompiler(JsonGrammar& g, const json& root) : g_(g), root_(root) {}

  int compile(const json& s, int depth) {
    if (depth > kMaxDepth) refuse("the schema nests too deeply");
    if (s.is_boolean()) {
      if (!s.get<bool>()) refuse("the schema false (nothing matches) is not supported");
      return g_.any();
    }
    if (!s.is_object()) refuse("a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!known_keywords().count(it.key()))
        refuse("the JSON Schema keyword '" + it.key() + "' is not supported");
    if (s.contains("allOf")) return all_of(s, depth);
    if (s.contains("$ref")) return reference(s, depth);
    if (s.contains("anyOf") || s.contains("oneOf")) return any_of(s, depth);
    if (s.contains("const")) return literals(json::array({s["const"]}));
    if (s.contains("enum")) return literals(s["enum"]);
    if (s.contains("type")) return typed(s, depth);
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
      return object(s, depth);
    if (s.contains("items")) return array(s, depth);
    return g_.any();
  }

 private:
  int reference(const json& s, int depth) {
    if (!s["$ref"].is_string()) refuse("$ref must be a string");
    const std::string ref = s["$ref"].get<std::string>();
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != "$ref" && !annotation(it.key()))
        refuse("$ref beside '" + it.key() + "' is not supported");
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    const json* target = &root_;
    if (ref != "#") {
      std::string section;
      if (ref.rfind("#/$defs/", 0) == 0) section = "$defs";
      if (ref.rfind("#/definitions/", 0) == 0) section = "definitions";
      if (section.empty())
        refuse("$ref '" + ref + "': only \"#\" and \"#/$defs/NAME\" are supported");
      const std::string name = ref.substr(section.size() + 3);
      if (!root_.contains(section) || !root_[section].is_object() || !root_[section].contains(name))
        refuse("$ref '" + ref + "' names no definition");
      target = &root_[section][name];
    }
    // An anyOf of one alternative stands for the target until it is compiled.
    const int placeholder = g_.add({.kind = NodeKind::kAnyOf});
    refs_[ref] = placeholder;
    const int compiled = compile(*target, depth + 1);
    g_.nodes_[static_cast<size_t>(placeholder)].alternatives = {compiled};
    return placeholder;
  }

  // allOf of one schema (pydantic v1 wraps a described $ref so) is that schema.
  int all_of(const json& s, int depth) {
    const json& parts = s["allOf"];
    if (!parts.is_array() || parts.size() != 1)
      refuse("allOf is supported with exactly one schema");
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != "allOf" && !annotation(it.key()))
        refuse("allOf beside '" + it.key() + "' is not supported");
    return compile(parts[0], depth + 1);
  }

  int any_of(const json& s, int depth) {
    const json& alts = s.contains("anyOf") ? s["anyOf"] : s["oneOf"];
    if (!alts.is_array() || alts.empty()) refuse("anyOf / oneOf must be a non-empty list");
    if (alts.size() > kMaxAlternatives)
      refuse("anyOf / oneOf of more than " + std::to_string(kMaxAlternatives) + " alternatives");
    SchemaNode n{.kind = NodeKind::kAnyOf};
    json rest = s;
    rest.erase("anyOf");
    rest.erase("oneOf");
    for (const json& a : alts) {
      if (rest.contains("type") || rest.contains("properties") || rest.contains("enum"))
        refuse("anyOf / oneOf beside other constraints is not supported");
      n.alternatives.push_back(compile(a, depth + 1));
    }
    return g_.add(std::move(n));
  }

  int literals(const json& values) {
    if (!values.is_array() || values.empty()) refuse("enum must be a non-empty list");
    if (values.size() > kMaxListed)
      refuse("enum of more than " + std::to_string(kMaxListed) + " values");
    SchemaNode n{.kind = NodeKind::kLiterals};
    for (const json& v : values) n.literals.push_back(v.dump());
    return g_.add(std::move(n));
  }

  int typed(const json& s, int depth) {
    const json& t = s["type"];
    if (t.is_array()) {
      if (t.empty()) refuse("type must not be an empty list");
      SchemaNode n{.kind = NodeKind::kAnyOf};
      for (const json& one : t) {
        json single = s;
        single["type"] = one;
        n.alternatives.push_back(typed(single, depth));
      }
      return g_.add(std::move(n));
    }
    if (!t.is_string()) refuse("type must be a string or a list of strings");
    const std::string name = t.get<std::string>();
    if (name == "object") return object(s, depth);
    if (name == "array") return array(s, depth);
    if (name == "string") return g_.add({.kind = NodeKind::kString});
    if (name == "number") return g_.add({.kind = NodeKind::kNumber});
    if (name == "integer") return g_.add({.kind = NodeKind::kInteger});
    if (name == "boolean") return g_.boolean_node();
    if (name == "null") return g_.null_node();
    refuse("unknown type '" + name + "'");
  }

  int object(const json& s, int depth) {
    SchemaNode n{.kind = NodeKind::kObject};
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) refuse("properties must be an object");
      if (s["properties"].size() > kMaxListed)
        refuse("more than " + std::to_string(kMaxListed) + " properties in an object");
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
        std::string key = escaped_key(it.key());
        if (key.size() > kMaxKeyBytes)
          refuse("a property name longer than " + std::to_string(kMaxKeyBytes) + " bytes");
        n.properties.push_back({std::move(key), compile(it.value(), depth + 1), false});
      }
    }
    if (s.contains("required")) {
      if (!s["required"].is_array()) refuse("required must be a list of property names");
      for (const json& r : s["required"]) {
        const auto p =
            std::find_if(n.properties.begin(), n.properties.end(), [&](const Property& q) {
              return r.is_string() && q.key == escaped_key(r.get<std::string>());
            });
        if (p == n.properties.end())
          refuse("required names " + r.dump() + ", which is not among the properties");
        p->required = true;
      }
    }
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      n.additional = a.is_boolean() && !a.get<bool>() ? -1 : compile(a, depth + 1);
    } else if (!s.contains("properties")) {
      n.additional = g_.any();  // {"type": "object"} alone: any object
    }
    return g_.add(std::move(n));
  }

  int array(const json& s, int depth) {
    SchemaNode n{.kind = NodeKind::kArray};
    n.items = s.contains("items") ? compile(s["items"], depth + 1) : g_.any();
    n.min_items = std::max(count_of(s, "minItems"), 0);
    n.max_items = count_of(s, "maxItems");
    if (n.max_items >= 0 && n.max_items < n.min_items) refuse("maxItems is below minItems");
    return g_.add(std::move(n));
  }

  JsonGrammar& g_;
  const json& root_;
  std::map<std::string, int> refs_;
};

std::shared_ptr<const JsonGrammar> JsonGrammar::from_schema(const json& schema) {
  auto g = std::shared_ptr<JsonGrammar>(new JsonGrammar());
  SchemaCompiler c(*g, schema);
  g->root_ = c.compile(schema, 0);
  return g;
}

}  // namespace deltaserve::structured
