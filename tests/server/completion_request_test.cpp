// Request fields deltaserve does not implement are refused with a 400 naming the field (never
// silently ignored); the supported neighbours are accepted.
#include "server/completion_request.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "server/tool_choice.h"
#include "test_util.h"
#include "tokenizer/chat_template_source.h"

namespace deltaserve::server {
namespace {

class CompletionRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto dir = deltaserve::testing::qwen3_tokenizer();
    tok_ = tokenizer::Tokenizer::from_file(dir / "tokenizer.json");
    chat_ = tokenizer::load_chat_template(dir);
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
  EXPECT_EQ(refused("{" + msgs + R"(,"response_format":{"type":"yaml"}})", true),
            "response_format");
  EXPECT_EQ(refused("{" + msgs + R"(,"response_format":{"type":"json_schema"}})", true),
            "response_format");  // no schema
  EXPECT_EQ(refused("{" + msgs + R"(,"response_format":{"type":"json_schema","json_schema":
    {"schema":{"type":"string","minLength":3}}}})",
                    true),
            "response_format");  // outside the subset
  EXPECT_EQ(refused("{" + msgs + R"(,"structured_outputs":{"regex":"a+"}})", true),
            "structured_outputs");
  EXPECT_EQ(refused("{" + msgs + R"(,"guided_choice":["a",""]})", true), "guided_choice");
  EXPECT_EQ(refused("{" + msgs + R"(,"structured_outputs":{"choice":"a"}})", true),
            "structured_outputs");
  EXPECT_EQ(refused("{" + msgs + R"(,"guided_grammar":"root ::= x"})", true), "guided_grammar");
  EXPECT_EQ(refused("{" + msgs + R"(,"guided_json":"{not json"})", true), "guided_json");
  // A schema's text nested past the body parser's bounds (its recursion would overflow the stack).
  EXPECT_EQ(refused("{" + msgs + R"(,"guided_json":")" + std::string(200000, '[') +
                        std::string(200000, ']') + "\"}",
                    true),
            "guided_json");
  EXPECT_EQ(
      refused("{" + msgs + R"(,"guided_json":{},"response_format":{"type":"json_object"}})", true),
      "response_format");  // two at once
  EXPECT_EQ(
      refused("{" + msgs + R"(,"response_format":{"type":"json_object"},"ignore_eos":true})", true),
      "");
  EXPECT_EQ(refused("{" + msgs + R"(,"logit_bias":{"x":10}})", true), "logit_bias");
  EXPECT_EQ(refused("{" + msgs + R"(,"logit_bias":{"999999999":1}})", true), "logit_bias");
  EXPECT_EQ(refused("{" + msgs + R"(,"logit_bias":{"5":1000}})", true), "");  // out of [-100, 100]
  EXPECT_EQ(refused("{" + msgs + R"(,"stream_options":{"include_usage":true}})", true),
            "stream_options");
  EXPECT_EQ(refused("{" + msgs + R"(,"tool_choice":"auto"})", true), "tool_choice");  // no parser
  EXPECT_EQ(refused(R"({"prompt":"hi","suffix":"x"})", false), "suffix");
}

TEST_F(CompletionRequestTest, SupportedNeighboursAreAccepted) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(
      refused("{" + msgs + R"(,"response_format":{"type":"text"},"logit_bias":{"5":-3.5}})", true),
      "accepted");
  EXPECT_EQ(
      refused("{" + msgs + R"(,"stream":true,"stream_options":{"include_usage":true}})", true),
      "accepted");
  EXPECT_EQ(refused("{" + msgs + R"(,"tool_choice":"none"})", true), "accepted");
}

const std::string kTools = R"("tools":[{"type":"function","function":{"name":"get_weather"}},
  {"type":"function","function":{"name":"get_time"}}])";
const std::string kMsgs = R"("messages":[{"role":"user","content":"hi"}])";
using Prefixes = std::vector<std::vector<int32_t>>;

