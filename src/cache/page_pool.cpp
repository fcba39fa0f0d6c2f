#include "cache/page_pool.h"

#include "core/error.h"

namespace deltaserve::cache {

IdPool::IdPool(int32_t n) : capacity_(n), is_free_(static_cast<size_t>(n), 1) {
  DS_CHECK(n >= 0, "negative pool size");
  for (int32_t i = 0; i < n; ++i) free_.push(i);
}

int32_t IdPool::take() {
  if (free_.empty()) return -1;
  const int32_t id = free_.top();
  free_.pop();
  is_free_[static_cast<size_t>(id)] = 0;
  return id;
}

void IdPool::give_back(int32_t id) {
  DS_CHECK(id >= 0 && id < capacity_ && !is_free_[static_cast<size_t>(id)],
           "double free of id " + std::to_string(id));
  is_free_[static_cast<size_t>(id)] = 1;
  free_.push(id);
}

bool PagePool::grow(std::vector<int32_t>& table, int64_t tokens) {
  const int32_t need = pages_for(tokens) - static_cast<int32_t>(table.size());
  if (need <= 0) return true;
  if (need > ids_.num_free()) return false;
  for (int32_t i = 0; i < need; ++i) {
    const int32_t page = ids_.take();
    refs_[static_cast<size_t>(page)] = 1;
    table.push_back(page);
  }
  return true;
}

void PagePool::release(std::vector<int32_t>& table) {
  for (int32_t p : table) release_one(p);
  table.clear();
}

int32_t PagePool::release_one(int32_t page) {
  int32_t& r = refs_[static_cast<size_t>(page)];
  DS_CHECK(r > 0, "release of a free page " + std::to_string(page));
  if (--r == 0) ids_.give_back(page);
  return r;
}

void PagePool::retain(int32_t page) {
  DS_CHECK(page >= 0 && page < num_pages() && refs_[static_cast<size_t>(page)] > 0,
           "retain of a free page " + std::to_string(page));
  ++refs_[static_cast<size_t>(page)];
}

}  // namespace deltaserve::cache
