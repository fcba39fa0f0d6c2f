// Request fields deltaserve does not implement are refused with a 400 naming the field (never
// silently ignored); the supported neighbours are accepted.
#include "server/completion_request.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"

namespace deltaserve::server {
namespace {

class CompletionRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto dir = deltaserve::testing::qwen3_tokenizer();
    tok_ = tokenizer::Tokenizer::from_file(dir / "tokenizer.json");
    chat_ = tokenizer::ChatTemplate::from_config(dir / "tokenizer_config.json");
  }
  // The refused field's name (the 400's param, "" when the error names none), or "accepted".
  std::string refused(const std::string& body, bool chat) {
    const RequestContext ctx{*tok_, chat_.get(), "m", 1024, false};
    try {
      parse_completion_request(json::parse(body), chat, ctx);
      return "accepted";
    } catch (const Error& e) {
      return e.param();
    }
  }
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<tokenizer::ChatTemplate> chat_;
};

TEST_F(CompletionRequestTest, UnsupportedFieldsAreRefusedByName) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(refused("{" + msgs + R"(,"response_format":{"type":"json_object"}})", true),
            "response_format");
  EXPECT_EQ(refused("{" + msgs + R"(,"logit_bias":{"x":10}})", true), "logit_bias");
  EXPECT_EQ(refused("{" + msgs + R"(,"logit_bias":{"999999999":1}})", true), "logit_bias");
  EXPECT_EQ(refused("{" + msgs + R"(,"logit_bias":{"5":1000}})", true), "");  // out of [-100, 100]
  EXPECT_EQ(refused("{" + msgs + R"(,"stream_options":{"include_usage":true}})", true),
            "stream_options");
  EXPECT_EQ(refused("{" + msgs + R"(,"tool_choice":"auto"})", true), "tool_choice");
  EXPECT_EQ(refused("{" + msgs + R"(,"tool_choice":"required"})", true), "tool_choice");
  EXPECT_EQ(refused(R"({"prompt":"hi","suffix":"x"})", false), "suffix");
}

TEST_F(CompletionRequestTest, SupportedNeighboursAreAccepted) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(refused("{" + msgs + R"(,"response_format":{"type":"text"},"logit_bias":{"5":-3.5}})", true),
            "accepted");
  EXPECT_EQ(refused("{" + msgs + R"(,"stream":true,"stream_options":{"include_usage":true}})", true),
            "accepted");
  EXPECT_EQ(refused("{" + msgs + R"(,"tool_choice":"none"})", true), "accepted");
}

}  // namespace
}  // namespace deltaserve::server
