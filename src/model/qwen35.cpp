#include "model/qwen35.h"

#include <algorithm>

#include "core/error.h"

namespace deltaserve::model {

using backend::Backend;

// Step buffers with room for `tokens` token rows and `rows` logits rows; reused between steps so
// that a step allocates nothing once the largest step shape has been seen.
struct Qwen35Model::Scratch {
  int64_t tokens = 0, rows = 0;
  Buffer ids, x, h, mix;             // [tokens, ...]
  Buffer qg, k, v, q, gate, attn;    // full attention
  Buffer u, y, z, a, b, o;           // GDN
  Buffer mlp_gate, mlp_up, mlp_act;  // MLP
  Buffer row_ids, hr, out;           // [rows, ...]
};

// The first T rows of every step buffer.
struct Qwen35Model::StepViews {
  Tensor ids, x, h, mix, qg, k, v, q, gate, attn, u, y, z, a, b, o, mlp_gate, mlp_up, mlp_act;
};

Qwen35Model::~Qwen35Model() = default;

void Qwen35Model::ensure_scratch(int64_t T, int64_t R) {
  if (!scratch_) scratch_ = std::make_unique<Scratch>();
  Scratch& s = *scratch_;
  const DType act = be_.act_dtype();
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  if (T > s.tokens) {
    const int64_t n = std::max(T, 2 * s.tokens);
    s.ids = be_.alloc(DType::kI32, {n});
    s.x = be_.alloc(act, {n, H});
    s.h = be_.alloc(act, {n, H});
    s.mix = be_.alloc(act, {n, H});
    if (cfg_.num_layers_of(LayerType::kFullAttention) > 0) {
      const int64_t nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, hd = cfg_.head_dim;
      s.qg = be_.alloc(act, {n, nh * 2 * hd});
      s.k = be_.alloc(act, {n, nkv * hd});
      s.v = be_.alloc(act, {n, nkv * hd});
      s.q = be_.alloc(act, {n, nh * hd});
      s.gate = be_.alloc(act, {n, nh * hd});
      s.attn = be_.alloc(act, {n, nh * hd});
    }
    if (cfg_.num_layers_of(LayerType::kLinearAttention) > 0) {
      s.u = be_.alloc(act, {n, cfg_.conv_dim()});
      s.y = be_.alloc(act, {n, cfg_.conv_dim()});
      s.z = be_.alloc(act, {n, cfg_.value_dim()});
      s.a = be_.alloc(act, {n, cfg_.lin_num_v_heads});
      s.b = be_.alloc(act, {n, cfg_.lin_num_v_heads});
      s.o = be_.alloc(act, {n, cfg_.lin_num_v_heads, cfg_.lin_v_dim});
    }
    s.mlp_gate = be_.alloc(act, {n, I});
    s.mlp_up = be_.alloc(act, {n, I});
    s.mlp_act = be_.alloc(act, {n, I});
    s.tokens = n;
  }
  if (R > s.rows) {
    const int64_t n = std::max(R, 2 * s.rows);
    s.row_ids = be_.alloc(DType::kI32, {n});
    s.hr = be_.alloc(act, {n, H});
    s.out = be_.alloc(act, {n, cfg_.vocab_size});
    s.rows = n;
  }
}

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
  if (!graphs_.empty()) be_.drop_graphs();
  graphs_.clear();
  page_size_ = page_size;
  num_pages_ = num_pages;
  num_slots_ = num_slots;
  cache_.clear();
  cache_.resize(static_cast<size_t>(cfg_.num_layers));
  const DType act = be_.act_dtype();
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    LayerCache& c = cache_[static_cast<size_t>(i)];
    if (cfg_.layer_types[static_cast<size_t>(i)] == LayerType::kFullAttention) {
      c.k = be_.alloc(act, {num_pages + 1, page_size, cfg_.num_kv_heads, cfg_.head_dim});
      c.v = be_.alloc(act, {num_pages + 1, page_size, cfg_.num_kv_heads, cfg_.head_dim});
    } else {
      c.conv = be_.alloc(act, {num_slots + 1, cfg_.conv_dim(), cfg_.conv_kernel - 1});
      c.state = be_.alloc(DType::kF32,
                          {num_slots + 1, cfg_.lin_num_v_heads, cfg_.lin_k_dim, cfg_.lin_v_dim});
    }
  }
}

