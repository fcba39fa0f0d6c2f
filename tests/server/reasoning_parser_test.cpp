// The Qwen3 reasoning parser: tags split across deltas, a prompt that opened <think>, thinking off,
// a reply cut inside the reasoning.
#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

#include <vector>

namespace deltaserve::server {
namespace {

ReasoningParser::Pieces feed(ReasoningParser& p, const std::vector<std::string>& deltas) {
  ReasoningParser::Pieces all;
  for (const std::string& d : deltas) {
    const auto got = p.push(d);
    all.reasoning += got.reasoning;
    all.content += got.content;
  }
  const auto rest = p.finish();
  all.reasoning += rest.reasoning;
  all.content += rest.content;
  return all;
}

TEST(ReasoningParser, SplitsThinkBlockEvenWhenTagsAreSplitAcrossDeltas) {
  ReasoningParser p(false);
  const auto got =
      feed(p, {"<thi", "nk>\nsix ", "times seven</th", "ink>", "\n\nThe answer", " is 42."});
  EXPECT_EQ(got.reasoning, "\nsix times seven");
  EXPECT_EQ(got.content, "The answer is 42.");
}

TEST(ReasoningParser, PromptThatOpenedThinkStartsInTheReasoning) {
  ReasoningParser p(true);
  const auto got = feed(p, {"plan", " it</think>\n\nDone."});
  EXPECT_EQ(got.reasoning, "plan it");
  EXPECT_EQ(got.content, "Done.");
}

TEST(ReasoningParser, ThinkingOffIsAllContentAndACutReasoningStaysReasoning) {
  ReasoningParser off(false);
  const auto c = feed(off, {"  Hello", " <b>there</b> <thinking"});
  EXPECT_EQ(c.reasoning, "");
  EXPECT_EQ(c.content, "  Hello <b>there</b> <thinking");
  ReasoningParser cut(true);
  const auto r = feed(cut, {"still thinking </thi"});
  EXPECT_EQ(r.reasoning, "still thinking </thi");
  EXPECT_EQ(r.content, "");
}

TEST(ReasoningParser, KnowsWhetherAPromptLeavesThinkOpen) {
  EXPECT_TRUE(ReasoningParser::prompt_opens_think("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(
      ReasoningParser::prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ReasoningParser::prompt_opens_think("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace deltaserve::server
