// Tokenizer: byte-level BPE loaded from an HF tokenizer.json (NFC normaliser, Split regex
// pre-tokenizer taken from the file and run by PCRE2, ByteLevel mapping, merges by rank, added and
// special tokens matched before pre-tokenization). Thread-safe after construction.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deltaserve::tokenizer {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
};

// Hash for unordered maps keyed by std::string that are looked up with std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

class Tokenizer {
 public:
  // Loads tokenizer.json; throws deltaserve::Error naming the file for anything unsupported
  // (a model other than BPE, a normaliser other than NFC, a pre-tokenizer other than
  // Split + ByteLevel, a regex PCRE2 rejects, ...).
  static std::unique_ptr<Tokenizer> from_file(const std::filesystem::path& tokenizer_json);
  ~Tokenizer();

  // Token ids of `text`. Invalid UTF-8 is first replaced by U+FFFD (as a lossy decode would).
  // With parse_special, added tokens in the text become their ids; otherwise text only.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // Text of `ids` (lossy UTF-8). Throws deltaserve::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes one token contributes to decode (empty for a skipped special token).
  const std::string& token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;
  // Id of an exact token (vocabulary entry in byte-level form, or added token content); -1 if none.
  int32_t token_to_id(std::string_view token) const;
  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }

 private:
  Tokenizer() = default;
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;

  struct Regex;
  std::unique_ptr<Regex> regex_;
  StringMap<int32_t> bytes_to_id_;  // raw bytes of a vocab token -> id
  StringMap<int32_t> token_to_id_;  // byte-level form / added content -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>
      merges_;                            // (left, right) -> (rank, merged)
  std::vector<std::string> token_bytes_;  // id -> bytes for decode
  std::vector<uint8_t> special_;          // id -> special added token
  std::vector<AddedToken> added_;         // longest first within each first byte
  bool added_first_byte_[256] = {};
  int32_t byte_id_[256] = {};
  bool nfc_ = false;

  mutable std::mutex cache_mu_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace deltaserve::tokenizer
