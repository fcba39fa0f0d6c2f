// The qwen3_coder tool-call parser: content before the call streams, a tag cut across deltas is
// held back, arguments are typed by the tool's schema, several calls, malformed blocks.
#include "server/tool_call_parser.h"

#include <gtest/gtest.h>

namespace deltaserve::server {
namespace {

const json kTools = json::parse(R"([{"type":"function","function":{"name":"get_weather",
  "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},
  "metric":{"type":"boolean"},"where":{"type":"object"}}}}}])");

TEST(ToolCallParser, ContentStreamsAndArgumentsFollowTheSchema) {
  ToolCallParser p(kTools);
  std::string content = p.push("Let me check.\n<tool_");
  EXPECT_EQ(content, "Let me check.\n") << "the cut tag is held back";
  content += p.push("call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n");
  content += p.push("<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n");
  content += p.push("<parameter=where>\n{\"lat\": 1.5}\n</parameter>\n</function>\n</tool_call>");
  std::vector<ToolCall> calls;
  content += p.finish(calls);
  EXPECT_EQ(content, "Let me check.\n");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(calls[0].arguments),
            json::parse(R"({"city":"42","days":3,"metric":true,"where":{"lat":1.5}})"))
      << calls[0].arguments;
}

TEST(ToolCallParser, SeveralCallsAndTextWithoutCalls) {
  ToolCallParser p(json(nullptr));
  std::vector<ToolCall> calls;
  p.push(
      "<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=b>\n</function>\n</tool_call>");
  EXPECT_EQ(p.finish(calls), "");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].arguments, R"({"x":1})");  // no schema: JSON when it parses
  EXPECT_EQ(calls[1].name, "b");
  EXPECT_EQ(calls[1].arguments, "{}");
  ToolCallParser plain(kTools);
  std::vector<ToolCall> none;
  std::string text = plain.push("no calls <tool");
  text += plain.finish(none);
  EXPECT_EQ(text, "no calls <tool");
  EXPECT_TRUE(none.empty());
}

TEST(ToolCallParser, AnUnfinishedCallIsReadToTheEndAsVllmReadsIt) {
  ToolCallParser p(kTools);
  std::vector<ToolCall> calls;
  p.push("<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n<parameter=city>\nPar");
  p.finish(calls);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].arguments, R"({"days":2,"city":"Par"})");
  ToolCallParser cut(kTools);  // the function's name itself cut: no call
  std::vector<ToolCall> none;
  cut.push("<tool_call>\n<function=get_wea");
  cut.finish(none);
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace deltaserve::server
