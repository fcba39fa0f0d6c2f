#include "model/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace deltaserve::model {

using json = nlohmann::json;

int64_t ModelConfig::num_layers_of(LayerType t) const {
  int64_t n = 0;
  for (LayerType l : layer_types) n += (l == t);
  return n;
}

namespace {

class Reader {
 public:
  Reader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& msg) const { throw Error(source_ + ": " + msg); }

  // A positive integer no larger than `max` (sizes beyond any real model are refused here, before
  // anything is allocated from them).
  int64_t positive_int(const char* key, int64_t max = int64_t{1} << 20) const {
    if (!j_.contains(key)) fail(std::string("missing field \"") + key + "\"");
    const json& v = j_[key];
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(max)) ||
        v.get<int64_t>() <= 0 || v.get<int64_t>() > max)
      fail(std::string("field \"") + key + "\" must be a positive integer (at most " +
           std::to_string(max) + "), got " +
           v.dump(-1, ' ', false, json::error_handler_t::replace));
    return v.get<int64_t>();
  }
  double number(const json& obj, const char* key, double fallback) const {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    if (!obj[key].is_number()) fail(std::string("field \"") + key + "\" must be a number");
    return obj[key].get<double>();
  }
  const json& j() const { return j_; }

 private:
  const json& j_;
  std::string source_;
};

std::vector<int32_t> parse_eos(const json& v) {
  std::vector<int32_t> r;
  if (v.is_number_integer()) r.push_back(v.get<int32_t>());
  if (v.is_array())
    for (const json& e : v)
      if (e.is_number_integer()) r.push_back(e.get<int32_t>());
  return r;
}

