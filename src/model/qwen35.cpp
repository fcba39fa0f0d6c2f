#include "model/qwen35.h"

#include "core/error.h"

namespace deltaserve::model {

using backend::Backend;

struct Qwen35Model::Scratch {
  Buffer mix, qg, k, v, q, gate, attn;  // full attention
  Buffer u, y, z, a, b, o;              // GDN
  Buffer mlp_gate, mlp_up, mlp_act;     // MLP
};

Qwen35Model::Qwen35Model(const ModelConfig& cfg, Backend& be, ModelWeights weights,
                         dist::Communicator* comm)
    : cfg_(cfg), be_(be), w_(std::move(weights)), comm_(comm) {
  attn_dims_ = {static_cast<int32_t>(cfg.num_heads),
                static_cast<int32_t>(cfg.num_kv_heads),
                static_cast<int32_t>(cfg.head_dim),
                static_cast<int32_t>(cfg.rotary_dim),
                cfg.rope_theta,
                static_cast<float>(cfg.rms_norm_eps)};
  gdn_dims_ = {static_cast<int32_t>(cfg.lin_num_k_heads), static_cast<int32_t>(cfg.lin_num_v_heads),
               static_cast<int32_t>(cfg.lin_k_dim), static_cast<int32_t>(cfg.lin_v_dim),
               static_cast<int32_t>(cfg.conv_kernel)};
}

void Qwen35Model::allocate_cache(int32_t num_pages, int32_t page_size, int32_t num_slots) {
  DS_CHECK(num_pages > 0 && page_size > 0 && num_slots > 0, "empty cache");
  page_size_ = page_size;
  num_pages_ = num_pages;
  num_slots_ = num_slots;
  cache_.clear();
  cache_.resize(static_cast<size_t>(cfg_.num_layers));
  const DType act = be_.act_dtype();
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    LayerCache& c = cache_[static_cast<size_t>(i)];
    if (cfg_.layer_types[static_cast<size_t>(i)] == LayerType::kFullAttention) {
      c.k = be_.alloc(act, {num_pages, page_size, cfg_.num_kv_heads, cfg_.head_dim});
      c.v = be_.alloc(act, {num_pages, page_size, cfg_.num_kv_heads, cfg_.head_dim});
    } else {
      c.conv = be_.alloc(act, {num_slots, cfg_.conv_dim(), cfg_.conv_kernel - 1});
      c.state =
          be_.alloc(DType::kF32, {num_slots, cfg_.lin_num_v_heads, cfg_.lin_k_dim, cfg_.lin_v_dim});
    }
  }
}

void Qwen35Model::full_attention(int64_t i, const Tensor& h, Scratch& s, const Tensor& out) {
  const FullAttnWeights& w = w_.layers[static_cast<size_t>(i)].attn;
  const LayerCache& c = cache_[static_cast<size_t>(i)];
  be_.linear(h, w.q_proj, s.qg.tensor());
  be_.linear(h, w.k_proj, s.k.tensor());
  be_.linear(h, w.v_proj, s.v.tensor());
  be_.attn_prep_and_cache(s.qg.tensor(), s.k.tensor(), s.v.tensor(), w.q_norm, w.k_norm, attn_dims_,
                          s.q.tensor(), s.gate.tensor(), c.k.tensor(), c.v.tensor());
  be_.paged_attention(s.q.tensor(), s.gate.tensor(), c.k.tensor(), c.v.tensor(), attn_dims_,
                      s.attn.tensor());
  be_.linear(s.attn.tensor(), w.o_proj, out);
  if (comm_) comm_->all_reduce_sum(out);
}

void Qwen35Model::gated_deltanet(int64_t i, const Tensor& h, Scratch& s, const Tensor& out) {
  const GdnWeights& w = w_.layers[static_cast<size_t>(i)].gdn;
  const LayerCache& c = cache_[static_cast<size_t>(i)];
  be_.linear(h, w.in_proj_qkv, s.u.tensor());
  be_.linear(h, w.in_proj_z, s.z.tensor());
  be_.linear(h, w.in_proj_b, s.b.tensor());
  be_.linear(h, w.in_proj_a, s.a.tensor());
  be_.gdn_conv(s.u.tensor(), w.conv1d, c.conv.tensor(), gdn_dims_.conv_kernel, s.y.tensor());
  be_.gated_delta_rule(s.y.tensor(), s.a.tensor(), s.b.tensor(), w.A_log, w.dt_bias,
                       c.state.tensor(), gdn_dims_, s.o.tensor());
  be_.gated_rms_norm(s.o.tensor(), s.z.tensor(), w.norm, static_cast<float>(cfg_.rms_norm_eps));
  const int64_t T = h.dim(0);
  be_.linear(s.o.tensor().view({T, cfg_.value_dim()}), w.out_proj, out);
  if (comm_) comm_->all_reduce_sum(out);
}

