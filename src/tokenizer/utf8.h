// UTF-8 helpers shared by the tokenizer: lossy decoding with U+FFFD for invalid bytes (the
// "maximal subpart" rule Rust's String::from_utf8_lossy and HF tokenizers use).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace deltaserve::tokenizer {

// Appends the lossy decoding of `bytes` to `out` and returns how many bytes were consumed. When
// `final` is false, an incomplete sequence at the end that could still become valid is left
// unconsumed (so streaming never emits text that a later byte would change).
size_t append_utf8_lossy(std::string_view bytes, bool final, std::string& out);

// The lossy decoding of the whole of `bytes`.
inline std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  append_utf8_lossy(bytes, true, out);
  return out;
}

// True when `s` is well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

}  // namespace deltaserve::tokenizer
