#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace deltaserve::model {

std::vector<WeightSpec> weight_specs(const ModelConfig& c, ModelWeights& w) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  std::vector<WeightSpec> s;
  auto add = [&s](std::string name, std::vector<int64_t> shape, Tensor* dst,
                  std::vector<int64_t> stored = {}) {
    if (stored.empty()) stored = shape;
    s.push_back({std::move(name), std::move(shape), std::move(stored), dst});
  };
  w.layers.assign(static_cast<size_t>(c.num_layers), {});
  add("embed_tokens.weight", {V, H}, &w.embed);
  add("norm.weight", {H}, &w.final_norm);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    l.type = c.layer_types[static_cast<size_t>(i)];
    const std::string p = "layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {H}, &l.input_norm);
    add(p + "post_attention_layernorm.weight", {H}, &l.post_norm);
    add(p + "mlp.gate_proj.weight", {I, H}, &l.gate_proj);
    add(p + "mlp.up_proj.weight", {I, H}, &l.up_proj);
    add(p + "mlp.down_proj.weight", {H, I}, &l.down_proj);
    if (l.type == LayerType::kFullAttention) {
      const std::string a = p + "self_attn.";
      const int64_t hd = c.head_dim;
      add(a + "q_proj.weight", {2 * c.num_heads * hd, H}, &l.attn.q_proj);
      add(a + "k_proj.weight", {c.num_kv_heads * hd, H}, &l.attn.k_proj);
      add(a + "v_proj.weight", {c.num_kv_heads * hd, H}, &l.attn.v_proj);
      add(a + "o_proj.weight", {H, c.num_heads * hd}, &l.attn.o_proj);
      add(a + "q_norm.weight", {hd}, &l.attn.q_norm);
      add(a + "k_norm.weight", {hd}, &l.attn.k_norm);
    } else {
      const std::string a = p + "linear_attn.";
      const int64_t nv = c.lin_num_v_heads, K = c.conv_kernel;
      add(a + "in_proj_qkv.weight", {c.conv_dim(), H}, &l.gdn.in_proj_qkv);
      add(a + "in_proj_z.weight", {c.value_dim(), H}, &l.gdn.in_proj_z);
      add(a + "in_proj_b.weight", {nv, H}, &l.gdn.in_proj_b);
      add(a + "in_proj_a.weight", {nv, H}, &l.gdn.in_proj_a);
      add(a + "conv1d.weight", {c.conv_dim(), 1, K}, &l.gdn.conv1d, {c.conv_dim(), K});
      add(a + "dt_bias", {nv}, &l.gdn.dt_bias);
      add(a + "A_log", {nv}, &l.gdn.A_log);
      add(a + "norm.weight", {c.lin_v_dim}, &l.gdn.norm);
      add(a + "out_proj.weight", {H, c.value_dim()}, &l.gdn.out_proj);
    }
  }
  if (!c.tie_word_embeddings) add("lm_head.weight", {V, H}, &w.lm_head);
  return s;
}

