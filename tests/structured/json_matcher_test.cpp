// The JSON grammar, its byte-level matcher and the token masks: documents accepted and refused,
// schemas compiled and refused, the trie's masks against a brute-force check of every token, and
// random walks that must never reach a state with no way on.
#include "structured/json_matcher.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "structured/json_grammar.h"
#include "structured/token_mask.h"

namespace deltaserve::structured {
namespace {

using json = nlohmann::ordered_json;

bool accepts(const std::shared_ptr<const JsonGrammar>& g, std::string_view doc) {
  const JsonMatcher m = JsonMatcher(g).advance(doc);
  return !m.dead() && m.complete();
}
bool viable(const std::shared_ptr<const JsonGrammar>& g, std::string_view prefix) {
  return !JsonMatcher(g).advance(prefix).dead();
}
std::shared_ptr<const JsonGrammar> schema(const char* text) {
  return JsonGrammar::from_schema(json::parse(text));
}

TEST(JsonMatcher, JsonModeTakesObjectsOnly) {
  const auto g = JsonGrammar::any_object();
  EXPECT_TRUE(accepts(g, "{}"));
  EXPECT_TRUE(accepts(g, R"({"a": 1, "b": [true, null, -1.5e3, "x\n\u00e9"], "c": {"d": {}}})"));
  EXPECT_TRUE(accepts(g, "{\n  \"k\" : 0.25E-2 ,\"\" :\"\"\n}"));
  EXPECT_FALSE(viable(g, "[]"));
  EXPECT_FALSE(viable(g, "{\"a\" 1"));
  EXPECT_FALSE(viable(g, "{\"a\":01"));
  EXPECT_FALSE(viable(g, "{,"));
  EXPECT_FALSE(viable(g, "{} "));  // nothing after the document
  EXPECT_FALSE(viable(g, "{\"a\":\"\x01"));
  EXPECT_FALSE(viable(g, "{\"a\":\"\\q"));
  EXPECT_FALSE(viable(g, "{\"a\":tx"));
  EXPECT_TRUE(viable(g, "{\"a\":tru"));
  EXPECT_FALSE(accepts(g, "{\"a\":tru"));
  EXPECT_FALSE(accepts(g, "{\"a\":1"));
}

TEST(JsonMatcher, BoundsWhitespaceNumbersAndNesting) {
  const auto g = JsonGrammar::any_object();
  EXPECT_TRUE(viable(g, "{" + std::string(kMaxWhitespace, ' ')));
  EXPECT_FALSE(viable(g, "{" + std::string(kMaxWhitespace + 1, ' ')));
  EXPECT_TRUE(viable(g, "{\"a\":" + std::string(kMaxNumberBytes, '1')));
  EXPECT_FALSE(viable(g, "{\"a\":" + std::string(kMaxNumberBytes + 1, '1')));
  std::string deep = "{\"a\":";
  for (int i = 1; i < kMaxNesting; ++i) deep += "[";
  EXPECT_TRUE(viable(g, deep));
  EXPECT_FALSE(viable(g, deep + "["));
}

TEST(JsonMatcher, SchemaObjectsTakeTheirPropertiesOnly) {
  const auto g = schema(R"({"type": "object", "properties": {"name": {"type": "string"},
      "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b c", 7]},
      "maxItems": 2}}, "required": ["name", "age"]})");
  EXPECT_TRUE(accepts(g, R"({"name": "x", "age": 3})"));
  EXPECT_TRUE(accepts(g, R"({"age": -3, "tags": ["b c", 7], "name": ""})"));
  EXPECT_FALSE(viable(g, R"({"name": "x"})"));  // age is required
  EXPECT_FALSE(viable(g, R"({"nam)"
                         "x"));                           // no such key
  EXPECT_FALSE(viable(g, R"({"name": "x", "name")"));     // a key twice
  EXPECT_FALSE(viable(g, R"({"age": 1.5)"));              // an integer
  EXPECT_FALSE(viable(g, R"({"age": 1, "name": 2)"));     // a string
  EXPECT_FALSE(viable(g, R"({"tags": ["a", "a", "a")"));  // at most two
  EXPECT_FALSE(viable(g, R"({"tags": ["c")"));            // not in the enum
  EXPECT_TRUE(viable(g, R"({"tags": [7)"));
  EXPECT_FALSE(viable(g, R"({"tags": [77)"));
}

