#include "model/qwen35.h"

#include "core/error.h"
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

void Qwen35Model::row_parallel(const Tensor& in, const Tensor& w, const Tensor& out,
                               bool sharded) const {
  be_.linear(in, w, out);
  if (sharded)
    parallel_.scatter_row_parallel_output(out);
  else
    parallel_.reduce_row_parallel_output(out);
}

void Qwen35Model::full_attention(const StepBatch& batch, int64_t i, const StepBuffers& s,
                                 const LayerCache& c, bool sharded) const {
  const FullAttnWeights& w = w_.layers[static_cast<size_t>(i)].attn;
  parallel_.column_parallel_input(s.h, sharded);
  const Tensor* ws[] = {&w.q_proj, &w.k_proj, &w.v_proj};
  const Tensor* ys[] = {&s.qg, &s.k, &s.v};
  be_.linear_multi(s.h, ws, ys);
  be_.attn_prep_and_cache(batch, s.qg, s.k, s.v, w.q_norm, w.k_norm, attn_dims_, s.q, s.gate, c.k,
                          c.v);
  be_.paged_attention(batch, s.q, s.gate, c.k, c.v, attn_dims_, s.attn);
  row_parallel(s.attn, w.o_proj, s.mix, sharded);
}

void Qwen35Model::gated_deltanet(const StepBatch& batch, int64_t i, const StepBuffers& s,
                                 const LayerCache& c, bool sharded) const {
  const GdnWeights& w = w_.layers[static_cast<size_t>(i)].gdn;
  parallel_.column_parallel_input(s.h, sharded);
  const Tensor* ws[] = {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a};
  const Tensor* ys[] = {&s.u, &s.z, &s.b, &s.a};
  be_.linear_multi(s.h, ws, ys);
  be_.gdn_conv(batch, s.u, w.conv1d, c.conv, gdn_dims_.conv_kernel, s.y);
  be_.gated_delta_rule(batch, s.y, s.a, s.b, w.A_log, w.dt_bias, c.state, gdn_dims_, s.o);
  be_.gated_rms_norm(s.o, s.z, w.norm, static_cast<float>(cfg_.rms_norm_eps));
  const int64_t T = s.h.dim(0);
  row_parallel(s.o.view({T, local_.value_dim()}), w.out_proj, s.mix, sharded);
}

void Qwen35Model::forward(const StepBatch& batch, const StepBuffers& s,
                          std::span<const LayerCache> cache, int64_t R, bool identity_rows) const {
  DS_CHECK(static_cast<int64_t>(cache.size()) == cfg_.num_layers, "one cache per layer");
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  // x: residual stream; h: the normalised input of the next block (the final norm after the last).
  // Under TPSP (`sharded`) each rank adds and normalises only its token shard of them.
  const bool sharded = parallel_.token_sharded(s.x.dim(0));
  const auto mine = [&](const Tensor& t) { return sharded ? parallel_.token_shard(t) : t; };
  const Tensor x = mine(s.x), h = mine(s.h), mix = mine(s.mix);
  be_.embedding(s.ids, w_.embed, s.x);
  parallel_.reduce_embedding(s.x, sharded);
  be_.rms_norm(x, w_.layers[0].input_norm, eps, h);
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    const LayerWeights& l = w_.layers[static_cast<size_t>(i)];
    if (l.type == LayerType::kFullAttention)
      full_attention(batch, i, s, cache[static_cast<size_t>(i)], sharded);
    else
      gated_deltanet(batch, i, s, cache[static_cast<size_t>(i)], sharded);
    be_.add_rms_norm(x, mix, l.post_norm, eps, h);
    parallel_.column_parallel_input(s.h, sharded);
    const Tensor* ws[] = {&l.gate_proj, &l.up_proj};
    const Tensor* ys[] = {&s.mlp_gate, &s.mlp_up};
    be_.linear_multi(s.h, ws, ys);
    be_.silu_mul(s.mlp_gate, s.mlp_up, s.mlp_act);
    row_parallel(s.mlp_act, l.down_proj, s.mix, sharded);
    const Tensor& next_norm =
        i + 1 < cfg_.num_layers ? w_.layers[static_cast<size_t>(i + 1)].input_norm : w_.final_norm;
    be_.add_rms_norm(x, mix, next_norm, eps, h);
  }
  const Tensor& h_all = s.h;
  if (R == 0) return;
  parallel_.column_parallel_input(h_all, sharded);  // the lm_head's rows may be any rank's
  const Tensor hr = identity_rows ? h_all.rows(0, R) : s.hr.rows(0, R);
  if (!identity_rows) be_.gather_rows(h_all, s.row_ids.rows(0, R), hr);
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
