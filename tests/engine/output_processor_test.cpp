// The output processor: several tokens per request per step (speculative verification), stopping
// at the first that ends the request; stop strings across tokens; held-back text.
#include "engine/output_processor.h"

#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve::engine {
namespace {

class OutputProcessorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ =
        tokenizer::Tokenizer::from_file(deltaserve::testing::qwen3_tokenizer() / "tokenizer.json");
  }
  Request request(SamplingParams p) {
    Request r;
    r.id = 1;
    r.tokens = tok_->encode("Hi");
    r.num_prompt = static_cast<int32_t>(r.tokens.size());
    r.params = std::move(p);
    r.detok = std::make_unique<tokenizer::IncrementalDetokenizer>(*tok_, false);
    return r;
  }
  std::vector<SampledToken> tokens(const std::string& text) {
    std::vector<SampledToken> out;
    for (int32_t id : tok_->encode(text)) out.push_back({id, {id, -0.5f, {}}});
    return out;
  }
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

TEST_F(OutputProcessorTest, SeveralTokensInOneStep) {
  SamplingParams p;
  p.max_tokens = 100;
  p.logprobs = true;
  Request r = request(p);
  const OutputProcessor proc({151645}, 4096);
  const auto t = tokens(" the quick brown fox");
  const ProcessedOutput out = proc.process(r, t);
  EXPECT_EQ(out.finish, FinishReason::kNone);
  EXPECT_EQ(out.tokens_taken, static_cast<int32_t>(t.size()));
  EXPECT_EQ(out.delta.text, " the quick brown fox");
  EXPECT_EQ(out.delta.token_ids.size(), t.size());
  EXPECT_EQ(out.delta.logprobs.size(), t.size());
  EXPECT_EQ(out.delta.completion_tokens, static_cast<int32_t>(t.size()));
}

TEST_F(OutputProcessorTest, StopsAtTheFirstTokenThatEndsTheRequest) {
  SamplingParams p;
  p.max_tokens = 100;
  Request r = request(p);
  const OutputProcessor proc({151645}, 4096);
  std::vector<SampledToken> t = tokens(" one two");
  t.insert(t.begin() + 1, SampledToken{151645, {}});  // EOS after the first token
  const ProcessedOutput out = proc.process(r, t);
  EXPECT_EQ(out.finish, FinishReason::kStop);
  EXPECT_EQ(out.tokens_taken, 2) << "tokens after the stop are dropped";
  EXPECT_EQ(r.num_outputs(), 2);
  // max_tokens in the middle of a multi-token step.
  p.max_tokens = 2;
  Request s = request(p);
  const ProcessedOutput cut = proc.process(s, tokens(" a b c d"));
  EXPECT_EQ(cut.finish, FinishReason::kLength);
  EXPECT_EQ(cut.tokens_taken, 2);
}

TEST_F(OutputProcessorTest, StopStringAcrossTokensAndHeldBackText) {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop = {"brown fox"};
  Request r = request(p);
  const OutputProcessor proc({151645}, 4096);
  const ProcessedOutput first = proc.process(r, tokens(" the quick brown"));
  EXPECT_EQ(first.finish, FinishReason::kNone);
  EXPECT_EQ(first.delta.text.find("brown"), std::string::npos)
      << "text that may begin the stop string is held back: " << first.delta.text;
  const ProcessedOutput second = proc.process(r, tokens(" fox jumps"));
  EXPECT_EQ(second.finish, FinishReason::kStop);
  EXPECT_EQ(first.delta.text + second.delta.text, " the quick ");
}

}  // namespace
}  // namespace deltaserve::engine
