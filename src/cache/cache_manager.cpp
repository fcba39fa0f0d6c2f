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
}

void CacheManager::share_pages(std::vector<int32_t>& table, std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    pages_.retain(p);
    table.push_back(p);
  }
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
