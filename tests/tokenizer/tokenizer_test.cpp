// The tokenizer against HF tokenizers on the real Qwen3 tokenizer.json (goldens in
// test_data/tokenizer/corpus.json, made by tools/make_tokenizer_goldens.py).
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/utf8.h"

namespace deltaserve::tokenizer {
namespace {

using json = nlohmann::json;

class Qwen3Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = deltaserve::testing::qwen3_tokenizer();
    ASSERT_TRUE(std::filesystem::exists(dir / "tokenizer.json"))
        << dir << " missing: run tools/fetch_tokenizer.sh (make test does)";
    tok_ = Tokenizer::from_file(dir / "tokenizer.json").release();
    std::ifstream in(deltaserve::testing::test_data() / "tokenizer" / "corpus.json");
    goldens_ = new json(json::parse(in));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete goldens_;
  }
  static Tokenizer* tok_;
  static json* goldens_;
};
Tokenizer* Qwen3Tokenizer::tok_ = nullptr;
json* Qwen3Tokenizer::goldens_ = nullptr;

TEST_F(Qwen3Tokenizer, IdsMatchHfOnCorpus) {
  int n = 0;
  for (const json& c : (*goldens_)["corpus"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok_->encode(text), c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    ++n;
  }
  EXPECT_GE(n, 40);
}

TEST_F(Qwen3Tokenizer, DecodeMatchesHfAndRoundTrips) {
  for (const json& c : (*goldens_)["corpus"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok_->decode(ids), c["decoded"].get<std::string>());
    EXPECT_EQ(tok_->decode(ids, true), c["decoded_skip_special"].get<std::string>());
  }
  for (const json& p : (*goldens_)["partial_decodes"])
    EXPECT_EQ(tok_->decode(p["ids"].get<std::vector<int32_t>>()), p["decoded"].get<std::string>());
}

TEST_F(Qwen3Tokenizer, DecodeOfEncodeIsIdentityForNfcText) {
  int identical = 0;
  for (const json& c : (*goldens_)["corpus"]) {
    const std::string text = c["text"];
    const std::string round = tok_->decode(tok_->encode(text));
    EXPECT_EQ(round, c["decoded"].get<std::string>());  // NFC(text)
    identical += round == text;
  }
  EXPECT_GE(identical, 38);  // all but the few non-NFC inputs come back byte for byte
}

TEST_F(Qwen3Tokenizer, SpecialTokens) {
  const auto ids = tok_->encode("<|im_start|>user\nhi<|im_end|>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(ids.back(), 151645);
  EXPECT_TRUE(tok_->is_special(151645));
  EXPECT_FALSE(tok_->is_special(tok_->token_to_id("<think>")));
  EXPECT_EQ(tok_->decode(ids, true), "user\nhi");
  // Not parsed as special: the text is tokenized as text.
  const auto plain = tok_->encode("<|im_end|>", false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok_->decode(plain), "<|im_end|>");
  EXPECT_THROW(tok_->decode(std::vector<int32_t>{tok_->vocab_size()}), Error);
  EXPECT_THROW(tok_->decode(std::vector<int32_t>{-1}), Error);
}

TEST_F(Qwen3Tokenizer, InvalidUtf8IsReplacedNotFatal) {
  const std::string bad = "ok \xff\xfe bad \xe4\xb8 cut \xc3";
  const auto ids = tok_->encode(bad);
  EXPECT_EQ(ids, tok_->encode(utf8_lossy(bad)));
  EXPECT_EQ(tok_->decode(ids), "ok \xEF\xBF\xBD\xEF\xBF\xBD bad \xEF\xBF\xBD cut \xEF\xBF\xBD");
}

TEST_F(Qwen3Tokenizer, StreamingEqualsFullDecodeForEveryPrefix) {
  for (const bool skip : {false, true}) {
    for (const json& c : (*goldens_)["corpus"]) {
      const auto ids = c["ids"].get<std::vector<int32_t>>();
      for (size_t n = 0; n <= ids.size(); ++n) {
        IncrementalDetokenizer d(*tok_, skip);
        std::string streamed;
        const std::span<const int32_t> prefix(ids.data(), n);
        const std::string full = tok_->decode(prefix, skip);
        for (int32_t id : prefix) {
          streamed += d.push(id);
          ASSERT_EQ(full.compare(0, streamed.size(), streamed), 0)
              << "emitted text that is not a prefix";
          ASSERT_TRUE(is_valid_utf8(streamed));
        }
        streamed += d.finish();
        ASSERT_EQ(streamed, full) << c["text"];
      }
    }
  }
  // Split multi-byte characters are held back until complete.
  const auto ids = (*goldens_)["partial_decodes"].back()["ids"].get<std::vector<int32_t>>();
  IncrementalDetokenizer d(*tok_, false);
  std::string s;
  for (int32_t id : ids) s += d.push(id);
  EXPECT_EQ(s + d.finish(), tok_->decode(ids));
  EXPECT_EQ(s.find("\xEF\xBF\xBD"), std::string::npos);
}

TEST(Utf8, LossyFollowsMaximalSubpartRule) {
  EXPECT_EQ(utf8_lossy("a\xE2\x82z"), "a\xEF\xBF\xBDz");  // truncated 3-byte: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xF0\x80\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: per byte
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  std::string out;
  EXPECT_EQ(append_utf8_lossy("ab\xE4\xB8", false, out), 2u);  // incomplete tail held back
  EXPECT_EQ(out, "ab");
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC3"));
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));
}

TEST(TokenizerFile, RejectsUnsupportedFiles) {
  deltaserve::testing::TempDir d;
  auto write = [&](const std::string& body) {
    std::ofstream(d.path() / "tokenizer.json") << body;
    return d.path() / "tokenizer.json";
  };
  EXPECT_THROW(Tokenizer::from_file(write("{nope")), Error);
  EXPECT_THROW(Tokenizer::from_file(d.path() / "missing.json"), Error);
  const std::string pre =
      R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "REGEX"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";
  auto with = [&](const std::string& regex, const std::string& model) {
    std::string p = pre;
    p.replace(p.find("REGEX"), 5, regex);
    return write("{" + p + ", \"model\": " + model + "}");
  };
  try {
    Tokenizer::from_file(with("(unclosed", R"({"type": "BPE", "vocab": {}, "merges": []})"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("regex rejected"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::from_file(with("\\\\s+", R"({"type": "WordPiece", "vocab": {}})")),
               Error);
  EXPECT_THROW(Tokenizer::from_file(
                   with("\\\\s+", R"({"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]]})")),
               Error);
  // A minimal valid one: merges apply by rank.
  auto t = Tokenizer::from_file(
      with("\\\\p{L}+|\\\\s+",
           R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4, "bc": 5},
                                        "merges": [["a", "b"], ["b", "c"], ["ab", "c"]]})"));
  EXPECT_EQ(t->encode("abc"), (std::vector<int32_t>{4}));
  EXPECT_EQ(t->encode("cab"), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(t->encode("bca"), (std::vector<int32_t>{5, 0}));
}

}  // namespace
}  // namespace deltaserve::tokenizer
