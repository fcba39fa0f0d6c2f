#include "model/qwen35.h"

#include "core/error.h"
#include "model/microchunk_pipeline.h"
#include "model/tp_shard.h"

namespace deltaserve::model {

using backend::Backend;

Qwen35Model::Qwen35Model(const ModelConfig& cfg, Backend& be, ModelWeights weights,
                         dist::Parallel parallel)
    : cfg_(cfg),
      local_(parallel.degree() > 1 ? rank_local_config(cfg, parallel.degree()) : cfg),
      be_(be),
      w_(std::move(weights)),
      parallel_(parallel) {
  attn_dims_ = {static_cast<int32_t>(local_.num_heads),
                static_cast<int32_t>(local_.num_kv_heads),
                static_cast<int32_t>(local_.head_dim),
                static_cast<int32_t>(local_.rotary_dim),
                local_.rope_theta,
                static_cast<float>(local_.rms_norm_eps)};
  gdn_dims_ = {static_cast<int32_t>(local_.lin_num_k_heads),
               static_cast<int32_t>(local_.lin_num_v_heads), static_cast<int32_t>(local_.lin_k_dim),
               static_cast<int32_t>(local_.lin_v_dim), static_cast<int32_t>(local_.conv_kernel)};
}

void Qwen35Model::project_in(int64_t i, const StepBuffers& s, dist::RowRange c) const {
  const auto rows = [c](const Tensor& t) { return t.rows(c.begin, c.end); };
  const LayerWeights& l = w_.layers[static_cast<size_t>(i)];
  const Tensor h = rows(s.h);
  if (l.type == LayerType::kFullAttention) {
    const Tensor* ws[] = {&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj};
    const Tensor qg = rows(s.qg), k = rows(s.k), v = rows(s.v);
    const Tensor* ys[] = {&qg, &k, &v};
    return be_.linear_multi(h, ws, ys);
  }
  const Tensor* ws[] = {&l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.in_proj_b, &l.gdn.in_proj_a};
  const Tensor u = rows(s.u), z = rows(s.z), b = rows(s.b), a = rows(s.a);
  const Tensor* ys[] = {&u, &z, &b, &a};
  be_.linear_multi(h, ws, ys);
}

void Qwen35Model::mixer(const StepBatch& batch, int64_t i, const StepBuffers& s,
                        const LayerCache& c) const {
  const LayerWeights& l = w_.layers[static_cast<size_t>(i)];
  if (l.type == LayerType::kFullAttention) {
    const FullAttnWeights& w = l.attn;
    // The gate stays in qg: the attention reads each head's second half there.
    be_.attn_prep_and_cache(batch, s.qg, s.k, s.v, w.q_norm, w.k_norm, attn_dims_, s.q, Tensor{},
                            c.k, c.v);
    return be_.paged_attention(batch, s.q, s.qg, c.k, c.v, attn_dims_, s.attn);
  }
  const GdnWeights& w = l.gdn;
  be_.gdn_mixer(
      batch, {s.u, s.y, s.a, s.b, s.z, s.o, w.conv1d, w.A_log, w.dt_bias, w.norm, c.conv, c.state},
      gdn_dims_, static_cast<float>(cfg_.rms_norm_eps));
}

Qwen35Model::RowParallelProjection Qwen35Model::out_projection(int64_t i,
                                                               const StepBuffers& s) const {
  const LayerWeights& l = w_.layers[static_cast<size_t>(i)];
  const int64_t T = s.h.dim(0);
  if (l.type == LayerType::kFullAttention) return {s.attn, &l.attn.o_proj};
  return {s.o.view({T, local_.value_dim()}), &l.gdn.out_proj};
}

void Qwen35Model::mlp_in(int64_t i, const StepBuffers& s, dist::RowRange c) const {
  const auto rows = [c](const Tensor& t) { return t.rows(c.begin, c.end); };
  const LayerWeights& l = w_.layers[static_cast<size_t>(i)];
  be_.linear_silu_mul(rows(s.h), l.gate_proj, l.up_proj, rows(s.mlp_gate_up), rows(s.mlp_act));
}

void Qwen35Model::forward(const StepBatch& batch, const StepBuffers& s,
                          std::span<const LayerCache> cache, int64_t R, bool identity_rows) const {
  DS_CHECK(static_cast<int64_t>(cache.size()) == cfg_.num_layers, "one cache per layer");
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const int64_t T = s.x.dim(0), L = cfg_.num_layers;
  // x: residual stream; h: the normalised input of the next block (the final norm after the last).
  // Under TPSP (`sharded`) each rank adds and normalises only its token shard of every microchunk.
  const bool sharded = parallel_.token_sharded(T);
  const std::vector<dist::RowRange> chunks = parallel_.microchunks(T);
  const bool overlap = parallel_.tpsp().overlap_streams;
  const auto own = [&](const Tensor& t, dist::RowRange c) {
    return parallel_.own_rows(t, c, sharded);
  };
  // The row-parallel projection `proj` into s.mix, its partials summed, added to the residual and
  // normalised by `norm`, then (with `gather`) every rank given all the normalised rows (TPSP:
  // reduce-scatter, add + norm of the shard, all-gather; else all-reduce, add + norm of every row).
  // On one rank the projection, add and norm are one op (the backend may add inside the GEMM).
  const auto project_add_norm = [&](MicrochunkPipeline& p, const RowParallelProjection& proj,
                                    const Tensor& norm, bool gather) {
    const auto rows = [](const Tensor& t, dist::RowRange c) { return t.rows(c.begin, c.end); };
    if (parallel_.degree() == 1)
      return p.compute([&](dist::RowRange c) {
        be_.linear_add_rms_norm(rows(proj.in, c), *proj.w, rows(s.x, c), norm, eps, rows(s.h, c),
                                rows(s.mix, c));
      });
    p.compute([&](dist::RowRange c) { be_.linear(rows(proj.in, c), *proj.w, rows(s.mix, c)); });
    p.communicate(
        [&](dist::RowRange c) { parallel_.reduce_row_parallel_output(s.mix, c, sharded); });
    p.compute([&](dist::RowRange c) {
      be_.add_rms_norm(own(s.x, c), own(s.mix, c), norm, eps, own(s.h, c));
    });
    if (gather)
      p.communicate([&](dist::RowRange c) { parallel_.column_parallel_input(s.h, c, sharded); });
  };
  be_.embedding(s.ids, w_.embed, s.x);
  {
    MicrochunkPipeline p(be_, chunks, overlap);
    p.communicate([&](dist::RowRange c) { parallel_.reduce_embedding(s.x, c, sharded); });
    p.compute([&](dist::RowRange c) {
      be_.rms_norm(own(s.x, c), w_.layers[0].input_norm, eps, own(s.h, c));
    });
    p.communicate([&](dist::RowRange c) { parallel_.column_parallel_input(s.h, c, sharded); });
    p.compute([&](dist::RowRange c) { project_in(0, s, c); });
    p.join();
  }
  for (int64_t i = 0; i < L; ++i) {
    const LayerWeights& l = w_.layers[static_cast<size_t>(i)];
    mixer(batch, i, s, cache[static_cast<size_t>(i)]);
    MicrochunkPipeline p(be_, chunks, overlap);
    project_add_norm(p, out_projection(i, s), l.post_norm, true);
    p.compute([&](dist::RowRange c) { mlp_in(i, s, c); });
    const bool last = i + 1 == L;
    // After the last layer: the final norm, gathered when there are logits (the lm_head's rows
    // may be any rank's).
    project_add_norm(p, {s.mlp_act, &l.down_proj},
                     last ? w_.final_norm : w_.layers[static_cast<size_t>(i + 1)].input_norm,
                     !last || R > 0);
    if (!last) p.compute([&](dist::RowRange c) { project_in(i + 1, s, c); });
    p.join();
  }
  if (R == 0) return;
  const Tensor hr = identity_rows ? s.h.rows(0, R) : s.hr.rows(0, R);
  if (!identity_rows) be_.gather_rows(s.h, s.row_ids.rows(0, R), hr);
  lm_head(hr, s);
}

void Qwen35Model::lm_head(const Tensor& hr, const StepBuffers& s) const {
  const int64_t R = hr.dim(0), shards = local_.vocab_shards, rows = local_.vocab_size;
  const Tensor out = s.out.rows(0, R);
  if (shards == 1) return be_.linear(hr, w_.lm_head, out);
  const Tensor shard = s.out_shard.rows(0, R), gathered = s.gathered.rows(0, shards * R);
  be_.linear(hr, w_.lm_head, shard);
  parallel_.gather_vocab_shards(shard, gathered);
  be_.gather_rows(gathered, s.vocab_order.rows(0, shards * R), out.view({R * shards, rows}));
}

}  // namespace deltaserve::model
