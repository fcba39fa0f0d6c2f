// The tokenizer on arbitrary bytes: encode (with and without special tokens), and decode of
// arbitrary in-range ids, with and without skipping special tokens.
#include <cstring>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltaserve::tokenizer;
  static const auto tok = Tokenizer::from_file(std::string(DS_QWEN3_TOKENIZER) + "/tokenizer.json");
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tok->encode(text, size % 2 == 0);
  for (int32_t id : ids)
    if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
  std::vector<int32_t> raw(size / 4);
  for (size_t i = 0; i < raw.size(); ++i) {
    uint32_t v = 0;
    std::memcpy(&v, data + 4 * i, 4);
    raw[i] = static_cast<int32_t>(v % static_cast<uint32_t>(tok->vocab_size()));
  }
  (void)tok->decode(raw, false);
  (void)tok->decode(raw, true);
  (void)tok->decode(ids, false);
  return 0;
}
