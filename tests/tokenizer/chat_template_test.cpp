// The Jinja chat template renderer against HF apply_chat_template (Qwen3's template; goldens in
// test_data/tokenizer/chat.json), plus the template features Qwen templates use.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/chat_template_source.h"

namespace deltaserve::tokenizer {
namespace {

using jinja::Json;

std::string render(const std::string& src, const Json& vars = Json::object()) {
  return jinja::Template(src).render(vars);
}

TEST(ChatTemplate, MatchesHfApplyChatTemplate) {
  const auto tmpl = load_chat_template(deltaserve::testing::qwen3_tokenizer());
  std::ifstream in(deltaserve::testing::test_data() / "tokenizer" / "chat.json");
  const Json chats = Json::parse(in);
  ASSERT_GE(chats.size(), 10u);
  for (const Json& c : chats) {
    const std::string got = tmpl->render(c["messages"], c["tools"],
                                         c["add_generation_prompt"].get<bool>(), c["kwargs"]);
    EXPECT_EQ(got, c["rendered"].get<std::string>()) << c["messages"].dump();
  }
}

TEST(Jinja, WhitespaceControlTrimAndLstripBlocks) {
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  // trim_blocks drops the newline after a tag; lstrip_blocks the indentation before one.
  EXPECT_EQ(render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render("{{ 'v' }}\n"), "v\n");  // not after variable tags
  EXPECT_EQ(render("a{# comment #}b"), "ab");
}

TEST(Jinja, ExpressionsFiltersTestsAndMethods) {
  const Json vars = {{"xs", {1, 2, 3}}, {"s", "  Hello World  "}, {"d", {{"b", 1}, {"a", "ü\n"}}}};
  EXPECT_EQ(render("{{ xs[::-1] }} {{ xs[-1] }} {{ xs|length }} {{ xs[1:] }}", vars),
            "[3, 2, 1] 3 3 [2, 3]");
  EXPECT_EQ(render("{{ s.strip() }}|{{ s.lstrip() }}|{{ s|trim|upper }}", vars),
            "Hello World|Hello World  |HELLO WORLD");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ 'x</think>y'.split('</think>')[-1] }}", vars),
            "['a', 'b', '', 'c'] y");
  EXPECT_EQ(render("{{ d|tojson }}", vars), "{\"b\": 1, \"a\": \"ü\\n\"}");
  EXPECT_EQ(render("{{ d|tojson(indent=2) }}", vars), "{\n  \"b\": 1,\n  \"a\": \"ü\\n\"\n}");
  EXPECT_EQ(render("{% for k, v in d|items %}{{ k }}={{ v|string|trim }};{% endfor %}", vars),
            "b=1;a=ü;");
  EXPECT_EQ(render("{{ 'yes' if xs is defined and nope is not defined else 'no' }}", vars), "yes");
  EXPECT_EQ(
      render("{{ none is none }} {{ 'a' is string }} {{ d is mapping }} {{ 1 is string }}", vars),
      "True True True False");
  EXPECT_EQ(
      render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 1 + 2 * 3 }} {{ 'a' ~ 1 }} {{ 2 in xs }}",
             vars),
      "3 -4 1 7 a1 True");
  EXPECT_EQ(
      render("{{ d.get('zz', 'dflt') }} {{ d.a is defined }} {{ missing|default('x') }}", vars),
      "dflt True x");
}

TEST(Jinja, LoopsNamespacesMacros) {
  EXPECT_EQ(
      render("{% for x in [1,2,3] %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }} {% endfor %}"),
      "0TrueFalse 1FalseFalse 2FalseTrue ");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% "
                   "endfor %}{{ ns.n }}"),
            "6");
  // A plain set inside a loop does not leak out of it.
  EXPECT_EQ(render("{% set n = 1 %}{% for x in [5] %}{% set n = x %}{% endfor %}{{ n }}"), "1");
  EXPECT_EQ(render("{% for x in range(10) if x is even %}{% if x > 5 %}{% break %}{% endif %}{{ x "
                   "}}{% endfor %}"),
            "024");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% macro tag(name, v='d') %}<{{ name }}={{ v }}>{% endmacro %}{{ tag('a') }}{{ "
                   "tag('b', v='x') }}"),
            "<a=d><b=x>");
}

TEST(Jinja, ErrorsAreClear) {
  try {
    render("{{ raise_exception('bad role') }}");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "chat template: bad role");
  }
  EXPECT_THROW(render("{% if x %}unclosed"), Error);
  EXPECT_THROW(render("{% frobnicate %}"), Error);
  EXPECT_THROW(render("{{ 'a' - 1 }}"), Error);
  EXPECT_THROW(render("{{ x|nosuchfilter }}"), Error);
  EXPECT_THROW(render("{{ (1 }}"), Error);
}

}  // namespace
}  // namespace deltaserve::tokenizer
