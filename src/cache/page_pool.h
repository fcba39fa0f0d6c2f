// PagePool and StateSlots: host-only bookkeeping of the KV pages of full-attention layers and of
// the GDN state slots. They hold ids, never device memory (DESIGN.md decision 2).
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace deltaserve::cache {

// A free list of ids [0, n). Lowest ids are handed out first, so traces are deterministic.
class IdPool {
 public:
  explicit IdPool(int32_t n);
  int32_t capacity() const { return capacity_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  // Takes one id; -1 when none is free.
  int32_t take();
  // Returns an id taken earlier. Precondition: it is not free already.
  void give_back(int32_t id);

 private:
  int32_t capacity_;
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<>> free_;  // lowest id on top
  std::vector<uint8_t> is_free_;
};

// KV pages of `page_size` tokens each; a request's page table covers its cached positions. Pages
// are reference counted: a page several page tables share (a cached prefix) is freed when the
// last holder releases it.
class PagePool {
 public:
  PagePool(int32_t num_pages, int32_t page_size)
      : ids_(num_pages), page_size_(page_size), refs_(static_cast<size_t>(num_pages), 0) {}
  int32_t page_size() const { return page_size_; }
  int32_t num_pages() const { return ids_.capacity(); }
  int32_t num_free() const { return ids_.num_free(); }
  int32_t pages_for(int64_t tokens) const {
    return static_cast<int32_t>((tokens + page_size_ - 1) / page_size_);
  }
  // Grows `table` to cover `tokens` positions; false (table unchanged) when pages run out.
  bool grow(std::vector<int32_t>& table, int64_t tokens);
  // Drops this table's hold on each of its pages (freeing those nobody else holds) and clears it.
  void release(std::vector<int32_t>& table);
  // Drops one hold on `page` (freeing it when it was the last); the holds left.
  int32_t release_one(int32_t page);
  // One more holder of `page` (precondition: it is held already).
  void retain(int32_t page);
  int32_t refcount(int32_t page) const { return refs_[static_cast<size_t>(page)]; }

 private:
  IdPool ids_;
  int32_t page_size_;
  std::vector<int32_t> refs_;
};

// One GDN conv + recurrent state slot per running request. The model treats a sequence at
// position 0 as fresh, so a reused slot never exposes its previous owner's state.
class StateSlots {
 public:
  explicit StateSlots(int32_t num_slots) : ids_(num_slots) {}
  int32_t num_slots() const { return ids_.capacity(); }
  int32_t num_free() const { return ids_.num_free(); }
  int32_t acquire() { return ids_.take(); }  // -1 when none is free
  void release(int32_t slot) { ids_.give_back(slot); }

 private:
  IdPool ids_;
};

}  // namespace deltaserve::cache
