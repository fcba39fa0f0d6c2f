// Qwen35Model: the Qwen3.5 text layers, written once against backend::Backend. It owns the weights
// and nothing else: the caches, the step buffers and the decode graphs belong to the ModelRunner
// (runtime/model_runner.h), which hands one step's views in. One call runs one step: a batch of
// sequences, each a prefill chunk or decode tokens at its own position with its own KV pages and
// state slot, described by the StepBatch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/step_batch.h"
#include "dist/parallel.h"
#include "model/config.h"
#include "model/weights.h"

namespace deltaserve::model {

// One layer's caches (views into the runner's buffers; the unused pair is empty).
struct LayerCache {
  Tensor k, v;         // full attention: [pages, page_size, nkv, hd]
  Tensor conv, state;  // GDN: [slots, conv_dim, K-1], [slots, nv, dk, dv]
};

// One step's buffers: T token rows (padding included) and R logits rows.
struct StepBuffers {
  Tensor ids, x, h, mix;        // [T, ...]
  Tensor qg, k, v, q, attn;     // full attention (the gate stays in qg)
  Tensor u, y, z, a, b, o;      // GDN
  Tensor mlp_gate_up, mlp_act;  // MLP
  Tensor row_ids, hr, out;      // [R, ...]; out [R, vocab_shards * V_local] (>= V columns)
  // Vocabulary-parallel (vocab_shards > 1): the rank's logits [R, V_local], everyone's
  // [shards * R, V_local], and the row order that makes them whole rows (dist/vocab_parallel.h).
  Tensor out_shard, gathered, vocab_order;
};

class Qwen35Model {
 public:
  // `cfg` is the global config; `weights` hold the shard of rank `parallel.rank()` of
  // `parallel.degree()`, whose collectives go through the parallel layer.
  Qwen35Model(const ModelConfig& cfg, backend::Backend& be, ModelWeights weights,
              dist::Parallel parallel = {});

  // Runs the layers, then the lm_head for the R logits rows into s.out (rows s.row_ids of the
  // step, or the first R rows when `identity_rows`). s.ids holds the step's token ids (under TP,
  // as this rank looks them up: dist::local_token_ids), s.vocab_order the gather order of R rows.
  void forward(const StepBatch& batch, const StepBuffers& s, std::span<const LayerCache> cache,
               int64_t R, bool identity_rows) const;

  // The global config (every shape of the whole model).
  const ModelConfig& config() const { return cfg_; }
  // This rank's shapes (heads and projection widths divided by the tensor-parallel degree).
  const ModelConfig& rank_config() const { return local_; }
  const ModelWeights& weights() const { return w_; }
  backend::Backend& backend() const { return be_; }
  const dist::Parallel& parallel() const { return parallel_; }
  // TPSP settings (the serving flags), before the first step.
  void set_tpsp(dist::TpspConfig tpsp) { parallel_.set_tpsp(tpsp); }

 private:
  // The steps of a layer, each on the rows c of the step (a TPSP microchunk, or all of them)
  // where it works row by row:
  // layer i's input projections of s.h (attention q/k/v -> s.qg, s.k, s.v; GDN -> s.u, s.z, s.b,
  // s.a);
  void project_in(int64_t i, const StepBuffers& s, dist::RowRange c) const;
  // its mixer on the whole step (attention -> s.attn; conv, delta rule, gated norm -> s.o);
  void mixer(const StepBatch& batch, int64_t i, const StepBuffers& s, const LayerCache& c) const;
  // its row-parallel output projection: the input (all rows) and weight;
  struct RowParallelProjection {
    Tensor in;
    const Tensor* w;
  };
  RowParallelProjection out_projection(int64_t i, const StepBuffers& s) const;
  // its MLP's gate / up projections of s.h and SiLU-mul into s.mlp_act, the down projection's
  // input (the down projection is row-parallel too).
  void mlp_in(int64_t i, const StepBuffers& s, dist::RowRange c) const;
  // Logits of the rows `hr` into s.out (vocabulary-parallel under TP).
  void lm_head(const Tensor& hr, const StepBuffers& s) const;

  ModelConfig cfg_, local_;
  backend::Backend& be_;
  ModelWeights w_;
  dist::Parallel parallel_;
  backend::AttnDims attn_dims_{};
  backend::GdnDims gdn_dims_{};
};

}  // namespace deltaserve::model