ModelConfig parse_fields(const std::string& json_text, const std::string& source) {
  const json top = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (top.is_discarded() || !top.is_object()) throw Error(source + ": bad JSON (not an object)");
  const bool nested = top.contains("text_config");
  if (nested && !top["text_config"].is_object())
    throw Error(source + ": text_config is not an object");
  const json& tj = nested ? top["text_config"] : top;
  Reader r(tj, source + (nested ? " (text_config)" : ""));

  const std::string model_type = top.contains("model_type") && top["model_type"].is_string()
                                     ? top["model_type"].get<std::string>()
                                     : "";
  if (model_type != "qwen3_5" && model_type != "qwen3_5_text")
    r.fail("unsupported model_type \"" + model_type +
           "\" (deltaserve serves dense Qwen3.5: qwen3_5 or qwen3_5_text)");

  ModelConfig c;
  c.vocab_size = r.positive_int("vocab_size", int64_t{1} << 24);
  c.hidden_size = r.positive_int("hidden_size", 65536);
  c.intermediate_size = r.positive_int("intermediate_size", 1 << 18);
  c.num_layers = r.positive_int("num_hidden_layers", 1024);
  c.num_heads = r.positive_int("num_attention_heads", 1024);
  c.num_kv_heads = r.positive_int("num_key_value_heads", 1024);
  c.head_dim =
      tj.contains("head_dim") ? r.positive_int("head_dim", 4096) : c.hidden_size / c.num_heads;
  if (c.head_dim <= 0) r.fail("head_dim is 0 (hidden_size < num_attention_heads)");
  c.lin_num_k_heads = r.positive_int("linear_num_key_heads", 1024);
  c.lin_num_v_heads = r.positive_int("linear_num_value_heads", 1024);
  c.lin_k_dim = r.positive_int("linear_key_head_dim", 4096);
  c.lin_v_dim = r.positive_int("linear_value_head_dim", 4096);
  c.conv_kernel = r.positive_int("linear_conv_kernel_dim", 8);
  c.max_position_embeddings = r.positive_int("max_position_embeddings", int64_t{1} << 24);
  c.rms_norm_eps = r.number(tj, "rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) r.fail("rms_norm_eps must be positive");

  // RoPE: rope_parameters (transformers 5) wins over the flat fields it replaced.
  const json empty = json::object();
  const json& rp = tj.contains("rope_parameters") && tj["rope_parameters"].is_object()
                       ? tj["rope_parameters"]
                       : empty;
  const std::string rope_type = rp.value("rope_type", std::string("default"));
  if (rope_type != "default") r.fail("unsupported rope_type \"" + rope_type + "\"");
  c.rope_theta = r.number(rp, "rope_theta", r.number(tj, "rope_theta", 0));
  if (!(c.rope_theta > 0))
    r.fail("missing or non-positive rope_theta (rope_parameters.rope_theta)");
  const double prf =
      r.number(rp, "partial_rotary_factor", r.number(tj, "partial_rotary_factor", 1.0));
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * prf);
  if (!(prf > 0 && prf <= 1) || c.rotary_dim % 2 != 0 || c.rotary_dim == 0)
    r.fail("partial_rotary_factor " + std::to_string(prf) + " gives rotary dim " +
           std::to_string(c.rotary_dim) + "; it must be even and in (0, head_dim]");

  if (tj.contains("layer_types")) {
    if (!tj["layer_types"].is_array()) r.fail("layer_types must be a list");
    for (const json& v : tj["layer_types"]) {
      const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
      if (s == "linear_attention")
        c.layer_types.push_back(LayerType::kLinearAttention);
      else if (s == "full_attention")
        c.layer_types.push_back(LayerType::kFullAttention);
      else
        r.fail("unknown layer type " + s);
    }
    if (static_cast<int64_t>(c.layer_types.size()) != c.num_layers)
      r.fail("layer_types has " + std::to_string(c.layer_types.size()) +
             " entries but num_hidden_layers is " + std::to_string(c.num_layers));
  } else {
    const int64_t interval =
        tj.contains("full_attention_interval") ? r.positive_int("full_attention_interval") : 4;
    for (int64_t i = 0; i < c.num_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::kFullAttention
                                                      : LayerType::kLinearAttention);
  }

  // Tied embeddings: the top-level flag is the one the checkpoint's own model class uses.
  if (top.contains("tie_word_embeddings") && top["tie_word_embeddings"].is_boolean())
    c.tie_word_embeddings = top["tie_word_embeddings"].get<bool>();
  else if (tj.contains("tie_word_embeddings") && tj["tie_word_embeddings"].is_boolean())
    c.tie_word_embeddings = tj["tie_word_embeddings"].get<bool>();
  c.eos_token_ids = parse_eos(tj.value("eos_token_id", json()));
  if (c.eos_token_ids.empty()) c.eos_token_ids = parse_eos(top.value("eos_token_id", json()));

  const std::string act = tj.value("hidden_act", std::string("silu"));
  if (act != "silu") r.fail("unsupported hidden_act \"" + act + "\" (only silu)");
  if (tj.value("attention_bias", false)) r.fail("attention_bias = true is not supported");
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_attention_heads " + std::to_string(c.num_heads) +
           " is not a multiple of num_key_value_heads " + std::to_string(c.num_kv_heads));
  if (c.lin_num_v_heads % c.lin_num_k_heads != 0)
    r.fail("linear_num_value_heads " + std::to_string(c.lin_num_v_heads) +
           " is not a multiple of linear_num_key_heads " + std::to_string(c.lin_num_k_heads) +
           " (nv % nk != 0)");
  if (c.conv_kernel > 8) r.fail("linear_conv_kernel_dim > 8 is not supported");
  for (int32_t e : c.eos_token_ids)
    if (e < 0 || e >= c.vocab_size)
      r.fail("eos_token_id " + std::to_string(e) + " is outside the vocabulary");
  return c;
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  try {
    return parse_fields(json_text, source);
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    throw Error(source + ": a field has the wrong type (" + e.what() + ")");
  }
}

ModelConfig load_model_config(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path.string());
}

}  // namespace deltaserve::model