std::vector<float> Qwen35Model::forward(const ForwardBatch& batch) {
  DS_CHECK(!cache_.empty(), "allocate_cache first");
  const int64_t T = static_cast<int64_t>(batch.token_ids.size());
  DS_CHECK(T > 0, "empty batch");
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const DType act = be_.act_dtype();

  backend::BatchDesc desc{batch.seqs, static_cast<int32_t>(T), page_size_};
  for (const auto& sq : desc.seqs)
    DS_CHECK(sq.slot >= 0 && sq.slot < num_slots_, "slot out of range");
  be_.set_batch(desc);

  Buffer ids = be_.alloc(DType::kI32, {T});
  be_.upload_i32(batch.token_ids.data(), ids.tensor());
  Buffer x = be_.alloc(act, {T, H});
  Buffer h = be_.alloc(act, {T, H});
  Scratch s;
  s.mix = be_.alloc(act, {T, H});
  if (cfg_.num_layers_of(LayerType::kFullAttention) > 0) {
    const int64_t nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, hd = cfg_.head_dim;
    s.qg = be_.alloc(act, {T, nh * 2 * hd});
    s.k = be_.alloc(act, {T, nkv * hd});
    s.v = be_.alloc(act, {T, nkv * hd});
    s.q = be_.alloc(act, {T, nh * hd});
    s.gate = be_.alloc(act, {T, nh * hd});
    s.attn = be_.alloc(act, {T, nh * hd});
  }
  if (cfg_.num_layers_of(LayerType::kLinearAttention) > 0) {
    s.u = be_.alloc(act, {T, cfg_.conv_dim()});
    s.y = be_.alloc(act, {T, cfg_.conv_dim()});
    s.z = be_.alloc(act, {T, cfg_.value_dim()});
    s.a = be_.alloc(act, {T, cfg_.lin_num_v_heads});
    s.b = be_.alloc(act, {T, cfg_.lin_num_v_heads});
    s.o = be_.alloc(act, {T, cfg_.lin_num_v_heads, cfg_.lin_v_dim});
  }
  s.mlp_gate = be_.alloc(act, {T, I});
  s.mlp_up = be_.alloc(act, {T, I});
  s.mlp_act = be_.alloc(act, {T, I});

  // x: residual stream; h: the normalised input of the next block (the final norm after the last).
  be_.embedding(ids.tensor(), w_.embed, x.tensor());
  be_.rms_norm(x.tensor(), w_.layers[0].input_norm, eps, h.tensor());
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    const LayerWeights& l = w_.layers[static_cast<size_t>(i)];
    if (l.type == LayerType::kFullAttention)
      full_attention(i, h.tensor(), s, s.mix.tensor());
    else
      gated_deltanet(i, h.tensor(), s, s.mix.tensor());
    be_.add_rms_norm(x.tensor(), s.mix.tensor(), l.post_norm, eps, h.tensor());
    be_.linear(h.tensor(), l.gate_proj, s.mlp_gate.tensor());
    be_.linear(h.tensor(), l.up_proj, s.mlp_up.tensor());
    be_.silu_mul(s.mlp_gate.tensor(), s.mlp_up.tensor(), s.mlp_act.tensor());
    be_.linear(s.mlp_act.tensor(), l.down_proj, s.mix.tensor());
    if (comm_) comm_->all_reduce_sum(s.mix.tensor());
    const Tensor& next_norm =
        i + 1 < cfg_.num_layers ? w_.layers[static_cast<size_t>(i + 1)].input_norm : w_.final_norm;
    be_.add_rms_norm(x.tensor(), s.mix.tensor(), next_norm, eps, h.tensor());
  }

  const int64_t R = static_cast<int64_t>(batch.logits_rows.size());
  std::vector<float> logits(static_cast<size_t>(R * cfg_.vocab_size));
  if (R == 0) return logits;
  Buffer rows = be_.alloc(DType::kI32, {R});
  be_.upload_i32(batch.logits_rows.data(), rows.tensor());
  Buffer hr = be_.alloc(act, {R, H});
  be_.gather_rows(h.tensor(), rows.tensor(), hr.tensor());
  Buffer out = be_.alloc(act, {R, cfg_.vocab_size});
  be_.linear(hr.tensor(), w_.lm_head, out.tensor());
  be_.download_f32(out.tensor(), logits.data());
  return logits;
}

}  // namespace deltaserve::model