TEST_F(CompletionRequestTest, JsonOutputsBecomeAGrammar) {
  const RequestContext ctx{*tok_, chat_.get(), "m", 1024, false};
  const auto parse = [&](const std::string& fields) {
    return parse_completion_request(json::parse("{" + kMsgs + "," + fields + "}"), true, ctx)
        .generate.params;
  };
  EXPECT_EQ(parse(R"("response_format":{"type":"text"})").json, nullptr);
  const auto object = parse(R"("response_format":{"type":"json_object"})");
  ASSERT_NE(object.json, nullptr);
  EXPECT_EQ(object.json->grammar, structured::JsonGrammar::any_object());
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"integer"}}})";
  const auto a = parse(R"("response_format":{"type":"json_schema","json_schema":{"name":"x",
    "schema":)" + schema +
                       "}}");
  const auto b = parse(R"("structured_outputs":{"json":)" + schema + "}");
  const auto c = parse(R"("guided_json":")" + json(schema).dump().substr(1));
  ASSERT_NE(a.json, nullptr);
  EXPECT_EQ(a.json, b.json);  // one compiled grammar (and mask cache) for one schema
  EXPECT_EQ(a.json, c.json);
  EXPECT_EQ(a.json->grammar->node(a.json->grammar->root()).kind, structured::NodeKind::kObject);
  EXPECT_EQ(a.constrain_after, -1);
  // A prompt that leaves <think> open (Qwen3.5's template, thinking on): after the model's
  // </think>.
  const tokenizer::ChatTemplate opens(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "<|im_start|>assistant\n<think>\n",
      tokenizer::jinja::Json::object());
  const RequestContext thinking{*tok_, &opens, "m", 1024, false};
  const auto after = parse_completion_request(
      json::parse("{" + kMsgs + R"(,"response_format":{"type":"json_object"}})"), true, thinking);
  EXPECT_TRUE(after.prompt_opens_think);
  EXPECT_EQ(after.generate.params.constrain_after, tok_->token_to_id("</think>"));
  EXPECT_GE(after.generate.params.constrain_after, 0);
  for (const auto& p : {parse(R"("structured_outputs":{"choice":["yes","no"]})"),
                        parse(R"("guided_choice":["yes","no"])")}) {
    ASSERT_NE(p.json, nullptr);
    EXPECT_TRUE(p.json->grammar->exact_text());
    EXPECT_EQ(p.json->grammar->node(p.json->grammar->root()).literals,
              (std::vector<std::string>{"yes", "no"}));
  }
}

TEST_F(CompletionRequestTest, ToolChoiceRequiredOrNamedNeedsItsTools) {
  EXPECT_EQ(refused("{" + kMsgs + R"(,"tool_choice":"required"})", true), "tool_choice");
  EXPECT_EQ(refused("{" + kMsgs + "," + kTools + R"(,"tool_choice":{"type":"function",
    "function":{"name":"get_date"}}})",
                    true),
            "tool_choice");
  EXPECT_EQ(refused("{" + kMsgs + "," + kTools + R"(,"tool_choice":{"type":"function"}})", true),
            "tool_choice");
  EXPECT_EQ(refused("{" + kMsgs + "," + kTools + R"(,"tool_choice":"sometimes"})", true),
            "tool_choice");
  EXPECT_EQ(refused("{" + kMsgs + "," + kTools + R"(,"tool_choice":"required"})", true),
            "accepted");
}

TEST_F(CompletionRequestTest, ToolChoiceForcesTheQwenToolCallOpening) {
  const RequestContext ctx{*tok_, chat_.get(), "m", 1024, false};
  auto parse = [&](const std::string& extra) {
    return parse_completion_request(json::parse("{" + kMsgs + "," + kTools + extra + "}"), true,
                                    ctx);
  };
  const auto opening = [&](const std::string& name) {
    return tok_->encode("<tool_call>\n<function=" + name + ">\n");
  };
  // Thinking off: the template closes <think>, so the call is forced from the first token.
  const std::string off = R"(,"chat_template_kwargs":{"enable_thinking":false})";
  const CompletionRequest named =
      parse(R"(,"tool_choice":{"type":"function","function":{"name":"get_time"}})" + off);
  EXPECT_TRUE(named.tool_calls);
  EXPECT_TRUE(named.named_tool_choice);
  EXPECT_EQ(named.generate.params.forced_prefixes, Prefixes{opening("get_time")});
  EXPECT_EQ(named.generate.params.constrain_after, -1);
  // "required": one opening per tool (Qwen3's template leaves no <think> open: from the start).
  const CompletionRequest required = parse(R"(,"tool_choice":"required")");
  EXPECT_TRUE(required.tool_calls);
  EXPECT_FALSE(required.named_tool_choice);
  EXPECT_FALSE(required.prompt_opens_think);
  EXPECT_EQ(required.generate.params.forced_prefixes,
            (Prefixes{opening("get_weather"), opening("get_time")}));
  EXPECT_EQ(required.generate.params.constrain_after, -1);
  // A prompt that leaves <think> open (Qwen3.5's template, thinking on): after the model's
  // </think>.
  engine::SamplingParams p;
  force_tool_call({ToolChoiceKind::kNamed, "get_time"}, json::parse("[" + kTools.substr(9)), *tok_,
                  true, p);
  EXPECT_EQ(p.forced_prefixes, Prefixes{opening("get_time")});
  EXPECT_EQ(p.constrain_after, tok_->token_to_id("</think>"));
  EXPECT_GE(p.constrain_after, 0);
  // "none" and (without the server's parser) no tool_choice: nothing forced, nothing parsed.
  for (const std::string extra : {std::string(R"(,"tool_choice":"none")"), std::string()}) {
    const CompletionRequest free = parse(extra);
    EXPECT_FALSE(free.tool_calls);
    EXPECT_TRUE(free.generate.params.forced_prefixes.empty());
  }
}