namespace {

std::vector<WeightSpec> rank_specs(const ModelConfig& cfg, const TpShard& shard, ModelWeights& w) {
  if (shard.size > 1) validate_tp(cfg, shard.size);
  return weight_specs(shard.size > 1 ? rank_local_config(cfg, shard.size) : cfg, w);
}

Tensor alloc_into(ModelWeights& w, backend::Backend& be, const std::vector<int64_t>& shape) {
  Buffer b;
  switch (shape.size()) {
    case 1:
      b = be.alloc(be.weight_dtype(1), {shape[0]});
      break;
    case 2:
      b = be.alloc(be.weight_dtype(2), {shape[0], shape[1]});
      break;
    default:
      DS_CHECK(false, "unexpected weight rank");
  }
  w.total_bytes += static_cast<int64_t>(b.tensor().nbytes());
  w.storage.push_back(std::move(b));
  return w.storage.back().tensor();
}

// Projections stored in one allocation of [2 n, H] (the second's rows right after the first's), so
// that a backend can run both as one GEMM: the MLP's gate and up (CudaBackend::linear_silu_mul),
// the GDN b and a, attention k and v (one batched GEMM each).
constexpr std::pair<std::string_view, std::string_view> kStoredTogether[] = {
    {"mlp.gate_proj.weight", "mlp.up_proj.weight"},
    {"linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"},
    {"self_attn.k_proj.weight", "self_attn.v_proj.weight"}};

// Where spec i's tensor lives: an allocation of its own, except the pairs above.
Tensor alloc_spec(ModelWeights& w, backend::Backend& be, const std::vector<WeightSpec>& specs,
                  size_t i) {
  const WeightSpec& s = specs[i];
  for (const auto& [first, second] : kStoredTogether) {
    if (s.name.ends_with(second) && !s.dst->empty()) return *s.dst;  // with its first
    if (!s.name.ends_with(first) || i + 1 >= specs.size() || !specs[i + 1].name.ends_with(second) ||
        specs[i + 1].stored != s.stored)
      continue;
    const int64_t rows = s.stored.at(0);
    const Tensor both = alloc_into(w, be, {2 * rows, s.stored.at(1)});
    *specs[i + 1].dst = both.rows(rows, 2 * rows);
    return both.rows(0, rows);
  }
  return alloc_into(w, be, s.stored);
}

// Uploads a rank's part (`rule`) of a global tensor (`data` of `dtype`, global `shape`) into dst.
void upload_shard(backend::Backend& be, const ShardRule& rule, DType dtype, const std::byte* data,
                  const std::vector<int64_t>& shape, const Tensor& dst,
                  std::vector<float>& staging) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (rule.kind == ShardRule::Kind::kReplicated) {
    be.upload(dtype, data, static_cast<size_t>(numel), dst);
    return;
  }
  // Copy only this rank's rows / columns (out of the mapped file, for checkpoints).
  const size_t esize = dtype_size(dtype);
  staging.resize(static_cast<size_t>(dst.numel()));
  float* out = staging.data();
  if (rule.kind == ShardRule::Kind::kRows) {
    const int64_t row = numel / shape[0];
    for (const auto& [b, e] : rule.ranges) {
      convert_to_f32(dtype, data + static_cast<size_t>(b * row) * esize, out,
                     static_cast<size_t>((e - b) * row));
      out += (e - b) * row;
    }
  } else {
    const auto [c0, c1] = rule.ranges.at(0);
    for (int64_t r = 0; r < shape[0]; ++r, out += c1 - c0)
      convert_to_f32(dtype, data + static_cast<size_t>(r * shape[1] + c0) * esize, out,
                     static_cast<size_t>(c1 - c0));
  }
  float* const end = staging.data() + staging.size();
  if (rule.zero_pad && out < end) out = std::fill_n(out, end - out, 0.0f);
  DS_CHECK(out == end, "a shard does not fill its rank-local shape");
  be.upload(DType::kF32, staging.data(), staging.size(), dst);
}

std::string text_prefix(const Checkpoint& ckpt) {
  if (ckpt.find("model.language_model.embed_tokens.weight")) return "model.language_model.";
  if (ckpt.find("model.embed_tokens.weight")) return "model.";
  throw Error(
      ckpt.dir().string() +
      ": missing tensor 'model.language_model.embed_tokens.weight' (not a Qwen3.5 checkpoint?)");
}

