// Where the chat template comes from: chat_template.jinja (what recent transformers versions save)
// over tokenizer_config.json's chat_template over a processor's chat_template.json, and vLLM's
// --chat-template (a file, or the template itself) over all of them.
#include "tokenizer/chat_template_source.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace deltaserve::tokenizer {
namespace {

using deltaserve::testing::TempDir;
using jinja::Json;

// A template that says which file it came from, and uses a special token from the config.
std::string tagged(const std::string& tag) {
  return "{{ bos_token }}" + tag + "{% for m in messages %}|{{ m.content }}{% endfor %}";
}

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void write_config(const std::filesystem::path& dir, const Json& chat_template) {
  Json config = {{"bos_token", {{"content", "<s>"}}}, {"eos_token", "</s>"}};
  if (!chat_template.is_null()) config["chat_template"] = chat_template;
  write(dir / "tokenizer_config.json", config.dump());
}

std::string render(const ChatTemplate& t) {
  return t.render(Json::array({{{"role", "user"}, {"content", "hi"}}}), Json(), false);
}

std::string rendered_from(const std::filesystem::path& dir, const std::string& flag = "") {
  return render(*load_chat_template(dir, flag));
}

TEST(ChatTemplateSource, TheJinjaFileComesBeforeTheConfigsTemplate) {
  TempDir d;
  write_config(d.path(), tagged("config"));
  write(d.path() / "chat_template.json", Json{{"chat_template", tagged("processor")}}.dump());
  EXPECT_EQ(rendered_from(d.path()), "<s>config|hi");
  write(d.path() / "chat_template.jinja", tagged("jinja"));
  EXPECT_EQ(rendered_from(d.path()), "<s>jinja|hi");  // the special tokens still the config's
}

TEST(ChatTemplateSource, AProcessorsTemplateWhenTheTokenizerHasNone) {
  TempDir d;
  write_config(d.path(), Json());
  write(d.path() / "chat_template.json", Json{{"chat_template", tagged("processor")}}.dump());
  EXPECT_EQ(rendered_from(d.path()), "<s>processor|hi");
  // A list of named templates: the "default" one.
  write_config(d.path(), Json::array({{{"name", "tool_use"}, {"template", tagged("tools")}},
                                      {{"name", "default"}, {"template", tagged("default")}}}));
  EXPECT_EQ(rendered_from(d.path()), "<s>default|hi");
}

TEST(ChatTemplateSource, AJinjaFileAloneNeedsNoConfig) {
  TempDir d;
  write(d.path() / "chat_template.jinja", "{{ bos_token is defined }}{{ messages[0].content }}");
  EXPECT_EQ(rendered_from(d.path()), "Falsehi");
}

TEST(ChatTemplateSource, TheFlagReplacesTheCheckpointsTemplate) {
  TempDir d;
  write_config(d.path(), tagged("config"));
  write(d.path() / "chat_template.jinja", tagged("jinja"));
  write(d.path() / "mine.jinja", tagged("file"));
  EXPECT_EQ(rendered_from(d.path(), (d.path() / "mine.jinja").string()), "<s>file|hi");
  // Not a file, but a template: escapes decoded as vLLM decodes them.
  EXPECT_EQ(rendered_from(d.path(), "{{ messages[0].content }}\\n\\t\\\\x"), "hi\n\t\\x");
  EXPECT_EQ(chat_template_flag_source("{{ 'a\\'b' }}"), "{{ 'a'b' }}");
  EXPECT_EQ(chat_template_flag_source("{{ x }}\\d"), "{{ x }}\\d");  // unknown escapes stay
}

TEST(ChatTemplateSource, WhatCannotBeUsedIsAClearError) {
  TempDir d;
  write_config(d.path(), Json());
  const auto message = [&](const std::string& flag) {
    try {
      load_chat_template(d.path(), flag);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("").find("no chat template (looked for chat_template.jinja"),
            std::string::npos);
  EXPECT_NE(message("/no/such/template.jinja").find("looks like a file path"), std::string::npos);
  EXPECT_NE(message(d.path().string()).find("looks like a file path"), std::string::npos)
      << "a directory is not a template file";
  write(d.path() / "bad.jinja", "{% if %}");
  EXPECT_NE(message((d.path() / "bad.jinja").string()).find("--chat-template: "),
            std::string::npos);
  write(d.path() / "chat_template.jinja", "{% for %}");
  EXPECT_NE(message("").find("chat_template.jinja: "), std::string::npos);
  write(d.path() / "tokenizer_config.json", "{not json");
  EXPECT_NE(message("").find("tokenizer_config.json: bad JSON"), std::string::npos);
}

}  // namespace
}  // namespace deltaserve::tokenizer
