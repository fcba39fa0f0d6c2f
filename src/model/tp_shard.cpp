#include "model/tp_shard.h"

#include <algorithm>

#include "core/error.h"

namespace deltaserve::model {

void validate_tp(const ModelConfig& c, int n) {
  auto need = [n](int64_t v, const char* what) {
    if (v % n != 0)
      throw Error("--tensor-parallel-size " + std::to_string(n) + " does not divide " + what +
                  " (" + std::to_string(v) + "); use a degree that divides it");
  };
  if (n < 1) throw Error("--tensor-parallel-size must be >= 1");
  need(c.num_heads, "num_attention_heads");
  if (c.num_kv_heads % n != 0 && n % c.num_kv_heads != 0)
    throw Error("--tensor-parallel-size " + std::to_string(n) +
                " neither divides num_key_value_heads (" + std::to_string(c.num_kv_heads) +
                ") nor is a multiple of it (KV heads can be split or replicated, not both)");
  need(c.lin_num_k_heads, "linear_num_key_heads");
  need(c.lin_num_v_heads, "linear_num_value_heads");
  need(c.intermediate_size, "intermediate_size (the MLP width)");
}

int64_t vocab_shard_rows(const ModelConfig& c, int n) { return (c.vocab_size + n - 1) / n; }

ModelConfig rank_local_config(const ModelConfig& c, int n) {
  ModelConfig l = c;
  l.num_heads = c.num_heads / n;
  l.num_kv_heads = c.num_kv_heads % n == 0 ? c.num_kv_heads / n : 1;
  l.lin_num_k_heads = c.lin_num_k_heads / n;
  l.lin_num_v_heads = c.lin_num_v_heads / n;
  l.intermediate_size = c.intermediate_size / n;
  l.vocab_size = vocab_shard_rows(c, n);
  l.vocab_shards = n;
  return l;
}

ShardRule shard_rule(const std::string& name, const ModelConfig& c, const TpShard& s) {
  using K = ShardRule::Kind;
  if (s.size == 1) return {K::kReplicated, {}};
  const ModelConfig l = rank_local_config(c, s.size);
  const int64_t r = s.rank;
  auto ends_with = [&name](const char* suffix) { return name.ends_with(suffix); };
  auto rows = [](int64_t b, int64_t n) { return ShardRule{K::kRows, {{b, b + n}}}; };
  auto cols = [](int64_t b, int64_t n) { return ShardRule{K::kCols, {{b, b + n}}}; };
  const int64_t hd = c.head_dim, dk = c.lin_k_dim, dv = c.lin_v_dim;
  // KV head of this rank: split, or replicated over size / num_kv_heads ranks.
  const int64_t kv_first =
      c.num_kv_heads % s.size == 0 ? r * l.num_kv_heads : r / (s.size / c.num_kv_heads);
  if (ends_with("self_attn.q_proj.weight"))
    return rows(r * l.num_heads * 2 * hd, l.num_heads * 2 * hd);
  if (ends_with("self_attn.k_proj.weight") || ends_with("self_attn.v_proj.weight"))
    return rows(kv_first * hd, l.num_kv_heads * hd);
  if (ends_with("self_attn.o_proj.weight")) return cols(r * l.num_heads * hd, l.num_heads * hd);
  if (ends_with("mlp.gate_proj.weight") || ends_with("mlp.up_proj.weight"))
    return rows(r * l.intermediate_size, l.intermediate_size);
  if (ends_with("mlp.down_proj.weight")) return cols(r * l.intermediate_size, l.intermediate_size);
  if (ends_with("linear_attn.in_proj_qkv.weight") || ends_with("linear_attn.conv1d.weight")) {
    const int64_t kq = l.lin_num_k_heads * dk, vv = l.lin_num_v_heads * dv;
    return {K::kRows,
            {{r * kq, (r + 1) * kq},
             {c.key_dim() + r * kq, c.key_dim() + (r + 1) * kq},
             {2 * c.key_dim() + r * vv, 2 * c.key_dim() + (r + 1) * vv}}};
  }
  if (ends_with("linear_attn.in_proj_z.weight"))
    return rows(r * l.lin_num_v_heads * dv, l.lin_num_v_heads * dv);
  if (ends_with("linear_attn.in_proj_b.weight") || ends_with("linear_attn.in_proj_a.weight") ||
      ends_with("linear_attn.dt_bias") || ends_with("linear_attn.A_log"))
    return rows(r * l.lin_num_v_heads, l.lin_num_v_heads);
  if (name == "embed_tokens.weight" || name == "lm_head.weight") {  // vocabulary-parallel
    const int64_t rows = vocab_shard_rows(c, s.size), first = std::min(r * rows, c.vocab_size);
    ShardRule rule = {K::kRows, {{first, std::min(first + rows, c.vocab_size)}}};
    rule.zero_pad = true;
    return rule;
  }
  if (ends_with("linear_attn.out_proj.weight"))
    return cols(r * l.lin_num_v_heads * dv, l.lin_num_v_heads * dv);
  return {K::kReplicated, {}};  // every norm (incl. q/k norm and the gated norm)
}

}  // namespace deltaserve::model
