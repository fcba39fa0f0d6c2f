// CacheManager: the engine's one view of the cache (in the spirit of llama.cpp's memory
// interface). It hands out KV pages (reference counted, so cached prefixes can be shared), state
// slots for running requests and snapshot slots for GDN state snapshots, all as ids; the device
// memory behind them is the model runner's, laid out by the same MemoryPlan (snapshot i is state
// slot num_slots + i). The scheduler talks to this, never to raw pools.
//
// With prefix caching on, computed full pages are indexed by block hash (PrefixCache) and kept
// after their requests release them; a page nobody holds but the cache is evictable, and counts
// as available: taking pages evicts the least recently released ones first (with their
// snapshots). Snapshots are taken into free snapshot slots, evicting the least recently used
// unpinned one when none is free.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cache/page_pool.h"
#include "cache/prefix_cache.h"

namespace deltaserve::cache {

struct CacheShape {
  int32_t num_pages = 0, page_size = 16, num_slots = 0, num_snapshots = 0;
  bool prefix_caching = false;
};

// What a lookup found: `tokens` positions resumable (KV pages and a snapshot at that position),
// `kv_tokens` positions whose KV pages alone are cached (>= tokens).
struct PrefixHit {
  int32_t tokens = 0, kv_tokens = 0;
  int32_t snapshot = -1;  // the snapshot slot at `tokens` (-1 when tokens == 0)
};

class CacheManager {
 public:
  explicit CacheManager(CacheShape shape);

  const CacheShape& shape() const { return shape_; }
  // KV pages.
  int32_t page_size() const { return pages_.page_size(); }
  int32_t pages_for(int64_t tokens) const { return pages_.pages_for(tokens); }
  int32_t num_pages() const { return pages_.num_pages(); }
  int32_t num_free_pages() const { return pages_.num_free(); }
  // Free pages plus cached pages nobody but the cache holds (taken by eviction when needed).
  int32_t num_available_pages() const { return pages_.num_free() + num_evictable_pages(); }
  int32_t num_evictable_pages() const { return prefix_ ? prefix_->num_evictable() : 0; }
  // Grows `table` to cover `tokens` positions with new pages, evicting cached ones as needed;
  // false (unchanged) when too few are available.
  bool grow_pages(std::vector<int32_t>& table, int64_t tokens);
  // Appends `pages` (held by someone else: a cached prefix) to `table`, one more hold on each.
  void share_pages(std::vector<int32_t>& table, std::span<const int32_t> pages);
  // Drops the table's holds (last page first); cached pages stay, evictable once nobody holds
  // them.
  void release_pages(std::vector<int32_t>& table);
  int32_t page_refcount(int32_t page) const { return pages_.refcount(page); }

  // Prefix caching (all no-ops / misses when off).
  bool prefix_caching() const { return prefix_ != nullptr; }
  // The longest cached prefix of `tokens` (block hashes `hashes`) resumable within `limit`
  // positions, at a multiple of `snapshot_every`.
  PrefixHit lookup(std::span<const uint64_t> hashes, std::span<const int32_t> tokens, int32_t limit,
                   int32_t snapshot_every) const;
  // Takes a hit for a request: its pages appended to `table`, its snapshot pinned until
  // release_hit.
  void adopt(const PrefixHit& hit, std::span<const uint64_t> hashes, std::vector<int32_t>& table);
  void release_hit(uint64_t snapshot_block);
  // Indexes table[i] as block hashes[i] for i in [from, to) (pages whose tokens are computed).
  void index_blocks(std::span<const uint64_t> hashes, std::span<const int32_t> tokens,
                    std::span<const int32_t> table, int32_t from, int32_t to);
  bool has_snapshot(uint64_t block) const;
  // A slot for a new snapshot: a free one, else the least recently used unpinned snapshot's; -1
  // when none can be had.
  int32_t take_snapshot_slot();
  // Files `slot` as the snapshot at the end of `block`; when the block is not indexed or has one
  // already, the slot is freed instead.
  void file_snapshot(uint64_t block, int32_t slot);
  // Frees the block's snapshot unless a request is about to restore it.
  void drop_snapshot(uint64_t block);
  int32_t num_cached_blocks() const { return prefix_ ? prefix_->num_blocks() : 0; }

  // State slots of running requests: [0, num_slots).
  int32_t acquire_slot() { return slots_.acquire(); }  // -1 when none is free
  void release_slot(int32_t slot) { slots_.release(slot); }
  int32_t num_free_slots() const { return slots_.num_free(); }

  // Snapshot slots, as state-slot indices [num_slots, num_slots + num_snapshots).
  int32_t acquire_snapshot();  // -1 when none is free
  void release_snapshot(int32_t slot);
  int32_t num_free_snapshots() const { return snapshots_.num_free(); }

 private:
  void evict_pages(int32_t n);

  CacheShape shape_;
  PagePool pages_;
  StateSlots slots_;
  IdPool snapshots_;
  std::unique_ptr<PrefixCache> prefix_;
  uint64_t clock_ = 0;  // advances on every release and snapshot use (LRU order)
};

}  // namespace deltaserve::cache
