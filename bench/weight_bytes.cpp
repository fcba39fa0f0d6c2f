// Per-rank weight bytes of a model at several tensor-parallel degrees, as the loader allocates them
// on the CUDA backend (bf16 matrices, f32 vectors; model::weight_bytes), with the share of the
// (vocabulary-parallel) embedding and lm_head. No GPU needed.
// Usage: weight_bytes --model DIR[,DIR...] [--tp 1,2,4,8]
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "app/args.h"
#include "model/config.h"
#include "model/tp_shard.h"
#include "model/weights.h"

namespace ds = deltaserve;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    ds::app::Args a(args, "weight_bytes", {"model", "tp"}, {});
    std::printf(
        "| model | TP | weights per rank (bytes) | GiB | of which embedding + lm_head (GiB) |\n"
        "|---|---|---|---|---|\n");
    for (const std::string& dir : split(a.get("model", "bench/configs/qwen3.5-4b"))) {
      const ds::model::ModelConfig cfg = ds::model::load_model_config(dir);
      for (const std::string& t : split(a.get("tp", "1,2,4,8"))) {
        const int n = std::stoi(t);
        const int64_t bytes =
            ds::model::weight_bytes(cfg, {n, 0}, ds::DType::kBF16, ds::DType::kF32);
        const int64_t rows = n > 1 ? ds::model::vocab_shard_rows(cfg, n) : cfg.vocab_size;
        const int64_t vocab = rows * cfg.hidden_size * 2 * (cfg.tie_word_embeddings ? 1 : 2);
        std::printf("| %s | %d | %lld | %.2f | %.2f |\n", dir.c_str(), n,
                    static_cast<long long>(bytes), bytes / kGiB, vocab / kGiB);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weight_bytes: %s\n", e.what());
    return 1;
  }
}
