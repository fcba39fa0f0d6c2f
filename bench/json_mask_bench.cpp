// Host cost of structured outputs a decode step: the real tokenizer's vocabulary trie, then a
// schema-shaped document tokenized and walked token by token, timing each step's mask (the
// engine's work before sampling) with a cold cache (a new grammar's first request) and a warm one
// (the same walk again: states seen before). Prints one JSON line: medians, p90 and max in us, and
// how the masks went to the sampler (bias entries for small allowed sets, bans for large ones).
// Usage: json_mask_bench TOKENIZER_DIR [ROUNDS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "structured/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace deltaserve;
using clock_type = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

double us_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t).count();
}

json quantiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) { return v[static_cast<size_t>(q * (v.size() - 1))]; };
  return {{"median", at(0.5)}, {"p90", at(0.9)}, {"max", v.back()}};
}

// A pydantic-style schema: nested objects, a list of objects, enums, numbers, free text.
const char* kSchema = R"({"$defs": {"Item": {"type": "object", "properties": {
  "name": {"type": "string"}, "price": {"type": "number"}, "tags": {"type": "array",
  "items": {"type": "string"}}}, "required": ["name", "price", "tags"],
  "additionalProperties": false}}, "type": "object", "properties": {"order_id": {"type":
  "integer"}, "status": {"enum": ["pending", "shipped", "delivered"]}, "customer": {"type":
  "object", "properties": {"name": {"type": "string"}, "email": {"type": ["string", "null"]}},
  "required": ["name", "email"], "additionalProperties": false}, "items": {"type": "array",
  "items": {"$ref": "#/$defs/Item"}}, "note": {"type": "string"}}, "required": ["order_id",
  "status", "customer", "items", "note"], "additionalProperties": false})";

const char* kDocument = R"doc({
  "order_id": 48213,
  "status": "shipped",
  "customer": {"name": "Ada Lovelace", "email": null},
  "items": [
    {"name": "Analytical engine gear", "price": 12.5, "tags": ["brass", "spare part"]},
    {"name": "Punched cards (box of 500)", "price": 3.25, "tags": ["paper"]}
  ],
  "note": "Leave the parcel at the reception desk; the customer will collect it after 5 pm."
})doc";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TOKENIZER_DIR [ROUNDS]\n", argv[0]);
    return 2;
  }
  try {
    const auto tok = tokenizer::Tokenizer::from_file(std::string(argv[1]) + "/tokenizer.json");
    const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
    auto t = clock_type::now();
    std::vector<std::string> bytes(static_cast<size_t>(tok->vocab_size()));
    for (int32_t id = 0; id < tok->vocab_size(); ++id)
      if (!tok->is_special(id)) bytes[static_cast<size_t>(id)] = tok->token_bytes(id);
    const structured::VocabTrie trie(bytes);
    const double trie_ms = us_since(t) / 1000;
    const std::vector<int32_t> ids = tok->encode(kDocument, false);
    json out{{"bench", "json_mask"},
             {"vocab", tok->vocab_size()},
             {"trie_build_ms", trie_ms},
             {"document_tokens", ids.size()}};
    for (const bool with_schema : {true, false}) {
      std::vector<double> cold, warm, compile_us;
      size_t biased = 0, banned = 0;
      for (int r = 0; r < rounds; ++r) {
        t = clock_type::now();
        const auto grammar = with_schema
                                 ? structured::JsonGrammar::from_schema(json::parse(kSchema))
                                 : structured::JsonGrammar::any_object();
        compile_us.push_back(us_since(t));
        structured::JsonConstraint c(grammar);
        for (std::vector<double>* times : {&cold, &warm}) {
          structured::JsonMatcher m(grammar);
          for (int32_t id : ids) {
            t = clock_type::now();
            const auto mask = c.masks.mask(trie, m);
            times->push_back(us_since(t));
            if (!mask->allows(id)) throw Error("the document left the grammar at a token");
            (mask->complement ? banned : biased) += mask->ids.size();
            m = m.advance(tok->token_bytes(id));
          }
          if (!m.complete()) throw Error("the document is not complete");
        }
      }
      const double steps = 2.0 * rounds * static_cast<double>(ids.size());
      out[with_schema ? "schema" : "json_object"] = {{"compile_us", quantiles(compile_us)},
                                                     {"cold_step_us", quantiles(cold)},
                                                     {"warm_step_us", quantiles(warm)},
                                                     {"bias_entries_a_step", biased / steps},
                                                     {"ban_entries_a_step", banned / steps}};
    }
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "json_mask_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
