#include "model/weights.h"

#include <gtest/gtest.h>

#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/loader.h"
#include "test_util.h"

namespace deltaserve::model {
namespace {

using deltaserve::testing::TempDir;
using deltaserve::testing::test_data;
namespace fs = std::filesystem;

const char* kConfig = R"({"model_type": "qwen3_5", "tie_word_embeddings": false, "text_config": {
  "model_type": "qwen3_5_text", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
  "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "linear_num_key_heads": 1,
  "linear_num_value_heads": 2, "linear_key_head_dim": 4, "linear_value_head_dim": 6,
  "linear_conv_kernel_dim": 4, "max_position_embeddings": 128,
  "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}}})";

// Writes a checkpoint for kConfig with every text tensor (F32 value 0.25 unless `f16` names it),
// plus visual/mtp tensors, optionally leaving one out or giving one a wrong shape.
void write_checkpoint(const fs::path& dir, const std::string& omit = "",
                      const std::string& reshape = "", const std::string& f16 = "") {
  std::ofstream(dir / "config.json") << kConfig;
  const ModelConfig cfg = parse_model_config(kConfig, "cfg");
  ModelWeights w;
  std::vector<WeightSpec> specs = weight_specs(cfg, w);
  std::vector<std::vector<float>> data;
  std::vector<std::vector<uint16_t>> halfs;
  std::vector<TensorToWrite> tw;
  data.reserve(specs.size() + 2);
  halfs.reserve(specs.size());
  for (const WeightSpec& s : specs) {
    const std::string name = s.name == "lm_head.weight" ? s.name : "model.language_model." + s.name;
    if (name == omit) continue;
    std::vector<int64_t> shape = s.shape;
    if (name == reshape) shape[0] += 1;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (name == f16) {
      halfs.emplace_back(static_cast<size_t>(n), uint16_t{0x3800});  // 0.5 in f16
      tw.push_back({name, DType::kF16, shape, halfs.back().data()});
    } else {
      data.emplace_back(static_cast<size_t>(n), 0.25f);
      tw.push_back({name, DType::kF32, shape, data.back().data()});
    }
  }
  data.emplace_back(4, 1.0f);
  tw.push_back({"model.visual.blocks.0.attn.qkv.weight", DType::kF32, {2, 2}, data.back().data()});
  data.emplace_back(4, 1.0f);
  tw.push_back({"mtp.fc.weight", DType::kF32, {4}, data.back().data()});
  write_safetensors(dir / "model.safetensors", tw);
}

std::string load_error(const fs::path& dir) {
  backend::CpuBackend be;
  try {
    Checkpoint c(dir);
    load_weights(c, load_model_config(dir), be);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Weights, LoadsSyntheticCheckpointSkippingVisualAndMtp) {
  TempDir d;
  write_checkpoint(d.path(), "", "", "model.language_model.layers.0.linear_attn.A_log");
  backend::CpuBackend be;
  Checkpoint c(d.path());
  const ModelWeights w = load_weights(c, load_model_config(d.path()), be);
  ASSERT_EQ(w.layers.size(), 2u);
  EXPECT_EQ(w.layers[0].gdn.A_log.f32()[1], 0.5f);  // converted from F16
  EXPECT_EQ(w.layers[0].gdn.conv1d.shape_str(),
            "[20, 4]");  // [conv_dim, 1, K] stored as [conv_dim, K]
  EXPECT_EQ(w.layers[1].attn.q_proj.shape_str(), "[32, 16]");
  EXPECT_NE(w.lm_head.data, w.embed.data);
}

TEST(Weights, MissingTensorNamesIt) {
  TempDir d;
  write_checkpoint(d.path(), "model.language_model.layers.1.self_attn.k_norm.weight");
  const std::string e = load_error(d.path());
  EXPECT_NE(e.find("missing tensor 'model.language_model.layers.1.self_attn.k_norm.weight'"),
            std::string::npos)
      << e;
}

TEST(Weights, UntiedWithoutLmHeadFails) {
  TempDir d;
  write_checkpoint(d.path(), "lm_head.weight");
  EXPECT_NE(load_error(d.path()).find("missing tensor 'lm_head.weight'"), std::string::npos);
}

TEST(Weights, ShapeMismatchNamesFileAndTensor) {
  TempDir d;
  write_checkpoint(d.path(), "", "model.language_model.layers.0.linear_attn.in_proj_qkv.weight");
  const std::string e = load_error(d.path());
  EXPECT_NE(e.find("model.safetensors: tensor "
                   "'model.language_model.layers.0.linear_attn.in_proj_qkv.weight' "
                   "has shape [21, 16], expected [20, 16]"),
            std::string::npos)
      << e;
}

TEST(Weights, RealTinyCheckpoints) {
  backend::CpuBackend be;
  {
    Checkpoint c(test_data() / "tiny_real");
    const ModelWeights w = load_weights(c, load_model_config(test_data() / "tiny_real"), be);
    EXPECT_EQ(w.lm_head.data, w.embed.data);  // tied
    EXPECT_EQ(w.layers[3].type, LayerType::kFullAttention);
  }
  Checkpoint c(test_data() / "tiny_odd");
  const ModelWeights w = load_weights(c, load_model_config(test_data() / "tiny_odd"), be);
  EXPECT_NE(w.lm_head.data, w.embed.data);  // untied
  // The F32 A_log holds values a bf16 file could not: it was read as F32, not reinterpreted.
  const TensorInfo& t = c.get("model.language_model.layers.0.linear_attn.A_log");
  float raw;
  std::memcpy(&raw, t.data, 4);
  EXPECT_EQ(w.layers[0].gdn.A_log.f32()[0], raw);
  EXPECT_NE(f32_to_bf16(raw) << 16, std::bit_cast<uint32_t>(raw));
}

TEST(Weights, DummyWeightsAreDeterministic) {
  backend::CpuBackend be;
  const ModelConfig cfg = parse_model_config(kConfig, "cfg");
  const ModelWeights a = dummy_weights(cfg, be, 3), b = dummy_weights(cfg, be, 3),
                     c = dummy_weights(cfg, be, 4);
  const size_t n = static_cast<size_t>(a.embed.numel());
  EXPECT_EQ(std::memcmp(a.embed.data, b.embed.data, n * 4), 0);
  EXPECT_NE(std::memcmp(a.embed.data, c.embed.data, n * 4), 0);
  EXPECT_GT(a.layers[0].gdn.A_log.f32()[0], 0.0f);  // log(1..16)
}

// The projections a backend may run as one GEMM share an allocation, the second's rows right after
// the first's: the MLP's gate / up, the GDN b / a, attention k / v.
TEST(Weights, PairedProjectionsShareAnAllocation) {
  backend::CpuBackend be;
  const ModelWeights w = dummy_weights(parse_model_config(kConfig, "cfg"), be, 3);
  const auto follows = [](const Tensor& first, const Tensor& second) {
    return static_cast<const std::byte*>(second.data) ==
           static_cast<const std::byte*>(first.data) + first.nbytes();
  };
  for (const LayerWeights& l : w.layers) EXPECT_TRUE(follows(l.gate_proj, l.up_proj));
  EXPECT_TRUE(follows(w.layers[0].gdn.in_proj_b, w.layers[0].gdn.in_proj_a));
  EXPECT_TRUE(follows(w.layers[1].attn.k_proj, w.layers[1].attn.v_proj));
}

TEST(Loader, ParseLoadFormat) {
  EXPECT_EQ(parse_load_format("dummy"), LoadFormat::kDummy);
  EXPECT_THROW(parse_load_format("pt"), Error);
}

}  // namespace
}  // namespace deltaserve::model
