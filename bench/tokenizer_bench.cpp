// Tokenizer throughput: loads tokenizer.json, encodes one text file in a single call several
// times (the same call shape as HF tokenizers' encode in tools/make_tokenizer_goldens.py --bench)
// and prints one JSON line with medians.
// Usage: tokenizer_bench TOKENIZER_DIR TEXT_FILE [REPEATS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  using namespace deltaserve;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_DIR TEXT_FILE [REPEATS]\n", argv[0]);
    return 2;
  }
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  try {
    const auto t0 = clock::now();
    const auto tok = tokenizer::Tokenizer::from_file(std::string(argv[1]) + "/tokenizer.json");
    const double load_s = secs(t0, clock::now());
    std::ifstream in(argv[2], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
    std::vector<double> enc, dec;
    size_t tokens = 0;
    for (int r = 0; r < repeats; ++r) {
      const auto a = clock::now();
      const std::vector<int32_t> ids = tok->encode(text, false);
      const auto b = clock::now();
      const std::string back = tok->decode(ids);
      const auto c = clock::now();
      enc.push_back(secs(a, b));
      dec.push_back(secs(b, c));
      tokens = ids.size();
    }
    std::sort(enc.begin(), enc.end());
    std::sort(dec.begin(), dec.end());
    const double mb = static_cast<double>(text.size()) / 1e6;
    std::printf(
        "{\"impl\": \"deltaserve\", \"mb\": %.3f, \"tokens\": %zu, \"load_s\": %.3f, \"encode_median_s\": %.4f, "
        "\"encode_mb_per_s\": %.2f, \"decode_median_s\": %.4f, \"decode_mb_per_s\": %.2f, \"repeats\": %d}\n",
        mb, tokens, load_s, enc[enc.size() / 2], mb / enc[enc.size() / 2], dec[dec.size() / 2],
        mb / dec[dec.size() / 2], repeats);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
