#include "model/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"

namespace deltaserve::model {
namespace {

using json = nlohmann::json;

json text_config() {
  return json{{"model_type", "qwen3_5_text"},
              {"vocab_size", 300},
              {"hidden_size", 64},
              {"intermediate_size", 96},
              {"num_hidden_layers", 8},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 32},
              {"linear_num_key_heads", 2},
              {"linear_num_value_heads", 4},
              {"linear_key_head_dim", 16},
              {"linear_value_head_dim", 24},
              {"linear_conv_kernel_dim", 4},
              {"max_position_embeddings", 4096},
              {"rms_norm_eps", 1e-6},
              {"eos_token_id", 7},
              {"rope_parameters",
               {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}}};
}

std::string error_of(const json& j) {
  try {
    parse_model_config(j.dump(), "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, NestedTextConfig) {
  json top{
      {"model_type", "qwen3_5"}, {"tie_word_embeddings", true}, {"text_config", text_config()}};
  top["text_config"]["tie_word_embeddings"] = true;
  const ModelConfig c = parse_model_config(top.dump(), "cfg.json");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.conv_dim(), 2 * 32 + 96);
  // Derived from full_attention_interval 4: layers 3 and 7 are full.
  ASSERT_EQ(c.layer_types.size(), 8u);
  EXPECT_EQ(c.layer_types[3], LayerType::kFullAttention);
  EXPECT_EQ(c.layer_types[7], LayerType::kFullAttention);
  EXPECT_EQ(c.num_layers_of(LayerType::kLinearAttention), 6);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{7});
}

TEST(Config, FlatTextConfigAndExplicitLayerTypes) {
  json j = text_config();
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"full_attention", "linear_attention", "full_attention"};
  j["eos_token_id"] = {5, 6};
  j["rope_parameters"].erase("partial_rotary_factor");
  j["partial_rotary_factor"] = 0.5;  // flat fallback
  const ModelConfig c = parse_model_config(j.dump(), "cfg.json");
  EXPECT_EQ(c.layer_types[0], LayerType::kFullAttention);
  EXPECT_EQ(c.layer_types[1], LayerType::kLinearAttention);
  EXPECT_EQ(c.rotary_dim, 16);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{5, 6}));
}

TEST(Config, RopeParametersWinOverFlatField) {
  json j = text_config();
  j["partial_rotary_factor"] = 0.5;  // HF reads rope_parameters (0.25)
  EXPECT_EQ(parse_model_config(j.dump(), "cfg.json").rotary_dim, 8);
}

TEST(Config, RealTinyCheckpointConfigs) {
  const ModelConfig r = load_model_config(deltaserve::testing::test_data() / "tiny_real");
  EXPECT_EQ(r.head_dim, 256);
  EXPECT_EQ(r.rotary_dim, 64);
  EXPECT_TRUE(r.tie_word_embeddings);
  const ModelConfig o = load_model_config(deltaserve::testing::test_data() / "tiny_odd");
  EXPECT_EQ(o.rotary_dim, 16);  // rope_parameters.partial_rotary_factor 0.5, not the flat 0.25
  EXPECT_EQ(o.rope_theta, 1e6);
  EXPECT_FALSE(o.tie_word_embeddings);
  EXPECT_EQ(o.layer_types[1], LayerType::kFullAttention);
  EXPECT_EQ(o.layer_types[4], LayerType::kFullAttention);
}

TEST(Config, RejectsBadInput) {
  EXPECT_NE(error_of(json::array()).find("bad JSON"), std::string::npos);
  try {
    parse_model_config("{not json", "cfg.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json: bad JSON"), std::string::npos);
  }
  json j = text_config();
  j["linear_num_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("nv % nk != 0"), std::string::npos) << error_of(j);
  j = text_config();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("not a multiple of num_key_value_heads"), std::string::npos);
  j = text_config();
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("missing field \"hidden_size\""), std::string::npos);
  j = text_config();
  j["hidden_size"] = "64";
  EXPECT_NE(error_of(j).find("must be a positive integer"), std::string::npos);
  j = text_config();
  j["layer_types"] = {"full_attention"};
  EXPECT_NE(error_of(j).find("layer_types has 1 entries"), std::string::npos);
  j = text_config();
  j["layer_types"] = std::vector<std::string>(8, "sliding_attention");
  EXPECT_NE(error_of(j).find("unknown layer type"), std::string::npos);
  j = text_config();
  j["model_type"] = "qwen3_5_moe";
  EXPECT_NE(error_of(j).find("unsupported model_type"), std::string::npos);
  j = text_config();
  j["rope_parameters"]["partial_rotary_factor"] = 0.01;
  EXPECT_NE(error_of(j).find("rotary dim"), std::string::npos);
  j = text_config();
  j["rope_parameters"].erase("rope_theta");
  EXPECT_NE(error_of(j).find("rope_theta"), std::string::npos);
  j = text_config();
  j["hidden_act"] = "gelu";
  EXPECT_NE(error_of(j).find("hidden_act"), std::string::npos);
  j = text_config();
  j["eos_token_id"] = 300;
  EXPECT_NE(error_of(j).find("outside the vocabulary"), std::string::npos);
}

}  // namespace
}  // namespace deltaserve::model
