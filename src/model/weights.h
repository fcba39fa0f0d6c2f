// ModelWeights: the Qwen3.5 text weights on a backend, loaded from an HF checkpoint (converted by
// each tensor's header dtype) or made up from a config alone (--load-format dummy).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/tp_shard.h"

namespace deltaserve::model {

struct FullAttnWeights {
  Tensor q_proj;  // [2*nh*hd, H], rows per head: [q (hd) | gate (hd)]
  Tensor k_proj;  // [nkv*hd, H]
  Tensor v_proj;  // [nkv*hd, H]
  Tensor o_proj;  // [H, nh*hd]
  Tensor q_norm;  // [hd] zero-centred
  Tensor k_norm;  // [hd] zero-centred
};

struct GdnWeights {
  Tensor in_proj_qkv;  // [conv_dim, H]
  Tensor in_proj_z;    // [nv*dv, H]
  Tensor in_proj_b;    // [nv, H]
  Tensor in_proj_a;    // [nv, H]
  Tensor conv1d;       // [conv_dim, K] (checkpoint [conv_dim, 1, K])
  Tensor dt_bias;      // [nv]
  Tensor A_log;        // [nv]
  Tensor norm;         // [dv] plain weight
  Tensor out_proj;     // [H, nv*dv]
};

struct LayerWeights {
  LayerType type = LayerType::kLinearAttention;
  Tensor input_norm;  // [H]
  Tensor post_norm;   // [H]
  FullAttnWeights attn;
  GdnWeights gdn;
  Tensor gate_proj;  // [I, H]; up_proj's rows follow it in one allocation (alloc_spec)
  Tensor up_proj;    // [I, H]
  Tensor down_proj;  // [H, I]
};

struct ModelWeights {
  Tensor embed;       // [V, H]
  Tensor final_norm;  // [H]
  Tensor lm_head;     // [V, H]; the embedding itself when tied
  std::vector<LayerWeights> layers;
  std::vector<Buffer> storage;  // owns every tensor above (an MLP's gate and up share one)
  std::vector<Tensor> by_spec;  // every loaded tensor, in weight_specs' order
  int64_t total_bytes = 0;      // backend bytes held
};

// One expected checkpoint tensor: its name (without the text prefix), shape, and where it goes.
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;   // checkpoint shape
  std::vector<int64_t> stored;  // shape on the backend (conv1d drops its middle 1)
  Tensor* dst = nullptr;
};

// The full list of text-model tensors for `cfg`, pointing into `w` (whose layers it sizes).
std::vector<WeightSpec> weight_specs(const ModelConfig& cfg, ModelWeights& w);

// Loads every text tensor from `ckpt` onto `be`, checking names and shapes; tensors under
// model.visual.* and mtp.* are skipped. Throws deltaserve::Error naming the file and tensor.
// `progress` (optional) is called after each tensor with (bytes loaded, bytes in all). With a
// tensor-parallel `shard`, only the rank's rows / columns are read from the mmapped files (see
// shard_rule) and the weights have the rank-local shapes of rank_local_config(cfg).
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, backend::Backend& be,
                          const std::function<void(size_t, size_t)>& progress = {},
                          const TpShard& shard = {});

// Random weights for `cfg` (deterministic in `seed`), for benchmarks and the embedded default.
// With a tensor-parallel `shard`, the rank's part of the same global weights.
ModelWeights dummy_weights(const ModelConfig& cfg, backend::Backend& be, uint64_t seed,
                           const TpShard& shard = {});

// The bytes those two allocate for `shard` (ModelWeights::total_bytes) on a backend that stores
// matrices as `matrix` and vectors as `vector` (its weight_dtype(2) / weight_dtype(1)).
int64_t weight_bytes(const ModelConfig& cfg, const TpShard& shard, DType matrix, DType vector);

}  // namespace deltaserve::model
