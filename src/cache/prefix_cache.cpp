#include "cache/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace deltaserve::cache {

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = splitmix(parent ^ tokens.size());
  for (int32_t t : tokens) h = splitmix(h ^ static_cast<uint32_t>(t));
  return h == 0 ? 1 : h;  // 0 means "no block"
}

void extend_block_hashes(std::vector<uint64_t>& hashes, std::span<const int32_t> tokens,
                         int32_t block_tokens) {
  const size_t full = tokens.size() / static_cast<size_t>(block_tokens);
  for (size_t i = hashes.size(); i < full; ++i)
    hashes.push_back(block_hash(
        i == 0 ? kRootBlockHash : hashes[i - 1],
        tokens.subspan(i * static_cast<size_t>(block_tokens), static_cast<size_t>(block_tokens))));
}

const PrefixCache::Entry* PrefixCache::find(uint64_t hash) const {
  const auto it = entries_.find(hash);
  return it == entries_.end() ? nullptr : &it->second;
}

const PrefixCache::Entry* PrefixCache::find(uint64_t hash, uint64_t parent,
                                            std::span<const int32_t> tokens) const {
  const Entry* e = find(hash);
  if (!e || e->parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), e->tokens.begin(), e->tokens.end()))
    return nullptr;
  return e;
}

PrefixCache::Entry& PrefixCache::at(uint64_t hash) {
  const auto it = entries_.find(hash);
  DS_CHECK(it != entries_.end(), "prefix cache: unknown block");
  return it->second;
}

bool PrefixCache::insert(uint64_t hash, uint64_t parent, int32_t depth,
                         std::span<const int32_t> tokens, int32_t page) {
  DS_CHECK(hash != 0 && !holds_page(page), "prefix cache: page indexed twice");
  const auto [it, fresh] = entries_.try_emplace(hash);
  if (!fresh) return false;
  Entry& e = it->second;
  e.parent = parent;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.page = page;
  e.depth = depth;
  e.hash = hash;
  page_entry_[static_cast<size_t>(page)] = &e;
  return true;
}

void PrefixCache::set_evictable(int32_t page, bool evictable, uint64_t now) {
  Entry* e = page_entry_[static_cast<size_t>(page)];
  DS_CHECK(e != nullptr, "prefix cache: page not indexed");
  if (e->evictable == evictable) return;
  if (e->evictable) evictable_.erase(release_key(e->hash, *e));
  e->evictable = evictable;
  if (evictable) {
    e->released_at = now;
    evictable_.insert(release_key(e->hash, *e));
  }
}

int32_t PrefixCache::evict_block(int32_t& snapshot) {
  snapshot = -1;
  if (evictable_.empty()) return -1;
  const uint64_t hash = std::get<2>(*evictable_.begin());
  evictable_.erase(evictable_.begin());
  const auto it = entries_.find(hash);
  DS_CHECK(it != entries_.end(), "prefix cache: unknown block");
  const Entry& e = it->second;
  DS_CHECK(e.pins == 0, "prefix cache: evicting a pinned snapshot");
  if (e.snapshot >= 0) {
    snapshots_.erase(snapshot_key(hash, e));
    snapshot = e.snapshot;
  }
  const int32_t page = e.page;
  page_entry_[static_cast<size_t>(page)] = nullptr;
  entries_.erase(it);
  return page;
}

bool PrefixCache::attach_snapshot(uint64_t hash, int32_t slot, uint64_t now) {
  const auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.snapshot >= 0) return false;
  Entry& e = it->second;
  e.snapshot = slot;
  e.snapshot_used_at = now;
  snapshots_.insert(snapshot_key(hash, e));
  return true;
}

void PrefixCache::pin_snapshot(uint64_t hash) {
  Entry& e = at(hash);
  DS_CHECK(e.snapshot >= 0, "prefix cache: pinning a block without a snapshot");
  if (e.pins++ == 0) snapshots_.erase(snapshot_key(hash, e));
}

void PrefixCache::unpin_snapshot(uint64_t hash, uint64_t now) {
  Entry& e = at(hash);
  DS_CHECK(e.pins > 0, "prefix cache: unpinning an unpinned snapshot");
  if (--e.pins > 0) return;
  e.snapshot_used_at = now;
  snapshots_.insert(snapshot_key(hash, e));
}

int32_t PrefixCache::detach_snapshot(uint64_t hash) {
  const auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.snapshot < 0 || it->second.pins > 0) return -1;
  Entry& e = it->second;
  snapshots_.erase(snapshot_key(hash, e));
  const int32_t slot = e.snapshot;
  e.snapshot = -1;
  return slot;
}

int32_t PrefixCache::evict_snapshot() {
  if (snapshots_.empty()) return -1;
  return detach_snapshot(std::get<2>(*snapshots_.begin()));
}

}  // namespace deltaserve::cache
