// A JSON value constraint for structured outputs (response_format): a JSON Schema compiled into a
// table of nodes, "any JSON object" for JSON mode, or a choice of exact texts. Matched byte by byte
// by JsonMatcher.
//
// The schema subset (what OpenAI's strict structured outputs and pydantic emit): type (a name or a
// list of names), properties / required / additionalProperties, items / minItems / maxItems, enum,
// const, anyOf (oneOf is taken as anyOf), allOf of one schema, $ref to "#", "#/$defs/..." or
// "#/definitions/...", and the annotations (title, description, default, examples, format, $schema,
// $id, $comment). Any other keyword is refused with an Error naming it, never ignored. An object
// without additionalProperties takes no other keys: the strict reading OpenAI's structured outputs
// ask for (JSON Schema's default would allow any).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace deltaserve::structured {

// The longest key a document may type (a declared property's name, escaped, included).
constexpr size_t kMaxKeyBytes = 256;

enum class NodeKind { kAny, kObject, kArray, kString, kNumber, kInteger, kLiterals, kAnyOf };

struct Property {
  std::string key;  // as the JSON string's body: escaped, without the quotes
  int node = 0;
  bool required = false;
};

struct SchemaNode {
  NodeKind kind = NodeKind::kAny;
  std::vector<Property> properties{};   // kObject
  int additional = -1;                  // kObject: the schema of other keys' values; -1: none
  int items = -1;                       // kArray
  int min_items = 0, max_items = -1;    // kArray; -1: no limit
  std::vector<std::string> literals{};  // kLiterals: compact JSON texts (enum / const, true, ...)
  std::vector<int> alternatives{};      // kAnyOf
};

class JsonGrammar {
 public:
  // JSON mode: any JSON object.
  static std::shared_ptr<const JsonGrammar> any_object();
  // vLLM's choice: the output is exactly one of these texts (no JSON quoting, no whitespace
  // around). Throws deltaserve::Error for an empty list or an empty text.
  static std::shared_ptr<const JsonGrammar> choice(const std::vector<std::string>& texts);
  // Throws deltaserve::Error (param "response_format") for a schema outside the subset.
  static std::shared_ptr<const JsonGrammar> from_schema(const nlohmann::ordered_json& schema);

  const SchemaNode& node(int i) const { return nodes_[static_cast<size_t>(i)]; }
  int root() const { return root_; }
  // True for a choice grammar: the root's literals are the whole output.
  bool exact_text() const { return exact_text_; }
  // Built-in nodes: any value, and the object / array / literals an any-value opens.
  int any() const { return 0; }
  int any_object_node() const { return 1; }
  int any_array_node() const { return 2; }
  int boolean_node() const { return 3; }
  int null_node() const { return 4; }
  int any_literal_node() const { return 5; }

 private:
  friend class SchemaCompiler;
  JsonGrammar();
  int add(SchemaNode n);
  std::vector<SchemaNode> nodes_;
  int root_ = 0;
  bool exact_text_ = false;
};

}  // namespace deltaserve::structured
