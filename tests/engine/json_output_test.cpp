// JSON outputs (response_format) in the engine: JsonOutput's masks as sampling bias / bans and its
// replacement of ruled-out tokens on a small vocabulary, then the embedded default model with the
// real Qwen3 tokenizer — random weights, so only the constraint makes its output a document.
#include "engine/json_output.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/engine_fixtures.h"
#include "engine/output_constraint.h"
#include "model/loader.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve::engine {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const structured::JsonConstraint> constraint(const char* schema) {
  return std::make_shared<const structured::JsonConstraint>(
      structured::JsonGrammar::from_schema(json::parse(schema)));
}

// Ids 0-7: bytes that open / fill / close {"a": true}; 8 an end token (no bytes).
const std::vector<std::string> kVocab = {"{", "\"a\"", ":", " true", "}", "x", "\"", "true}", ""};
constexpr int32_t kEnd = 8;

TEST(JsonOutput, MaskBecomesBiasOrBansAndRuledOutTokensAreReplaced) {
  const structured::VocabTrie trie(kVocab);
  const std::vector<int32_t> ends = {kEnd};
  JsonOutput out(constraint(R"({"properties": {"a": {"type": "boolean"}}, "required": ["a"],
                              "additionalProperties": false})"),
                 /*constrain_after=*/5);
  backend::SampleSpec s;
  out.restrict(trie, ends, s);
  EXPECT_TRUE(s.bias.empty() && s.banned.empty());  // before token 5: unconstrained
  EXPECT_EQ(out.choose(trie, ends, 4), 4);
  out.take(5, kVocab[5]);  // the constraint starts after this one
  out.restrict(trie, ends, s);
  ASSERT_EQ(s.bias.size(), 1u);  // one token of nine allowed: the bias form
  EXPECT_EQ(s.bias[0].first, 0);
  EXPECT_EQ(s.bias[0].second, kForcedBias);
  EXPECT_EQ(out.choose(trie, ends, 4), 0);     // '}' ruled out: replaced by '{'
  EXPECT_EQ(out.choose(trie, ends, kEnd), 0);  // no end before the document is complete
  for (int32_t t : {0, 1, 2, 7}) {
    EXPECT_EQ(out.choose(trie, ends, t), t);
    EXPECT_FALSE(out.complete());
    out.take(t, kVocab[static_cast<size_t>(t)]);
  }
  EXPECT_TRUE(out.complete());
  EXPECT_EQ(out.choose(trie, ends, kEnd), kEnd);
  EXPECT_EQ(out.choose(trie, ends, 0), kEnd);  // nothing may follow the document
  backend::SampleSpec done;
  out.restrict(trie, ends, done);
  ASSERT_EQ(done.bias.size(), 1u);
  EXPECT_EQ(done.bias[0].first, kEnd);
}

TEST(JsonOutput, AWideMaskBecomesBansOfTheRest) {
  // Inside a string every token but the quote-bearing ones and the end token may come next.
  std::vector<std::string> vocab = {"{\"k\":\"", "\"}", "\""};
  for (int i = 0; i < 20; ++i) vocab.push_back("w" + std::to_string(i));
  vocab.push_back("");  // the end token
  const structured::VocabTrie trie(vocab);
  const int32_t end = static_cast<int32_t>(vocab.size()) - 1;
  JsonOutput out(constraint(R"({"type": "object", "additionalProperties": {"type": "string"}})"),
                 -1);
  out.take(0, vocab[0]);
  backend::SampleSpec s;
  out.restrict(trie, std::vector<int32_t>{end}, s);
  EXPECT_TRUE(s.bias.empty());
  EXPECT_EQ(s.banned, (std::vector<int32_t>{0, end}));  // '{"k":"' inside a string; the end
}

// The embedded default model (random weights) with the real Qwen3 tokenizer.
class JsonOutputEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = model::load_model("", model::LoadFormat::kDummy, be_, false);
    tok_ =
        tokenizer::Tokenizer::from_file(deltaserve::testing::qwen3_tokenizer() / "tokenizer.json");
    EngineConfig cfg;
    cfg.max_model_len = 512;
    engine_ = std::make_unique<Engine>(*model_, cfg, tok_.get());
  }
  backend::CpuBackend be_;
  std::unique_ptr<model::Qwen35Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
};

// The embedded model: every JSON request ends its document (the schema bounds its length) and
// the document matches the schema; an unconstrained request beside them is untouched.
TEST_F(JsonOutputEngine, RandomWeightsStillAnswerTheSchema) {
  const auto c = constraint(R"({"type": "object", "properties": {"ok": {"type": "boolean"},
      "n": {"type": "integer"}, "color": {"enum": ["red", "green", "dark blue"]}},
      "required": ["ok", "n", "color"], "additionalProperties": false})");
  const std::vector<int32_t> prompt = tok_->encode("Answer in JSON.");
  SamplingParams free_params = greedy(20);
  const Result free_alone = collect(*engine_->submit({prompt, free_params}));
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (uint64_t seed = 0; seed < 3; ++seed) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = seed;
    p.max_tokens = 400;
    p.json = c;
    streams.push_back(engine_->submit({prompt, p}));
  }
  SamplingParams greedy_json = greedy(400);
  greedy_json.ignore_eos = false;
  greedy_json.json = c;
  streams.push_back(engine_->submit({prompt, greedy_json}));
  const auto free_stream = engine_->submit({prompt, free_params});
  for (auto& s : streams) {
    const Result r = collect(*s);
    ASSERT_EQ(r.reason, FinishReason::kStop) << r.text;
    const json doc = json::parse(r.text);
    ASSERT_TRUE(doc.is_object()) << r.text;
    EXPECT_EQ(doc.size(), 3u) << r.text;
    EXPECT_TRUE(doc.at("ok").is_boolean()) << r.text;
    EXPECT_TRUE(doc.at("n").is_number_integer()) << r.text;
    const std::string color = doc.at("color").get<std::string>();
    EXPECT_TRUE(color == "red" || color == "green" || color == "dark blue") << r.text;
  }
  EXPECT_EQ(collect(*free_stream).tokens, free_alone.tokens);
}

// JSON mode: whatever the model writes is the start of a JSON object (a long string may run
// into max_tokens), and a finished one parses.
TEST_F(JsonOutputEngine, JsonModeOutputIsAlwaysAnObjectSoFar) {
  const auto c =
      std::make_shared<const structured::JsonConstraint>(structured::JsonGrammar::any_object());
  for (uint64_t seed = 10; seed < 13; ++seed) {
    SamplingParams p;
    p.seed = seed;
    p.max_tokens = 60;
    p.json = c;
    const Result r = collect(*engine_->submit({tok_->encode("Reply as JSON."), p}));
    const std::string bytes = tok_->decode(r.tokens);
    EXPECT_FALSE(structured::JsonMatcher(c->grammar).advance(bytes).dead()) << bytes;
    if (r.reason == FinishReason::kStop) EXPECT_TRUE(json::accept(r.text)) << r.text;
  }
}

}  // namespace
}  // namespace deltaserve::engine
