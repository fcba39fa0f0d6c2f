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

// Streamed: the name as soon as `<function=NAME>` is whole, each parameter as soon as it closes,
// the closing brace with </function>; the pieces add up to the whole reply's arguments, whatever
// the cut points.
TEST(ToolCallParser, CallsStreamAPieceAtATime) {
  ToolCallParser p(kTools);
  p.push("Sure.\n<tool_call>\n<function=get_wea");
  EXPECT_TRUE(p.take().empty()) << "the name is not whole yet";
  p.push("ther>\n<parameter=city>\nPar");
  std::vector<ToolCallDelta> d = p.take();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].index, 0);
  EXPECT_EQ(d[0].name, "get_weather");
  EXPECT_EQ(d[0].arguments, "");
  p.push("is\n</parameter>\n<parameter=days>\n3\n</para");
  d = p.take();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].arguments, R"({"city":"Paris")");
  p.push("meter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n</function>");
  d = p.take();
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0].arguments, R"(,"days":3)");
  EXPECT_EQ(d[1].arguments, "}");
  EXPECT_EQ(d[2].index, 1);
  EXPECT_EQ(d[2].name, "get_weather");
  EXPECT_EQ(d[3].arguments, "{}");
  std::vector<ToolCall> calls;
  p.finish(calls);
  EXPECT_TRUE(p.take().empty());
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].arguments, R"({"city":"Paris","days":3})");
  // Any cut points: the streamed pieces of each call are its whole arguments.
  const std::string text =
      "x<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n<parameter=city>"
      "\nRome\n</parameter>\n<parameter=days>\n9\n</parameter>\n</function>\n</tool_call>";
  for (size_t step = 1; step < 12; ++step) {
    ToolCallParser q(kTools);
    std::string args;
    for (size_t at = 0; at < text.size(); at += step) {
      q.push(text.substr(at, step));
      for (const ToolCallDelta& piece : q.take()) args += piece.arguments;
    }
    std::vector<ToolCall> whole;
    q.finish(whole);
    for (const ToolCallDelta& piece : q.take()) args += piece.arguments;
    EXPECT_EQ(args, R"({"days":2,"city":"Rome"})") << "step " << step << ": first value kept";
    ASSERT_EQ(whole.size(), 1u);
    EXPECT_EQ(whole[0].arguments, args);
  }
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
  for (const char* no_call : {"<tool_call>\n<function=get_wea",  // the name itself cut
                              "<tool_call>\n<function=>\n<parameter=a>\n1\n</parameter>"}) {
    ToolCallParser cut(kTools);
    std::vector<ToolCall> none;
    cut.push(no_call);
    cut.finish(none);
    EXPECT_TRUE(none.empty()) << no_call;
    EXPECT_TRUE(cut.take().empty()) << no_call;
  }
}

}  // namespace
}  // namespace deltaserve::server
