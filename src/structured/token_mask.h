// Which tokens a JsonMatcher state allows next: a byte trie of the vocabulary walked from the
// state (a subtree is left as soon as its first byte kills the state; inside a string the state
// does not change, so the walk there costs the trie's nodes, not new states), and a cache of the
// masks by state key, per grammar, since documents revisit the same states (a new string value,
// the comma after a value, ...). Inside a string a subtree of plain bytes only is taken whole.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/json_matcher.h"

namespace deltaserve::structured {

// A set of token ids, stored as the smaller of itself and its complement in [0, vocab).
struct TokenMask {
  bool complement = false;   // ids are the tokens left out, not those allowed
  std::vector<int32_t> ids;  // ascending
  bool allows(int32_t t) const {
    return std::binary_search(ids.begin(), ids.end(), t) != complement;
  }
};

class VocabTrie {
 public:
  // token_bytes[id]: the bytes token id decodes to; empty ones (special tokens) are left out.
  explicit VocabTrie(const std::vector<std::string>& token_bytes);

  // The ids whose bytes `m` takes without dying.
  TokenMask mask(const JsonMatcher& m) const;
  int32_t vocab_size() const { return vocab_; }

 private:
  struct Node {
    uint8_t byte = 0;
    // order_[first_token, + num_tokens): the tokens ending here; [first_token, subtree_end): all
    // the tokens through this node.
    int32_t first_token = 0, num_tokens = 0, subtree_end = 0;
    int32_t first_child = 0, num_children = 0;
    bool plain = false;  // this node's byte and every byte below it are plain string bytes
  };
  void walk(const Node& n, const JsonMatcher& m, std::vector<int32_t>& out) const;
  std::vector<Node> nodes_;     // nodes_[0] the root; a node's children contiguous
  std::vector<int32_t> order_;  // the token ids by their bytes
  int32_t vocab_ = 0;
};

// The masks of a grammar's states, cached (at most kMaxEntries states; then cleared) and shared
// with the callers. Thread-safe; one per (grammar, vocabulary).
class MaskCache {
 public:
  static constexpr size_t kMaxEntries = 128;
  std::shared_ptr<const TokenMask> mask(const VocabTrie& trie, const JsonMatcher& m);

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const TokenMask>> masks_;
};

// What a structured-output request carries: its grammar and the masks of the grammar's states,
// shared by every request of that grammar (the n choices of one request, or requests with the same
// schema).
struct JsonConstraint {
  explicit JsonConstraint(std::shared_ptr<const JsonGrammar> g) : grammar(std::move(g)) {}
  std::shared_ptr<const JsonGrammar> grammar;
  mutable MaskCache masks;
};

}  // namespace deltaserve::structured