std::string full_name(const std::string& prefix, const std::string& name) {
  return name == "lm_head.weight" ? name : prefix + name;
}

}  // namespace

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, backend::Backend& be,
                          const std::function<void(size_t, size_t)>& progress,
                          const TpShard& shard) {
  ModelWeights w, global;
  const std::string prefix = text_prefix(ckpt);
  const std::vector<WeightSpec> gspecs = weight_specs(cfg, global);
  std::vector<WeightSpec> specs = rank_specs(cfg, shard, w);
  DS_CHECK(gspecs.size() == specs.size(), "local and global weight tables differ");
  std::set<std::string> used;
  std::vector<float> staging;
  size_t total = 0, done = 0;
  for (const WeightSpec& s : specs)
    if (const TensorInfo* t = ckpt.find(full_name(prefix, s.name))) total += t->nbytes;
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& s = specs[i];
    const std::string name = full_name(prefix, s.name);
    const TensorInfo& t = ckpt.get(name);
    if (t.shape != gspecs[i].shape)
      throw Error(t.file + ": tensor '" + name + "' has shape " + t.shape_str() + ", expected " +
                  TensorInfo{"", DType::kF32, gspecs[i].shape, nullptr, 0, ""}.shape_str() +
                  " from config.json");
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16)
      throw Error(t.file + ": tensor '" + name + "' has dtype " + std::string(dtype_name(t.dtype)) +
                  "; weights must be BF16, F16 or F32");
    *s.dst = alloc_spec(w, be, specs, i);
    w.by_spec.push_back(*s.dst);
    upload_shard(be, shard_rule(s.name, cfg, shard), t.dtype, t.data, t.shape, *s.dst, staging);
    used.insert(name);
    done += t.nbytes;
    if (progress) progress(done, total);
  }
  if (cfg.tie_word_embeddings) w.lm_head = w.embed;
  int unexpected = 0;
  for (const std::string& n : ckpt.names()) {
    if (used.count(n) || n.rfind("model.visual.", 0) == 0 || n.rfind("mtp.", 0) == 0) continue;
    if (n == "lm_head.weight" && cfg.tie_word_embeddings) continue;
    if (unexpected++ < 5)
      std::fprintf(stderr, "warning: unused checkpoint tensor '%s'\n", n.c_str());
  }
  return w;
}

ModelWeights dummy_weights(const ModelConfig& cfg, backend::Backend& be, uint64_t seed,
                           const TpShard& shard) {
  ModelWeights w, global;
  const std::vector<WeightSpec> gspecs = weight_specs(cfg, global);
  std::vector<WeightSpec> specs = rank_specs(cfg, shard, w);
  // Counter-based (splitmix64 of seed, tensor, element): the same values on every rank and for
  // every TP degree, filled in parallel. In [-1, 1).
  auto uniform = [seed](uint64_t tensor, uint64_t idx) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (tensor << 40) + idx + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
  };
  std::vector<float> host, staging;
  for (size_t i = 0; i < specs.size(); ++i) {
    // The global tensor's values (the same on every rank and for every TP degree), then the shard.
    const WeightSpec& g = gspecs[i];
    int64_t n = 1;
    for (int64_t d : g.shape) n *= d;
    host.resize(static_cast<size_t>(n));
    const bool is_matrix = g.stored.size() == 2 && g.name.find("conv1d") == std::string::npos;
    // Matrices ~ U(-a, a) with variance 1/fan_in; norms near 0 (1 + w), A_log = log(1..16).
    const float a = is_matrix ? std::sqrt(3.0f / static_cast<float>(g.stored[1])) : 0.5f;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < n; ++e)
      host[static_cast<size_t>(e)] = a * uniform(i, static_cast<uint64_t>(e));
    if (g.name.ends_with("A_log"))
      for (float& v : host) v = std::log(1.0f + 7.5f * (v / a + 1.0f));
    if (g.name.ends_with("linear_attn.norm.weight"))
      for (float& v : host) v = 1.0f + 0.1f * v;
    *specs[i].dst = alloc_spec(w, be, specs, i);
    w.by_spec.push_back(*specs[i].dst);
    upload_shard(be, shard_rule(g.name, cfg, shard), DType::kF32,
                 reinterpret_cast<const std::byte*>(host.data()), g.shape, *specs[i].dst, staging);
  }
  if (cfg.tie_word_embeddings) w.lm_head = w.embed;
  return w;
}

int64_t weight_bytes(const ModelConfig& cfg, const TpShard& shard, DType matrix, DType vector) {
  ModelWeights w;
  int64_t total = 0;
  for (const WeightSpec& s : rank_specs(cfg, shard, w)) {
    int64_t n = 1;
    for (int64_t d : s.stored) n *= d;
    total += n * static_cast<int64_t>(dtype_size(s.stored.size() >= 2 ? matrix : vector));
  }
  return total;
}

}  // namespace deltaserve::model