TEST_F(CompletionRequestTest, NTimesAListOfPromptsGivesPromptMajorChoices) {
  const RequestContext ctx{*tok_, chat_.get(), "m", 1024, false};
  const auto r = parse_completion_requests(
      json::parse(R"({"prompt":["a b","c",[11,12,13]],"n":2,"seed":7,"max_tokens":3})"), false,
      ctx);
  ASSERT_EQ(r.choices.size(), 6u);
  EXPECT_EQ(r.choices[0].generate.prompt_ids, r.choices[1].generate.prompt_ids);
  EXPECT_NE(r.choices[1].generate.prompt_ids, r.choices[2].generate.prompt_ids);
  EXPECT_EQ(r.choices[4].generate.prompt_ids, (std::vector<int32_t>{11, 12, 13}));
  EXPECT_EQ(*r.choices[0].generate.params.seed, 7u);
  EXPECT_EQ(*r.choices[1].generate.params.seed, 8u);
  int32_t once = 0;
  for (size_t i = 0; i < r.choices.size(); i += 2) once += r.choices[i].prompt_tokens;
  EXPECT_EQ(r.prompt_tokens, once);  // each prompt counted once, not n times
  // One list of token ids, and one string in a list, are each a single prompt.
  EXPECT_EQ(
      parse_completion_requests(json::parse(R"({"prompt":[1,2]})"), false, ctx).choices.size(), 1u);
  EXPECT_EQ(
      parse_completion_requests(json::parse(R"({"prompt":["x"]})"), false, ctx).choices.size(), 1u);
}

TEST_F(CompletionRequestTest, BadNAndBadPromptListsAreRefused) {
  const RequestContext ctx{*tok_, chat_.get(), "m", 1024, false};
  auto param = [&](const std::string& body, bool chat) {
    try {
      parse_completion_requests(json::parse(body), chat, ctx);
      return std::string("accepted");
    } catch (const Error& e) {
      return e.param();
    }
  };
  EXPECT_EQ(param(R"({"prompt":"x","n":0})", false), "n");
  EXPECT_EQ(param(R"({"prompt":"x","n":129})", false), "n");
  EXPECT_EQ(param(R"({"prompt":["x","y",3]})", false), "prompt");
  EXPECT_EQ(param(R"({"prompt":[[1],[]]})", false), "prompt");
  EXPECT_EQ(param(R"({"messages":[{"role":"user","content":"hi"}],"n":3})", true), "accepted");
}

// Sampling fields a request leaves out come from the generation config (as vLLM's
// --generation-config auto); the request's own win; max_new_tokens caps max_tokens.
TEST_F(CompletionRequestTest, GenerationConfigDefaultsFillWhatARequestLeavesOut) {
  RequestContext ctx{*tok_, chat_.get(), "m", 1024, false};
  ctx.defaults = generation_defaults_of(
      json::parse(R"({"temperature": 0.6, "top_k": 20, "max_new_tokens": 100})"), json(), "g");
  const auto params = [&](const std::string& body, bool chat) {
    return parse_completion_request(json::parse(body), chat, ctx).generate.params;
  };
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  engine::SamplingParams p = params("{" + msgs + "}", true);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_EQ(p.max_tokens, 100);  // the rest of the context, capped
  p = params("{" + msgs + R"(,"temperature":0,"top_k":-1,"max_tokens":7})", true);
  EXPECT_FLOAT_EQ(p.temperature, 0.0f);
  EXPECT_EQ(p.top_k, -1);
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_EQ(params(R"({"prompt":"hi","max_tokens":500})", false).max_tokens, 100);
  EXPECT_EQ(params(R"({"prompt":"hi"})", false).max_tokens, 16);
  ctx.defaults = {};
  p = params("{" + msgs + "}", true);
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.max_tokens, 1024 - static_cast<int32_t>(parse_completion_request(
                                                          json::parse("{" + msgs + "}"), true, ctx)
                                                          .generate.prompt_ids.size()));
}

// --default-chat-template-kwargs renders every chat request, each request's own kwargs over it
// (Qwen3's template: enable_thinking false closes an empty think block after the prompt).
TEST_F(CompletionRequestTest, ServerChatTemplateKwargsAreDefaultsRequestsOverride) {
  RequestContext ctx{*tok_, chat_.get(), "m", 1024, false};
  const auto prompt = [&](const std::string& extra) {
    const json b = json::parse(R"({"messages":[{"role":"user","content":"hi"}])" + extra + "}");
    return tok_->decode(parse_completion_request(b, true, ctx).generate.prompt_ids);
  };
  const std::string empty_think = "<think>\n\n</think>";
  EXPECT_EQ(prompt("").find(empty_think), std::string::npos);
  ctx.chat_template_kwargs = json::parse(R"({"enable_thinking": false})");
  EXPECT_NE(prompt("").find(empty_think), std::string::npos);
  EXPECT_EQ(prompt(R"(,"chat_template_kwargs":{"enable_thinking":true})").find(empty_think),
            std::string::npos);
  EXPECT_NE(prompt(R"(,"chat_template_kwargs":{"other":1})").find(empty_think), std::string::npos);
}

}  // namespace
}  // namespace deltaserve::server
