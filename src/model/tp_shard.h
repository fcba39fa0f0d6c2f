// Tensor-parallel sharding of Qwen3.5 (DESIGN.md decision 8): validation of a TP degree against a
// config, the rank-local config, and which rows / columns of each global tensor a rank holds.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace deltaserve::model {

struct TpShard {
  int size = 1;
  int rank = 0;
};

// Throws deltaserve::Error, before any weight loads, when `tp_size` does not divide the attention
// heads, the KV heads (unless tp_size is a multiple of them: then each KV head is replicated on
// tp_size / num_kv_heads ranks), linear_num_key_heads, linear_num_value_heads or the MLP width.
void validate_tp(const ModelConfig& cfg, int tp_size);

// The config one rank computes with: heads, KV heads and the MLP width divided (KV heads 1 when
// replicated), and its slice of the vocabulary (vocab_shard_rows, vocab_shards = tp_size).
// Precondition: validate_tp passed.
ModelConfig rank_local_config(const ModelConfig& cfg, int tp_size);

// The rows of the embedding and lm_head a rank holds under TP: ceil(V / tp_size); rank r holds
// ids [r * rows, (r + 1) * rows), the last one zero-padded past V.
int64_t vocab_shard_rows(const ModelConfig& cfg, int tp_size);

// The part of a global tensor a rank holds: all of it, some row ranges (dim 0, concatenated in
// order) or one column range (dim 1 of a 2-D tensor).
struct ShardRule {
  enum class Kind { kReplicated, kRows, kCols } kind = Kind::kReplicated;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end)
  bool zero_pad = false;  // kRows: rows of the rank-local shape past the ranges are zeros
};

// `name` is a weight_specs() name (without the text prefix). Precondition: validate_tp passed.
ShardRule shard_rule(const std::string& name, const ModelConfig& cfg, const TpShard& shard);

}  // namespace deltaserve::model