TEST(JsonMatcher, SchemaAnyOfRefsAndConst) {
  // A tree (recursive $ref), a nullable field, a const.
  const auto g = schema(R"({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
      "properties": {"v": {"type": ["number", "null"]}, "kind": {"const": "leaf"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "minItems": 1}},
      "required": ["v"], "additionalProperties": false}}})");
  EXPECT_TRUE(accepts(g, R"({"v": null})"));
  EXPECT_TRUE(accepts(g, R"({"v": 2.5, "kids": [{"v": 1, "kind": "leaf"}, {"v": null}]})"));
  EXPECT_FALSE(viable(g, R"({"v": 1, "kids": [])"));  // minItems
  EXPECT_FALSE(viable(g, R"({"v": 1, "kind": "lea",)"));
  EXPECT_FALSE(viable(g, R"({"v": nul1)"));
  // Extra keys where additionalProperties allows them, with the declared ones typed as theirs.
  const auto open = schema(R"({"properties": {"a": {"type": "integer"}},
      "additionalProperties": {"type": "string"}})");
  EXPECT_TRUE(accepts(open, R"({"b": "x", "a": 1})"));
  EXPECT_FALSE(viable(open, R"({"a": "x")"));
  EXPECT_FALSE(viable(open, R"({"b": 1)"));
}

TEST(JsonMatcher, ChoiceIsExactlyOneOfTheTexts) {
  const auto g = JsonGrammar::choice({"yes", "no", "yes, but", "\"q\""});
  EXPECT_TRUE(accepts(g, "yes"));
  EXPECT_TRUE(accepts(g, "yes, but"));
  EXPECT_TRUE(accepts(g, "\"q\""));
  EXPECT_TRUE(viable(g, "yes, b"));
  EXPECT_FALSE(accepts(g, "yes, b"));
  EXPECT_FALSE(viable(g, " yes"));  // nothing around the text
  EXPECT_FALSE(viable(g, "yes "));
  EXPECT_FALSE(viable(g, "maybe"));
  EXPECT_THROW(JsonGrammar::choice({}), Error);
  EXPECT_THROW(JsonGrammar::choice({"a", ""}), Error);
}

// anyOf alternatives that read the same bytes multiply with nesting: bounded work a byte.
TEST(JsonMatcher, ReadingsThatMultiplyAreBounded) {
  const auto g = schema(R"({"$ref": "#/$defs/A", "$defs": {"A": {"anyOf": [
      {"type": "array", "items": {"$ref": "#/$defs/A"}}, {"type": "array", "items": {"$ref": "#/$defs/A"}},
      {"type": "array", "items": {"$ref": "#/$defs/A"}}, {"type": "null"}]}}})");
  std::string doc(20, '[');
  EXPECT_TRUE(viable(g, doc));  // 3^20 readings without the bound
  EXPECT_TRUE(accepts(g, doc + "null" + std::string(20, ']')));
}

TEST(JsonMatcher, SchemasOutsideTheSubsetAreRefused) {
  for (const char* bad :
       {R"({"type": "string", "pattern": "a+"})", R"({"type": "wat"})",
        R"({"properties": {"a": {}}, "required": ["b"]})", R"({"$ref": "#/$defs/Missing"})",
        R"({"$ref": "http://x/y"})", R"({"type": "array", "minItems": 3, "maxItems": 2})",
        R"(false)", R"({"enum": []})", R"({"anyOf": [{}], "type": "string"})", R"(3)"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(JsonGrammar::from_schema(json::parse(bad)), Error);
  }
  json many_values = json::array(), many_properties = json::object(), many_alternatives;
  for (int i = 0; i < 1025; ++i) {
    many_values.push_back(i);
    many_properties["p" + std::to_string(i)] = json::object();
  }
  for (int i = 0; i < 65; ++i) many_alternatives["anyOf"].push_back({{"const", i}});
  EXPECT_THROW(JsonGrammar::from_schema({{"enum", many_values}}), Error);
  EXPECT_THROW(JsonGrammar::from_schema({{"properties", many_properties}}), Error);
  EXPECT_THROW(JsonGrammar::from_schema(many_alternatives), Error);
  EXPECT_THROW(JsonGrammar::choice(std::vector<std::string>(1025, "x")), Error);
  // A name no document could type (keys are bounded).
  EXPECT_THROW(JsonGrammar::from_schema(
                   {{"properties", {{std::string(kMaxKeyBytes + 1, 'k'), json::object()}}}}),
               Error);
  EXPECT_TRUE(accepts(JsonGrammar::from_schema(
                          {{"properties", {{std::string(kMaxKeyBytes, 'k'), json::object()}}}}),
                      "{\"" + std::string(kMaxKeyBytes, 'k') + "\": 1}"));
  many_values.erase(0);
  EXPECT_NO_THROW(JsonGrammar::from_schema({{"enum", many_values}}));  // 1,024: the limit
  EXPECT_NO_THROW(JsonGrammar::from_schema(json::parse(
      R"({"title": "T", "description": "d", "type": "string", "format": "date-time"})")));
  // pydantic v1's described reference: allOf of one schema is that schema; of two, refused.
  const auto wrapped = schema(R"({"properties": {"c": {"allOf": [{"$ref": "#/definitions/C"}],
      "description": "a colour"}}, "required": ["c"], "definitions": {"C": {"enum": ["r", "g"]}}})");
  EXPECT_TRUE(accepts(wrapped, R"({"c": "g"})"));
  EXPECT_FALSE(viable(wrapped, R"({"c": "b)"));
  EXPECT_THROW(JsonGrammar::from_schema(json::parse(R"({"allOf": [{}, {}]})")), Error);
  EXPECT_THROW(JsonGrammar::from_schema(json::parse(R"({"allOf": [{}], "type": "string"})")),
               Error);
}

