#include "structured/token_mask.h"

#include <algorithm>

namespace deltaserve::structured {

VocabTrie::VocabTrie(const std::vector<std::string>& token_bytes)
    : vocab_(static_cast<int32_t>(token_bytes.size())) {
  std::vector<int32_t>& order = order_;
  for (int32_t i = 0; i < vocab_; ++i)
    if (!token_bytes[static_cast<size_t>(i)].empty()) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return token_bytes[static_cast<size_t>(a)] < token_bytes[static_cast<size_t>(b)];
  });
  // Breadth-first over sorted ranges: a node's tokens [begin, end) share its bytes as a prefix.
  struct Pending {
    int32_t node;
    size_t begin, end, depth;
  };
  // Per token (in order): the position of its last byte that may not appear plain in a string.
  std::vector<int32_t> last_special(order.size(), -1);
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string& b = token_bytes[static_cast<size_t>(order[k])];
    for (size_t i = 0; i < b.size(); ++i)
      if (!string_plain(static_cast<uint8_t>(b[i]))) last_special[k] = static_cast<int32_t>(i);
  }
  nodes_.push_back({});
  std::vector<Pending> queue{{0, 0, order.size(), 0}};
  for (size_t q = 0; q < queue.size(); ++q) {
    const Pending p = queue[q];
    size_t i = p.begin;
    const auto bytes = [&](size_t k) -> const std::string& {
      return token_bytes[static_cast<size_t>(order[k])];
    };
    // The tokens whose bytes end here (several where two ids decode to the same bytes), then
    // the children, one per next byte.
    Node& node = nodes_[static_cast<size_t>(p.node)];
    node.first_token = static_cast<int32_t>(i);
    node.subtree_end = static_cast<int32_t>(p.end);
    node.plain = p.depth > 0 &&
                 std::all_of(last_special.begin() + static_cast<std::ptrdiff_t>(p.begin),
                             last_special.begin() + static_cast<std::ptrdiff_t>(p.end),
                             [&](int32_t at) { return at < static_cast<int32_t>(p.depth) - 1; });
    while (i < p.end && bytes(i).size() == p.depth) ++i;
    node.num_tokens = static_cast<int32_t>(i - p.begin);
    node.first_child = static_cast<int32_t>(nodes_.size());
    while (i < p.end) {
      const char c = bytes(i)[p.depth];
      size_t j = i;
      while (j < p.end && bytes(j)[p.depth] == c) ++j;
      nodes_.emplace_back().byte = static_cast<uint8_t>(c);
      ++nodes_[static_cast<size_t>(p.node)].num_children;
      queue.push_back({static_cast<int32_t>(nodes_.size()) - 1, i, j, p.depth + 1});
      i = j;
    }
  }
}

void VocabTrie::walk(const Node& n, const JsonMatcher& m, std::vector<int32_t>& out) const {
  for (int32_t c = n.first_child; c < n.first_child + n.num_children; ++c) {
    const Node& child = nodes_[static_cast<size_t>(c)];
    const auto take = [&] {
      out.insert(out.end(), order_.begin() + child.first_token,
                 order_.begin() + child.first_token + child.num_tokens);
    };
    if (m.absorbs(child.byte)) {  // the state stays as it is through this byte
      if (child.plain) {          // ... and through every token below
        out.insert(out.end(), order_.begin() + child.first_token,
                   order_.begin() + child.subtree_end);
        continue;
      }
      take();
      walk(child, m, out);
      continue;
    }
    const JsonMatcher next = m.advance(child.byte);
    if (next.dead()) continue;
    take();
    walk(child, next, out);
  }
}

TokenMask VocabTrie::mask(const JsonMatcher& m) const {
  std::vector<int32_t> found;  // in the trie's order
  if (!m.dead()) walk(nodes_[0], m, found);
  // Marked, then read out in id order as the smaller of the set and its complement (no sort).
  std::vector<uint8_t> marked(static_cast<size_t>(vocab_), 0);
  for (int32_t t : found) marked[static_cast<size_t>(t)] = 1;
  TokenMask out;
  out.complement = found.size() * 2 > static_cast<size_t>(vocab_);
  out.ids.reserve(out.complement ? static_cast<size_t>(vocab_) - found.size() : found.size());
  for (int32_t t = 0; t < vocab_; ++t)
    if (marked[static_cast<size_t>(t)] != out.complement) out.ids.push_back(t);
  return out;
}

std::shared_ptr<const TokenMask> MaskCache::mask(const VocabTrie& trie, const JsonMatcher& m) {
  const std::string key = m.key();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = masks_.find(key); it != masks_.end()) return it->second;
  }
  auto mask = std::make_shared<const TokenMask>(trie.mask(m));
  std::lock_guard<std::mutex> lock(mu_);
  if (masks_.size() >= kMaxEntries) masks_.clear();
  masks_.emplace(key, mask);
  return mask;
}

}  // namespace deltaserve::structured
