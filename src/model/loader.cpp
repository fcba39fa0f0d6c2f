#include "model/loader.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/error.h"

namespace deltaserve::model {

LoadFormat parse_load_format(const std::string& s) {
  if (s == "auto") return LoadFormat::kAuto;
  if (s == "safetensors") return LoadFormat::kSafetensors;
  if (s == "dummy") return LoadFormat::kDummy;
  throw Error("--load-format must be auto, safetensors or dummy, got '" + s + "'");
}

const std::string& embedded_default_config_json() {
  // Vocabulary sized for the Qwen3 tokenizer (151,936 embedding rows as in Qwen3 checkpoints).
  static const std::string kJson = R"({
  "architectures": ["Qwen3_5ForConditionalGeneration"],
  "model_type": "qwen3_5",
  "tie_word_embeddings": true,
  "text_config": {
    "model_type": "qwen3_5_text",
    "vocab_size": 151936, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 256,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "hidden_act": "silu",
    "tie_word_embeddings": true, "eos_token_id": [151645, 151643],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                        "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                        "mrope_interleaved": true}
  }
})";
  return kJson;
}

namespace {

// A lower bound on the weight bytes of one rank (bf16, every projection counted once): enough to
// refuse a config whose sizes cannot fit before anything is allocated from them.
double min_weight_bytes(const ModelConfig& c, int tp) {
  const double h = static_cast<double>(c.hidden_size);
  const double attn = h * static_cast<double>(c.num_heads * c.head_dim) * 2;
  const double gdn = h * static_cast<double>(c.lin_num_v_heads * c.lin_v_dim) * 2;
  const double mlp = 3 * h * static_cast<double>(c.intermediate_size);
  const double layers = static_cast<double>(c.num_layers) * (std::min(attn, gdn) + mlp);
  const double embed = static_cast<double>(c.vocab_size) * h;
  return 2 * (layers + embed) / tp;
}

void check_weights_fit(const ModelConfig& c, const backend::Backend& be, int tp) {
  size_t free_b = 0, total_b = 0;
  double room = 0;
  const char* where = "device";
  if (be.memory_info(free_b, total_b)) {
    room = static_cast<double>(free_b);
  } else {
    room =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    where = "host";
  }
  const double need = min_weight_bytes(c, tp);
  if (room > 0 && need > room)
    throw Error("the model's config needs at least " + std::to_string(need / (1 << 30)) +
                " GiB of weights per rank, more than the " + where + "'s " +
                std::to_string(room / (1 << 30)) + " GiB of memory");
}

}  // namespace

ModelConfig load_config(const std::string& dir) {
  return dir.empty() ? parse_model_config(embedded_default_config_json(), "embedded default config")
                     : load_model_config(dir);
}

std::unique_ptr<Qwen35Model> load_model(const std::string& dir, LoadFormat format,
                                        backend::Backend& be, bool verbose, const TpShard& shard,
                                        dist::Communicator* comm) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig cfg = load_config(dir);
  if (shard.size > 1) validate_tp(cfg, shard.size);
  verbose = verbose && shard.rank == 0;
  check_weights_fit(cfg, be, std::max(1, shard.size));
  ModelWeights w;
  if (dir.empty()) {
    w = dummy_weights(cfg, be, 0, shard);
  } else {
    if (format == LoadFormat::kDummy) {
      w = dummy_weights(cfg, be, 0, shard);
    } else {
      Checkpoint ckpt(dir);
      int last_tenth = -1;
      w = load_weights(
          ckpt, cfg, be,
          [&](size_t done, size_t total) {
            const int tenth = total ? static_cast<int>(10 * done / total) : 10;
            if (verbose && tenth != last_tenth) {
              std::fprintf(stderr, "loading weights: %3d%% (%.1f of %.1f MiB)\n", 10 * tenth,
                           static_cast<double>(done) / (1 << 20),
                           static_cast<double>(total) / (1 << 20));
              last_tenth = tenth;
            }
          },
          shard);
    }
  }
  if (verbose) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr,
                 "loaded %s (%s): %lld layers, hidden %lld, vocab %lld, %.1f MiB of weights per "
                 "rank in %.2f s\n",
                 dir.empty() ? "the embedded default model" : dir.c_str(),
                 dir.empty() || format == LoadFormat::kDummy ? "random weights" : "checkpoint",
                 static_cast<long long>(cfg.num_layers), static_cast<long long>(cfg.hidden_size),
                 static_cast<long long>(cfg.vocab_size),
                 static_cast<double>(w.total_bytes) / (1 << 20), s);
  }
  return std::make_unique<Qwen35Model>(cfg, be, std::move(w),
                                       dist::Parallel({shard.size, shard.rank}, comm));
}

}  // namespace deltaserve::model
