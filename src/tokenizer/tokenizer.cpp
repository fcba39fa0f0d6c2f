#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace deltaserve::tokenizer {

using json = nlohmann::json;

namespace {

// GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to U+0100 + n.
struct ByteLevel {
  uint32_t byte_to_cp[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteLevel() {
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      byte_to_cp[b] = keep ? b : 256 + n++;
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevel& byte_level() {
  static const ByteLevel kTable;
  return kTable;
}

// HF's ByteLevel decoder on one token: every char mapped back to its byte, or (when some char is
// not in the alphabet) the token's own UTF-8 bytes.
std::string byte_level_decode(std::string_view token) {
  std::string out;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(token.data());
  utf8proc_ssize_t i = 0, n = static_cast<utf8proc_ssize_t>(token.size());
  while (i < n) {
    utf8proc_int32_t cp;
    const utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
    if (len <= 0) return std::string(token);
    const auto it = byte_level().cp_to_byte.find(static_cast<uint32_t>(cp));
    if (it == byte_level().cp_to_byte.end()) return std::string(token);
    out.push_back(static_cast<char>(it->second));
    i += len;
  }
  return out;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::string nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);  // cannot happen on valid UTF-8; keep the text as is
  std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

// NFC of text, normalising only its non-ASCII runs (each with the ASCII character before it,
// which a combining mark may compose with). Exact: ASCII characters are starters that never
// compose with what precedes them, so NFC distributes over such boundaries.
std::string nfc_non_ascii_runs(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    size_t b = i;
    if (b > 0) {  // the preceding ASCII character joins the run
      --b;
      out.pop_back();
    }
    size_t e = i;
    while (e < s.size() && static_cast<unsigned char>(s[e]) >= 0x80) ++e;
    out += nfc(s.substr(b, e - b));
    i = e;
  }
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

}  // namespace

struct Tokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::filesystem::path& path) {
  const std::string src = path.string();
  auto fail = [&src](const std::string& m) -> Error { return Error(src + ": " + m); };
  std::ifstream in(path);
  if (!in) throw fail("cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw fail("bad JSON");
  std::unique_ptr<Tokenizer> t(new Tokenizer());

  // Normaliser: none or NFC (alone or as the only step of a Sequence).
  const json& norm = j.value("normalizer", json());
  if (!norm.is_null()) {
    const std::string type = norm.value("type", "");
    if (type == "NFC")
      t->nfc_ = true;
    else if (type == "Sequence" && norm["normalizers"].size() == 1 &&
             norm["normalizers"][0].value("type", "") == "NFC")
      t->nfc_ = true;
    else
      throw fail("unsupported normalizer " + norm.dump());
  }

  // Pre-tokenizer: Sequence[Split(Regex, Isolated), ByteLevel(use_regex = false)].
  const json& pre = j.value("pre_tokenizer", json());
  std::string pattern;
  if (pre.value("type", "") == "Sequence") {
    for (const json& p : pre["pretokenizers"]) {
      const std::string type = p.value("type", "");
      if (type == "Split") {
        if (!p.contains("pattern") || !p["pattern"].contains("Regex"))
          throw fail("Split without a Regex pattern");
        if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
          throw fail("only Split behavior Isolated (not inverted) is supported");
        pattern = p["pattern"]["Regex"].get<std::string>();
      } else if (type == "ByteLevel") {
        if (p.value("use_regex", true) || p.value("add_prefix_space", false))
          throw fail("ByteLevel pre-tokenizer with use_regex or add_prefix_space is not supported");
      } else {
        throw fail("unsupported pre-tokenizer " + type);
      }
    }
  }
  if (pattern.empty()) throw fail("no Split regex pre-tokenizer found");
  int err = 0;
  PCRE2_SIZE off = 0;
  t->regex_ = std::make_unique<Regex>();
  t->regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!t->regex_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw fail("pre-tokenizer regex rejected at offset " + std::to_string(off) + ": " +
               reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(t->regex_->code,
                    PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable

  // Model: BPE over byte-level tokens.
  const json& model = j.value("model", json());
  if (model.value("type", "") != "BPE") throw fail("unsupported model type (only BPE)");
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges"))
    throw fail("BPE model without vocab or merges");
  int32_t max_id = -1;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
      throw fail("vocab ids must be non-negative");
    max_id = std::max(max_id, it.value().get<int32_t>());
  }
  for (const json& a : j.value("added_tokens", json::array()))
    max_id = std::max(max_id, a.value("id", -1));
  t->token_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  t->special_.assign(static_cast<size_t>(max_id + 1), 0);
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    const int32_t id = it.value().get<int32_t>();
    std::string bytes = byte_level_decode(it.key());
    t->bytes_to_id_[bytes] = id;
    t->token_to_id_[it.key()] = id;
    t->token_bytes_[static_cast<size_t>(id)] = std::move(bytes);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = t->bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    t->byte_id_[b] = it == t->bytes_to_id_.end() ? -1 : it->second;
  }
  int32_t rank = 0;
  for (const json& m : model["merges"]) {
    std::string a, b;
    if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) throw fail("bad merge '" + s + "'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      throw fail("bad merge entry " + m.dump());
    }
    const std::string ab = byte_level_decode(a), bb = byte_level_decode(b);
    const auto ia = t->bytes_to_id_.find(ab), ib = t->bytes_to_id_.find(bb),
               im = t->bytes_to_id_.find(ab + bb);
    if (ia == t->bytes_to_id_.end() || ib == t->bytes_to_id_.end() || im == t->bytes_to_id_.end())
      throw fail("merge '" + a + " " + b + "' uses a token missing from the vocab");
    t->merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(rank++, im->second));
  }