// A small vocabulary with the bytes JSON turns on, alone and inside longer tokens.
std::vector<std::string> test_vocab() {
  std::vector<std::string> v = {
      "{",    "}",        "\"",       "\"a",  "a\"",       ":",   ",",    " ",     "  ",   "\n",
      "1",    "12",       "-",        "0",    ".5",        "e",   "E+",   "true",  "tr",   "ue",
      "null", "fal",      "se",       "[",    "]",         "\\",  "\\n",  "\\u00", "e9",   "x",
      "\"}",  "\"},",     "\":",      "\": ", ", \"",      "{\"", "[{",   "}]",    "]}",   "\"name",
      "age",  "\"age\":", "tags",     "b c",  "7",         "\"b", " c\"", "leaf",  "kind", "v",
      "kids", "\x01",     "\xc3\xa9", "",     "<|im_end|>"};
  for (char c = 0x20; c < 0x7f; ++c) v.emplace_back(1, c);  // every byte, as a BPE vocabulary has
  v.emplace_back("\t");
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\":, \n0123456789.-eE+truefalsnbc\\";
  for (int i = 0; i < 200; ++i) {
    std::string t;
    for (int n = 1 + static_cast<int>(rng() % 4); n > 0; --n)
      t += alphabet[rng() % alphabet.size()];
    v.push_back(t);
  }
  v.back() = "";  // a special token: no bytes, never allowed
  return v;
}

std::vector<int32_t> brute_force(const std::vector<std::string>& vocab, const JsonMatcher& m) {
  std::vector<int32_t> out;
  for (size_t t = 0; t < vocab.size(); ++t)
    if (!vocab[t].empty() && !m.advance(vocab[t]).dead()) out.push_back(static_cast<int32_t>(t));
  return out;
}

// nlohmann's parser, counting a number too large for a double (valid JSON) as parsed.
bool parses(const std::string& doc) {
  try {
    if (json::parse(doc).is_discarded()) return false;
  } catch (const json::out_of_range&) {
  } catch (const json::parse_error&) {
    return false;
  }
  return true;
}

// Random walks over the vocabulary: at every step the trie's mask equals the brute-force one, the
// cached mask equals a fresh one, and the walk is never stuck (something allowed, or complete).
void random_walks(const std::shared_ptr<const JsonGrammar>& g, int walks, uint32_t seed) {
  const std::vector<std::string> vocab = test_vocab();
  const VocabTrie trie(vocab);
  MaskCache cache;
  std::mt19937 rng(seed);
  int completed = 0;
  for (int w = 0; w < walks; ++w) {
    JsonMatcher m(g);
    std::string doc;
    for (int step = 0; step < 60; ++step) {
      const TokenMask mask = trie.mask(m);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < static_cast<int32_t>(vocab.size()); ++t)
        if (mask.allows(t)) allowed.push_back(t);
      ASSERT_EQ(allowed, brute_force(vocab, m)) << "after " << doc;
      const std::shared_ptr<const TokenMask> cached = cache.mask(trie, m);  // hit or miss
      ASSERT_EQ(cached->complement, mask.complement) << "after " << doc;
      ASSERT_EQ(cached->ids, mask.ids) << "after " << doc;
      ASSERT_TRUE(!allowed.empty() || m.complete()) << "stuck after " << doc;
      if (m.complete() && (allowed.empty() || rng() % 4 == 0)) {
        EXPECT_TRUE(parses(doc)) << doc;
        ++completed;
        break;
      }
      const int32_t t = allowed[rng() % allowed.size()];
      doc += vocab[static_cast<size_t>(t)];
      m = m.advance(vocab[static_cast<size_t>(t)]);
    }
  }
  EXPECT_GT(completed, 0);
}

TEST(TokenMask, TrieMasksMatchBruteForceAndWalksNeverStick) {
  random_walks(JsonGrammar::any_object(), 150, 1);
  random_walks(schema(R"({"type": "object", "properties": {"name": {"type": "string"},
      "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b c", 7]},
      "maxItems": 2}}, "required": ["age"]})"),
               150, 2);
  random_walks(schema(R"({"anyOf": [{"type": "number"}, {"type": "array", "items": {"type":
      "boolean"}}]})"),
               150, 3);
}

}  // namespace
}  // namespace deltaserve::structured