void Qwen35Model::full_attention(int64_t i, const Tensor& h, const StepViews& s,
                                 const Tensor& out) {
  const FullAttnWeights& w = w_.layers[static_cast<size_t>(i)].attn;
  const LayerCache& c = cache_[static_cast<size_t>(i)];
  const Tensor* ws[] = {&w.q_proj, &w.k_proj, &w.v_proj};
  const Tensor* ys[] = {&s.qg, &s.k, &s.v};
  be_.linear_multi(h, ws, ys);
  be_.attn_prep_and_cache(s.qg, s.k, s.v, w.q_norm, w.k_norm, attn_dims_, s.q, s.gate, c.k.tensor(),
                          c.v.tensor());
  be_.paged_attention(s.q, s.gate, c.k.tensor(), c.v.tensor(), attn_dims_, s.attn);
  be_.linear(s.attn, w.o_proj, out);
  if (comm_) comm_->all_reduce_sum(out);
}

void Qwen35Model::gated_deltanet(int64_t i, const Tensor& h, const StepViews& s,
                                 const Tensor& out) {
  const GdnWeights& w = w_.layers[static_cast<size_t>(i)].gdn;
  const LayerCache& c = cache_[static_cast<size_t>(i)];
  const Tensor* ws[] = {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a};
  const Tensor* ys[] = {&s.u, &s.z, &s.b, &s.a};
  be_.linear_multi(h, ws, ys);
  be_.gdn_conv(s.u, w.conv1d, c.conv.tensor(), gdn_dims_.conv_kernel, s.y);
  be_.gated_delta_rule(s.y, s.a, s.b, w.A_log, w.dt_bias, c.state.tensor(), gdn_dims_, s.o);
  be_.gated_rms_norm(s.o, s.z, w.norm, static_cast<float>(cfg_.rms_norm_eps));
  const int64_t T = h.dim(0);
  be_.linear(s.o.view({T, cfg_.value_dim()}), w.out_proj, out);
  if (comm_) comm_->all_reduce_sum(out);
}

void Qwen35Model::run_step(int64_t T, int64_t R, bool identity_rows) {
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  Scratch& sc = *scratch_;
  auto rows = [T](const Buffer& buf) {
    return buf.tensor().empty() ? Tensor{} : buf.tensor().rows(0, T);
  };
  const StepViews s{rows(sc.ids),      rows(sc.x),      rows(sc.h),      rows(sc.mix),
                    rows(sc.qg),       rows(sc.k),      rows(sc.v),      rows(sc.q),
                    rows(sc.gate),     rows(sc.attn),   rows(sc.u),      rows(sc.y),
                    rows(sc.z),        rows(sc.a),      rows(sc.b),      rows(sc.o),
                    rows(sc.mlp_gate), rows(sc.mlp_up), rows(sc.mlp_act)};
  const Tensor& x = s.x;
  const Tensor& h = s.h;

  // x: residual stream; h: the normalised input of the next block (the final norm after the last).
  be_.embedding(s.ids, w_.embed, x);
  be_.rms_norm(x, w_.layers[0].input_norm, eps, h);
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    const LayerWeights& l = w_.layers[static_cast<size_t>(i)];
    if (l.type == LayerType::kFullAttention)
      full_attention(i, h, s, s.mix);
    else
      gated_deltanet(i, h, s, s.mix);
    be_.add_rms_norm(x, s.mix, l.post_norm, eps, h);
    const Tensor* ws[] = {&l.gate_proj, &l.up_proj};
    const Tensor* ys[] = {&s.mlp_gate, &s.mlp_up};
    be_.linear_multi(h, ws, ys);
    be_.silu_mul(s.mlp_gate, s.mlp_up, s.mlp_act);
    be_.linear(s.mlp_act, l.down_proj, s.mix);
    if (comm_) comm_->all_reduce_sum(s.mix);
    const Tensor& next_norm =
        i + 1 < cfg_.num_layers ? w_.layers[static_cast<size_t>(i + 1)].input_norm : w_.final_norm;
    be_.add_rms_norm(x, s.mix, next_norm, eps, h);
  }
  if (R == 0) return;
  const Tensor out = sc.out.tensor().rows(0, R);
  if (identity_rows) {
    be_.linear(h.rows(0, R), w_.lm_head, out);
  } else {
    const Tensor hr = sc.hr.tensor().rows(0, R);
    be_.gather_rows(h, sc.row_ids.tensor().rows(0, R), hr);
    be_.linear(hr, w_.lm_head, out);
  }
}

std::vector<int32_t> Qwen35Model::graph_buckets() const {
  std::vector<int32_t> b;
  for (const auto& [size, id] : graphs_)
    if (be_.graph_valid(id)) b.push_back(size);
  return b;
}

