// A small Jinja2 interpreter for chat templates: the subset HF chat templates use (if/elif/else,
// for with loop.*, set incl. namespace attributes, macros, break/continue, filters, tests, string
// and dict methods, slicing), rendered with trim_blocks and lstrip_blocks as HF renders them.
// NOTE: written here because no maintained C++ Jinja library is packaged in Debian 12.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace deltaserve::tokenizer::jinja {

using Json = nlohmann::ordered_json;

struct Node;

class Template {
 public:
  // Parses `source`; throws deltaserve::Error ("chat template: ...") on syntax it does not know.
  explicit Template(const std::string& source);
  ~Template();
  Template(Template&&) noexcept;

  // Renders with the given variables (an object). Throws deltaserve::Error for template runtime
  // errors, including raise_exception().
  std::string render(const Json& vars) const;

 private:
  std::unique_ptr<Node> root_;
};

}  // namespace deltaserve::tokenizer::jinja
