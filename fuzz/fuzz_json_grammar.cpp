// The structured-output grammar on arbitrary schemas and documents. Input: a schema's text, a NUL
// byte, then document bytes (no NUL: JSON mode's grammar). A schema outside the subset must be
// refused with deltaserve::Error, never crash; the document goes through the matcher byte by
// byte, where a byte the state absorbs must leave its key unchanged (the token masks' walk relies
// on it), and a document the matcher takes as complete must be JSON once decoded as a client gets
// it (strings are matched as bytes: a broken UTF-8 sequence reaches the client as U+FFFD).
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "structured/json_grammar.h"
#include "structured/json_matcher.h"
#include "tokenizer/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltaserve;
  using json = nlohmann::ordered_json;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  std::shared_ptr<const structured::JsonGrammar> g = structured::JsonGrammar::any_object();
  std::string doc = input;
  if (nul != std::string::npos) {
    doc = input.substr(nul + 1);
    const json schema = json::parse(input.substr(0, nul), nullptr, false);
    if (schema.is_discarded()) return 0;
    try {
      g = structured::JsonGrammar::from_schema(schema);
    } catch (const Error&) {
      return 0;
    }
  }
  structured::JsonMatcher m(g);
  for (char c : doc) {
    const auto b = static_cast<uint8_t>(c);
    const bool absorbs = m.absorbs(b);
    const std::string before = absorbs ? m.key() : "";
    m = m.advance(b);
    if (m.dead()) return 0;
    if (absorbs && m.key() != before) __builtin_trap();
  }
  if (!m.complete()) return 0;
  try {
    if (json::parse(tokenizer::utf8_lossy(doc)).is_discarded()) __builtin_trap();
  } catch (const json::out_of_range&) {  // a number beyond a double: still JSON
  } catch (const json::parse_error&) {
    __builtin_trap();
  }
  return 0;
}
