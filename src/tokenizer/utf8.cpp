#include "tokenizer/utf8.h"

#include <cstdint>

namespace deltaserve::tokenizer {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// For a lead byte: the number of continuation bytes and the allowed range of the first one
// (Unicode Table 3-7); need = -1 for a byte that cannot start a sequence.
struct Lead {
  int need;
  uint8_t lo, hi;
};

Lead lead_of(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {-1, 0, 0};
}

}  // namespace

size_t append_utf8_lossy(std::string_view bytes, bool final, std::string& out) {
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      size_t j = i + 1;
      while (j < n && s[j] < 0x80) ++j;
      out.append(bytes.data() + i, j - i);
      i = j;
      continue;
    }
    const Lead l = lead_of(b);
    if (l.need < 0) {
      out.append(kReplacement);
      ++i;
      continue;
    }
    size_t j = i + 1;
    int got = 0;
    bool bad = false;
    while (got < l.need) {
      if (j >= n) break;
      const uint8_t lo = got == 0 ? l.lo : 0x80, hi = got == 0 ? l.hi : 0xBF;
      if (s[j] < lo || s[j] > hi) {
        bad = true;
        break;
      }
      ++j;
      ++got;
    }
    if (got == l.need) {
      out.append(bytes.data() + i, j - i);
    } else if (bad || final) {
      out.append(kReplacement);  // the maximal valid prefix becomes one U+FFFD
    } else {
      return i;  // incomplete, may still become valid
    }
    i = j;
  }
  return n;
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Lead l = lead_of(p[i]);
    if (l.need < 0 || n - i <= static_cast<size_t>(l.need)) return false;
    if (p[i + 1] < l.lo || p[i + 1] > l.hi) return false;
    for (int k = 2; k <= l.need; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    i += static_cast<size_t>(l.need) + 1;
  }
  return true;
}

}  // namespace deltaserve::tokenizer
