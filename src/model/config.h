// ModelConfig: the Qwen3.5 text-model hyperparameters read from an HF config.json and validated.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace deltaserve::model {

enum class LayerType : uint8_t { kLinearAttention, kFullAttention };

struct ModelConfig {
  int64_t vocab_size = 0;  // of a rank-local config (tp_shard.h): the rank's vocabulary slice
  // Vocabulary-parallel shards (1 in a global config; the TP degree in a rank-local one, whose
  // vocab_size is then ceil(V / shards) rows of the embedding and lm_head, zero-padded on the
  // last).
  int64_t vocab_shards = 1;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  // Full attention.
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // head_dim * partial_rotary_factor
  double rope_theta = 0;
  // Gated DeltaNet (linear attention).
  int64_t lin_num_k_heads = 0;  // nk
  int64_t lin_num_v_heads = 0;  // nv
  int64_t lin_k_dim = 0;        // dk
  int64_t lin_v_dim = 0;        // dv
  int64_t conv_kernel = 0;      // K
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::vector<LayerType> layer_types;
  std::vector<int32_t> eos_token_ids;

  int64_t key_dim() const { return lin_num_k_heads * lin_k_dim; }
  int64_t value_dim() const { return lin_num_v_heads * lin_v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t num_layers_of(LayerType t) const;
};

// Parses config.json text (real checkpoints nest the text model under "text_config"; a flat
// qwen3_5_text config works too) and validates it. Throws deltaserve::Error naming `source`.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
// Reads and parses <dir>/config.json.
ModelConfig load_model_config(const std::filesystem::path& dir);

}  // namespace deltaserve::model
