#include "cache/cache_manager.h"

#include "core/error.h"

namespace deltaserve::cache {

CacheManager::CacheManager(CacheShape shape)
    : shape_(shape),
      pages_(shape.num_pages, shape.page_size),
      slots_(shape.num_slots),
      snapshots_(shape.num_snapshots) {
  DS_CHECK(
      shape.num_pages > 0 && shape.page_size > 0 && shape.num_slots > 0 && shape.num_snapshots >= 0,
      "empty cache shape");
  if (shape.prefix_caching) prefix_ = std::make_unique<PrefixCache>(shape.num_pages);
}

bool CacheManager::grow_pages(std::vector<int32_t>& table, int64_t tokens) {
  const int32_t need = pages_.pages_for(tokens) - static_cast<int32_t>(table.size());
  if (need > num_available_pages()) return false;
  if (need > pages_.num_free()) evict_pages(need - pages_.num_free());
  return pages_.grow(table, tokens);
}

void CacheManager::evict_pages(int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    int32_t snapshot = -1;
    const int32_t page = prefix_->evict_block(snapshot);
    DS_CHECK(page >= 0, "evicting more pages than are evictable");
    if (snapshot >= 0) release_snapshot(snapshot);
    DS_CHECK(pages_.release_one(page) == 0, "an evicted page was still held");
  }
}

void CacheManager::share_pages(std::vector<int32_t>& table, std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    pages_.retain(p);
    if (prefix_ && prefix_->holds_page(p)) prefix_->set_evictable(p, false, 0);
    table.push_back(p);
  }
}

void CacheManager::release_pages(std::vector<int32_t>& table) {
  ++clock_;
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const int32_t left = pages_.release_one(*it);
    if (left == 1 && prefix_ && prefix_->holds_page(*it)) prefix_->set_evictable(*it, true, clock_);
  }
  table.clear();
}

PrefixHit CacheManager::lookup(std::span<const uint64_t> hashes, std::span<const int32_t> tokens,
                               int32_t limit, int32_t snapshot_every) const {
  PrefixHit hit;
  if (!prefix_) return hit;
  const int32_t P = page_size();
  for (size_t i = 0; i < hashes.size(); ++i) {
    const PrefixCache::Entry* e =
        prefix_->find(hashes[i], i == 0 ? kRootBlockHash : hashes[i - 1],
                      tokens.subspan(i * static_cast<size_t>(P), static_cast<size_t>(P)));
    if (!e) break;
    const int32_t end = static_cast<int32_t>(i + 1) * P;
    hit.kv_tokens = end;
    if (e->snapshot >= 0 && end <= limit && end % snapshot_every == 0) {
      hit.tokens = end;
      hit.snapshot = e->snapshot;
    }
  }
  return hit;
}

void CacheManager::adopt(const PrefixHit& hit, std::span<const uint64_t> hashes,
                         std::vector<int32_t>& table) {
  DS_CHECK(prefix_ && table.empty() && hit.tokens % page_size() == 0, "adopt: bad hit");
  const size_t blocks = static_cast<size_t>(hit.tokens / page_size());
  std::vector<int32_t> pages;
  for (size_t i = 0; i < blocks; ++i) pages.push_back(prefix_->find(hashes[i])->page);
  share_pages(table, pages);
  if (blocks > 0) prefix_->pin_snapshot(hashes[blocks - 1]);
}

void CacheManager::release_hit(uint64_t snapshot_block) {
  prefix_->unpin_snapshot(snapshot_block, ++clock_);
}

void CacheManager::index_blocks(std::span<const uint64_t> hashes, std::span<const int32_t> tokens,
                                std::span<const int32_t> table, int32_t from, int32_t to) {
  if (!prefix_) return;
  const size_t P = static_cast<size_t>(page_size());
  for (int32_t i = from; i < to; ++i) {
    const size_t b = static_cast<size_t>(i);
    const int32_t page = table[b];
    if (prefix_->holds_page(page)) continue;  // a shared cached page: indexed already
    if (prefix_->insert(hashes[b], b == 0 ? kRootBlockHash : hashes[b - 1], i,
                        tokens.subspan(b * P, P), page))
      pages_.retain(page);  // the cache's own hold
  }
}

bool CacheManager::has_snapshot(uint64_t block) const {
  const PrefixCache::Entry* e = prefix_ ? prefix_->find(block) : nullptr;
  return e && e->snapshot >= 0;
}

int32_t CacheManager::take_snapshot_slot() {
  if (!prefix_) return -1;
  if (snapshots_.num_free() == 0) {
    const int32_t evicted = prefix_->evict_snapshot();
    if (evicted < 0) return -1;
    release_snapshot(evicted);
  }
  return acquire_snapshot();
}

void CacheManager::file_snapshot(uint64_t block, int32_t slot) {
  if (!prefix_ || !prefix_->attach_snapshot(block, slot, ++clock_)) release_snapshot(slot);
}

void CacheManager::drop_snapshot(uint64_t block) {
  if (!prefix_) return;
  const int32_t slot = prefix_->detach_snapshot(block);
  if (slot >= 0) release_snapshot(slot);
}

int32_t CacheManager::acquire_snapshot() {
  const int32_t id = snapshots_.take();
  return id < 0 ? -1 : shape_.num_slots + id;
}

void CacheManager::release_snapshot(int32_t slot) {
  DS_CHECK(slot >= shape_.num_slots, "not a snapshot slot: " + std::to_string(slot));
  snapshots_.give_back(slot - shape_.num_slots);
}

}  // namespace deltaserve::cache