  for (const json& a : j.value("added_tokens", json::array())) {
    AddedToken at{a.value("content", ""), a.value("id", -1), a.value("special", false)};
    if (at.content.empty() || at.id < 0) throw fail("bad added token " + a.dump());
    t->token_bytes_[static_cast<size_t>(at.id)] = byte_level_decode(at.content);
    t->special_[static_cast<size_t>(at.id)] = at.special;
    t->token_to_id_[at.content] = at.id;
    t->added_first_byte_[static_cast<unsigned char>(at.content[0])] = true;
    t->added_.push_back(std::move(at));
  }
  std::sort(t->added_.begin(), t->added_.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  return t;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  const auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                std::to_string(vocab_size()) + ")");
  return token_bytes_[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::string& b = token_bytes(id);
    if (!(skip_special_tokens && special_[static_cast<size_t>(id)])) bytes += b;
  }
  return utf8_lossy(bytes);
}

void Tokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> syms(word.size());
  for (size_t i = 0; i < word.size(); ++i)
    syms[i] = {byte_id_[static_cast<unsigned char>(word[i])], static_cast<int32_t>(i) - 1,
               i + 1 < word.size() ? static_cast<int32_t>(i + 1) : -1};
  struct Cand {
    int32_t rank, pos;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || syms[static_cast<size_t>(pos)].next < 0) return;
    const auto it =
        merges_.find(pair_key(syms[static_cast<size_t>(pos)].id,
                              syms[static_cast<size_t>(syms[static_cast<size_t>(pos)].next)].id));
    if (it != merges_.end()) heap.push({it->second.first, pos});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(word.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& s = syms[static_cast<size_t>(c.pos)];
    if (s.id < 0 || s.next < 0) continue;  // merged away
    Sym& n = syms[static_cast<size_t>(s.next)];
    const auto it = merges_.find(pair_key(s.id, n.id));
    if (it == merges_.end() || it->second.first != c.rank) continue;  // stale
    s.id = it->second.second;
    n.id = -1;
    s.next = n.next;
    if (s.next >= 0) syms[static_cast<size_t>(s.next)].prev = c.pos;
    consider(s.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next)
    out.push_back(syms[static_cast<size_t>(i)].id);
}

void Tokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc_ && !is_ascii(text)) {
    normalized = nfc_non_ascii_runs(text);
    text = normalized;
  }
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  auto piece = [&](size_t b, size_t e) {
    const std::string_view w = text.substr(b, e - b);
    if (w.size() <= 1) {
      if (!w.empty()) bpe(w, out);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      const auto it = cache_.find(w);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t start = out.size();
    bpe(w, out);
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() > 200000) cache_.clear();
    cache_.emplace(std::string(w),
                   std::vector<int32_t>(out.begin() + static_cast<int64_t>(start), out.end()));
  };
  size_t pos = 0, last = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_match(regex_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                               pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (b > last) piece(last, b);  // Isolated: the gap is a piece too
    if (e > b) {
      piece(b, e);
      pos = last = e;
    } else {  // empty match: step one character
      pos = b + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  if (last < text.size()) piece(last, text.size());
  pcre2_match_data_free(md);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::string clean;
  if (!is_valid_utf8(text)) {
    clean = utf8_lossy(text);
    text = clean;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  size_t seg = 0;
  if (parse_special && !added_.empty()) {
    for (size_t i = 0; i < text.size(); ++i) {
      if (!added_first_byte_[static_cast<unsigned char>(text[i])]) continue;
      for (const AddedToken& a : added_) {  // longest first: leftmost-longest match
        if (text.compare(i, a.content.size(), a.content) == 0) {
          encode_segment(text.substr(seg, i - seg), out);
          out.push_back(a.id);
          seg = i + a.content.size();
          i = seg - 1;
          break;
        }
      }
    }
  }
  encode_segment(text.substr(seg), out);
  return out;
}

}  // namespace deltaserve::tokenizer
