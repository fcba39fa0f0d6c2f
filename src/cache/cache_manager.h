// CacheManager: the engine's one view of the cache (in the spirit of llama.cpp's memory
// interface). It hands out KV pages (reference counted, so cached prefixes can be shared), state
// slots for running requests and snapshot slots for GDN state snapshots, all as ids; the device
// memory behind them is the model runner's, laid out by the same MemoryPlan (snapshot i is state
// slot num_slots + i). The scheduler talks to this, never to raw pools. No prefix caching yet:
// this is its seam.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/page_pool.h"

namespace deltaserve::cache {

struct CacheShape {
  int32_t num_pages = 0, page_size = 16, num_slots = 0, num_snapshots = 0;
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
  // Grows `table` to cover `tokens` positions with new pages; false (unchanged) when too few are
  // free.
  bool grow_pages(std::vector<int32_t>& table, int64_t tokens) {
    return pages_.grow(table, tokens);
  }
  // Appends `pages` (held by someone else: a cached prefix) to `table`, one more hold on each.
  void share_pages(std::vector<int32_t>& table, std::span<const int32_t> pages);
  void release_pages(std::vector<int32_t>& table) { pages_.release(table); }
  int32_t page_refcount(int32_t page) const { return pages_.refcount(page); }

  // State slots of running requests: [0, num_slots).
  int32_t acquire_slot() { return slots_.acquire(); }  // -1 when none is free
  void release_slot(int32_t slot) { slots_.release(slot); }
  int32_t num_free_slots() const { return slots_.num_free(); }

  // Snapshot slots, as state-slot indices [num_slots, num_slots + num_snapshots).
  int32_t acquire_snapshot();  // -1 when none is free
  void release_snapshot(int32_t slot);
  int32_t num_free_snapshots() const { return snapshots_.num_free(); }

 private:
  CacheShape shape_;
  PagePool pages_;
  StateSlots slots_;
  IdPool snapshots_;
};

}  // namespace deltaserve::cache