void Qwen35Model::capture_decode_graphs(std::vector<int32_t> buckets, int64_t max_tokens,
                                        int32_t max_seqs, int32_t max_pages_per_seq) {
  DS_CHECK(!cache_.empty(), "allocate_cache first");
  graphs_.clear();
  if (!be_.graphs_supported() || buckets.empty()) return;
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  DS_CHECK(buckets.front() >= 1, "graph batch sizes must be >= 1");
  const int64_t top = buckets.back();
  max_seqs = std::max<int32_t>(max_seqs, static_cast<int32_t>(top));
  ensure_scratch(std::max(max_tokens, top), std::max<int64_t>(max_seqs, top));
  be_.reserve_batch(2 * std::max(max_tokens, top) + 5 * int64_t{max_seqs} +
                    int64_t{max_seqs} * std::max(max_pages_per_seq, 1));
  for (const int32_t B : buckets) {
    // Capture over padding rows only (the pad slot and page); replays bring their own batch.
    backend::BatchDesc desc;
    desc.num_tokens = B;
    desc.page_size = page_size_;
    for (int32_t r = 0; r < B; ++r) desc.seqs.push_back({r, 1, 0, num_slots_, {num_pages_}});
    be_.set_batch(desc);
    const std::vector<int32_t> ids(static_cast<size_t>(B), 0);
    be_.upload_i32(ids.data(), scratch_->ids.tensor().rows(0, B));
    be_.begin_capture();
    try {
      run_step(B, B, true);
    } catch (...) {
      try {
        be_.end_capture();
      } catch (...) {
      }
      throw;
    }
    const int id = be_.end_capture();
    be_.replay(id);  // warm up
    graphs_.emplace_back(B, id);
  }
  be_.synchronize();
}

int64_t Qwen35Model::compute(const ForwardBatch& batch) {
  DS_CHECK(!cache_.empty(), "allocate_cache first");
  const int64_t T = static_cast<int64_t>(batch.token_ids.size());
  DS_CHECK(T > 0, "empty batch");
  for (const auto& sq : batch.seqs)
    DS_CHECK(sq.slot >= 0 && sq.slot < num_slots_, "slot out of range");
  const int64_t R = static_cast<int64_t>(batch.logits_rows.size());

  // A decode-only step with logits for every row in order replays the smallest graph that fits.
  int graph = -1;
  int64_t B = T;
  if (!eager_ && !graphs_.empty() && R == T && static_cast<int64_t>(batch.seqs.size()) == T) {
    bool decode = true;
    for (int64_t i = 0; i < T && decode; ++i)
      decode = batch.seqs[static_cast<size_t>(i)].num_tokens == 1 &&
               batch.seqs[static_cast<size_t>(i)].token_begin == i &&
               batch.logits_rows[static_cast<size_t>(i)] == i;
    for (const auto& [size, id] : graphs_)
      if (decode && size >= T && be_.graph_valid(id)) {
        graph = id;
        B = size;
        break;
      }
  }

  backend::BatchDesc desc{batch.seqs, static_cast<int32_t>(B), page_size_};
  std::vector<int32_t> ids = batch.token_ids;
  for (int64_t r = T; r < B; ++r) {  // padding rows: the model's own slot and page
    desc.seqs.push_back({static_cast<int32_t>(r), 1, 0, num_slots_, {num_pages_}});
    ids.push_back(0);
  }
  const bool grow = !scratch_ || B > scratch_->tokens || R > scratch_->rows;
  if (grow && !graphs_.empty()) {
    be_.drop_graphs();  // they point at the buffers being replaced
    graphs_.clear();
    graph = -1;
  }
  ensure_scratch(B, R);
  be_.set_batch(desc);
  if (graph >= 0 && !be_.graph_valid(graph)) graph = -1;  // set_batch had to grow its buffer
  Scratch& sc = *scratch_;
  be_.upload_i32(ids.data(), sc.ids.tensor().rows(0, B));
  if (graph >= 0) {
    be_.replay(graph);
  } else {
    if (R > 0) be_.upload_i32(batch.logits_rows.data(), sc.row_ids.tensor().rows(0, R));
    run_step(B, R, false);
  }
  return R;
}

std::vector<float> Qwen35Model::forward(const ForwardBatch& batch) {
  const int64_t R = compute(batch);
  std::vector<float> logits(static_cast<size_t>(R * cfg_.vocab_size));
  if (R > 0) be_.download_f32(scratch_->out.tensor().rows(0, R), logits.data());
  return logits;
}

std::vector<backend::Sampled> Qwen35Model::forward_sample(
    const ForwardBatch& batch, int32_t vocab, const std::vector<backend::SampleSpec>& specs) {
  DS_CHECK(specs.size() == batch.logits_rows.size(), "one sampling spec per logits row");
  DS_CHECK(vocab > 0 && vocab <= cfg_.vocab_size, "sampling vocabulary");
  const int64_t R = compute(batch);
  if (R == 0) return {};
  return be_.sample(scratch_->out.tensor().rows(0, R), vocab, specs);
}

}  // namespace deltaserve::model
