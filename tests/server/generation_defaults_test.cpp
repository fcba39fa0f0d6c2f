// Default sampling parameters as vLLM takes them: the model's generation_config.json (its
// difference from transformers' defaults), --generation-config vllm / DIR, and
// --override-generation-config on top; bad values are clear errors.
#include "server/generation_defaults.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "core/error.h"
#include "test_util.h"

namespace deltaserve::server {
namespace {

using deltaserve::testing::TempDir;

// Qwen3.5's kind of generation config: sampling recommended, plus fields that are not sampling's.
const json kQwenLike = json::parse(
    R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
        "eos_token_id": [248044, 248046], "transformers_version": "5.17.0"})");

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(GenerationDefaults, TheModelsRecommendedSamplingBecomesTheDefault) {
  const GenerationDefaults d = generation_defaults_of(kQwenLike, json(), "g.json");
  EXPECT_EQ(d.describe(), "temperature 0.6, top_k 20, top_p 0.95");
  engine::SamplingParams p;
  d.apply(p);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.0f);  // untouched
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_FALSE(d.max_tokens.has_value());
}

TEST(GenerationDefaults, TransformersDefaultsAreNotTakenButOverridesAre) {
  const json hf =
      json::parse(R"({"temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0})");
  EXPECT_TRUE(generation_defaults_of(hf, json(), "g.json").empty());
  const GenerationDefaults d = generation_defaults_of(
      hf, json::parse(R"({"top_k": 50, "max_new_tokens": 256, "min_p": 0.05})"), "g.json");
  EXPECT_EQ(d.top_k, 50);
  EXPECT_EQ(d.max_tokens, 256);
  EXPECT_FLOAT_EQ(*d.min_p, 0.05f);
  // An override replaces the model's value.
  EXPECT_FLOAT_EQ(
      *generation_defaults_of(kQwenLike, json::parse(R"({"temperature": 0})"), "g").temperature,
      0.0f);
}

TEST(GenerationDefaults, BadValuesNameTheirSource) {
  const auto bad = [](const char* text) {
    return error_of([&] { generation_defaults_of(json::parse(text), json(), "m/g.json"); });
  };
  EXPECT_NE(bad(R"({"temperature": "hot"})").find("m/g.json: \"temperature\" must be a number"),
            std::string::npos);
  EXPECT_NE(bad(R"({"top_p": 0})").find("\"top_p\""), std::string::npos);
  EXPECT_NE(bad(R"({"top_k": 1.5})").find("\"top_k\" must be an integer"), std::string::npos);
  EXPECT_NE(bad(R"({"max_new_tokens": 0})").find("\"max_new_tokens\""), std::string::npos);
  EXPECT_NE(bad("[1]").find("must be a JSON object"), std::string::npos);
}

TEST(GenerationDefaults, TheFlagPicksTheSource) {
  TempDir model, other;
  std::ofstream(model.path() / "generation_config.json") << kQwenLike.dump();
  std::ofstream(other.path() / "generation_config.json") << R"({"temperature": 0.3})";
  EXPECT_EQ(load_generation_defaults("auto", model.path(), "").describe(),
            "temperature 0.6, top_k 20, top_p 0.95");
  EXPECT_TRUE(load_generation_defaults("auto", other.path() / "none", "").empty());  // no file
  EXPECT_TRUE(load_generation_defaults("auto", "", "").empty());  // the embedded model
  EXPECT_TRUE(load_generation_defaults("vllm", model.path(), "").empty());
  EXPECT_EQ(load_generation_defaults("vllm", model.path(), R"({"top_p": 0.5})").describe(),
            "top_p 0.5");
  EXPECT_EQ(load_generation_defaults(other.path().string(), model.path(), "").describe(),
            "temperature 0.3");
  EXPECT_NE(error_of([&] {
              load_generation_defaults("/no/such", model.path(), "");
            }).find("--generation-config /no/such: no generation_config.json"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_generation_defaults("auto", model.path(), "{bad");
            }).find("--override-generation-config must be a JSON object"),
            std::string::npos);
  std::ofstream(model.path() / "generation_config.json") << "{not json";
  EXPECT_NE(error_of([&] {
              load_generation_defaults("auto", model.path(), "");
            }).find("generation_config.json: bad JSON"),
            std::string::npos);
}

}  // namespace
}  // namespace deltaserve::server
