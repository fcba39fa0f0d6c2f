// PrefixCache: the index of cached prefixes. A block is one KV page of tokens, named by a hash of
// (its parent block's hash, its tokens); its entry holds the page (one reference of the cache's
// own) and, where one was taken at the block's end, a GDN state snapshot slot. Entries whose page
// nobody else holds are evictable, least recently released first (deeper blocks of the same
// release first, so chains shrink from their tips); unpinned snapshots are evictable on their own,
// least recently used first. Host bookkeeping only: ids, never device memory.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace deltaserve::cache {

inline constexpr uint64_t kRootBlockHash = 0x6a09e667f3bcc908ull;

// The hash of a block of `tokens` following the block hashed `parent` (kRootBlockHash first).
uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens);
// Appends the hashes of the full blocks of `tokens` not yet in `hashes`.
void extend_block_hashes(std::vector<uint64_t>& hashes, std::span<const int32_t> tokens,
                         int32_t block_tokens);

class PrefixCache {
 public:
  struct Entry {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    int32_t page = -1;
    int32_t depth = 0;  // block index: the block covers [depth * size, (depth + 1) * size)
    int32_t snapshot = -1;
    int32_t pins = 0;  // requests about to restore the snapshot
    uint64_t released_at = 0, snapshot_used_at = 0;
    bool evictable = false;
    uint64_t hash = 0;  // its own key
  };

  // Buckets for every page up front: a cache that fills its pages never rehashes.
  explicit PrefixCache(int32_t num_pages) : page_entry_(static_cast<size_t>(num_pages), nullptr) {
    entries_.reserve(static_cast<size_t>(num_pages));
  }

  // The entry of block `hash` if it holds exactly `tokens` after `parent`, else null.
  const Entry* find(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const;
  const Entry* find(uint64_t hash) const;
  // Indexes `page` as block `hash`; false when the block is indexed already (the caller keeps
  // its page). The caller gives the cache its own reference on the page.
  bool insert(uint64_t hash, uint64_t parent, int32_t depth, std::span<const int32_t> tokens,
              int32_t page);
  bool holds_page(int32_t page) const { return page_entry_[static_cast<size_t>(page)] != nullptr; }

  // Page holders: `evictable` when only the cache holds the page. Precondition: holds_page(page).
  void set_evictable(int32_t page, bool evictable, uint64_t now);
  int32_t num_evictable() const { return static_cast<int32_t>(evictable_.size()); }
  int32_t num_blocks() const { return static_cast<int32_t>(entries_.size()); }
  // Removes the least recently released evictable block; returns its page (still referenced by
  // the cache: the caller drops that reference) and, through `snapshot`, its snapshot slot (-1 if
  // none) to free. -1 when nothing is evictable.
  int32_t evict_block(int32_t& snapshot);

  // Snapshots. attach: false when the block is not indexed or has one already.
  bool attach_snapshot(uint64_t hash, int32_t slot, uint64_t now);
  void pin_snapshot(uint64_t hash);
  void unpin_snapshot(uint64_t hash, uint64_t now);
  // Detaches the block's snapshot if it is unpinned; its slot, or -1.
  int32_t detach_snapshot(uint64_t hash);
  // Detaches the least recently used unpinned snapshot; its slot, or -1 when none.
  int32_t evict_snapshot();

 private:
  using Key = std::tuple<uint64_t, int32_t, uint64_t>;  // (time, order within it, block hash)
  Entry& at(uint64_t hash);
  static Key release_key(uint64_t hash, const Entry& e) { return {e.released_at, -e.depth, hash}; }
  static Key snapshot_key(uint64_t hash, const Entry& e) {
    return {e.snapshot_used_at, e.depth, hash};
  }

  std::unordered_map<uint64_t, Entry> entries_;
  // page -> its block's entry (null: not indexed); a map's nodes stay put, rehashed or not
  std::vector<Entry*> page_entry_;
  std::set<Key> evictable_;  // blocks only the cache holds
  std::set<Key> snapshots_;  // unpinned snapshots
};

}  // namespace deltaserve::cache
