// Tokenizer throughput: loads tokenizer.json and encodes one text file several times, as one call
// and as ~4 KB documents split at newlines (the same call shapes as HF tokenizers' encode in
// tools/make_tokenizer_goldens.py --bench), printing one JSON line with medians. With IDS_OUT it
// also writes the single-call ids (int32) for comparison with HF's.
// Usage: tokenizer_bench TOKENIZER_DIR TEXT_FILE [REPEATS] [IDS_OUT]
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
  auto secs = [](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  try {
    const auto t0 = clock::now();
    const auto tok = tokenizer::Tokenizer::from_file(std::string(argv[1]) + "/tokenizer.json");
    const double load_s = secs(t0, clock::now());
    std::ifstream in(argv[2], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
    std::vector<std::string_view> docs;  // ~4 KB pieces ending at a newline
    for (size_t i = 0; i < text.size();) {
      size_t e = std::min(text.size(), i + 4096);
      const size_t nl = text.find('\n', e);
      e = nl == std::string::npos ? text.size() : nl + 1;
      docs.push_back(std::string_view(text).substr(i, e - i));
      i = e;
    }
    std::vector<double> enc, dec, enc_docs;
    std::vector<int32_t> ids;
    size_t doc_tokens = 0;
    for (int r = 0; r < repeats; ++r) {
      const auto a = clock::now();
      ids = tok->encode(text);
      const auto b = clock::now();
      const std::string back = tok->decode(ids);
      const auto c = clock::now();
      doc_tokens = 0;
      for (std::string_view d : docs) doc_tokens += tok->encode(d).size();
      const auto e = clock::now();
      enc.push_back(secs(a, b));
      dec.push_back(secs(b, c));
      enc_docs.push_back(secs(c, e));
    }
    const size_t tokens = ids.size();
    if (argc > 4) {
      std::ofstream out(argv[4], std::ios::binary);
      out.write(reinterpret_cast<const char*>(ids.data()),
                static_cast<std::streamsize>(ids.size() * 4));
    }
    std::sort(enc.begin(), enc.end());
    std::sort(dec.begin(), dec.end());
    std::sort(enc_docs.begin(), enc_docs.end());
    const double mb = static_cast<double>(text.size()) / 1e6;
    std::printf(
        "{\"impl\": \"deltaserve\", \"mb\": %.3f, \"tokens\": %zu, \"load_s\": %.3f, "
        "\"encode_median_s\": %.4f, "
        "\"encode_mb_per_s\": %.2f, \"docs\": %zu, \"doc_tokens\": %zu, \"encode_docs_median_s\": "
        "%.4f, "
        "\"encode_docs_mb_per_s\": %.2f, \"decode_median_s\": %.4f, \"decode_mb_per_s\": %.2f, "
        "\"repeats\": %d}\n",
        mb, tokens, load_s, enc[enc.size() / 2], mb / enc[enc.size() / 2], docs.size(), doc_tokens,
        enc_docs[enc_docs.size() / 2], mb / enc_docs[enc_docs.size() / 2], dec[dec.size() / 2],
        mb / dec[dec.size() / 2], repeats);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
