// CacheManager's prefix cache on its own: block hashes, lookups (longest prefix with a snapshot,
// verified tokens, the limit and the grid), sharing, eviction order, and snapshot pinning.
#include "cache/cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>

namespace deltaserve::cache {
namespace {

constexpr int32_t P = 4;  // tokens per page

std::vector<int32_t> iota(int32_t n, int32_t from = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

CacheShape shape(int32_t pages, int32_t snapshots) {
  return {.num_pages = pages,
          .page_size = P,
          .num_slots = 2,
          .num_snapshots = snapshots,
          .prefix_caching = true};
}

// A request computed `tokens` on fresh pages, indexed them, left a snapshot at each of `at`
// (multiples of P) and released its pages.
void compute_and_release(CacheManager& c, const std::vector<int32_t>& tokens,
                         std::initializer_list<int32_t> at) {
  std::vector<uint64_t> hashes;
  extend_block_hashes(hashes, tokens, P);
  std::vector<int32_t> table;
  ASSERT_TRUE(c.grow_pages(table, static_cast<int64_t>(tokens.size())));
  c.index_blocks(hashes, tokens, table, 0, static_cast<int32_t>(hashes.size()));
  for (int32_t pos : at) {
    const int32_t slot = c.take_snapshot_slot();
    ASSERT_GE(slot, 0);
    c.file_snapshot(hashes[static_cast<size_t>(pos / P - 1)], slot);
  }
  c.release_pages(table);
}

PrefixHit lookup(const CacheManager& c, const std::vector<int32_t>& tokens, int32_t limit,
                 int32_t grid = P) {
  std::vector<uint64_t> hashes;
  extend_block_hashes(hashes, tokens, P);
  return c.lookup(hashes, tokens, limit, grid);
}

TEST(BlockHash, DependsOnTheParentAndEveryToken) {
  const std::vector<int32_t> a{1, 2, 3, 4}, b{1, 2, 3, 5};
  EXPECT_NE(block_hash(kRootBlockHash, a), block_hash(kRootBlockHash, b));
  EXPECT_NE(block_hash(kRootBlockHash, a), block_hash(block_hash(kRootBlockHash, b), a));
  EXPECT_EQ(block_hash(kRootBlockHash, a), block_hash(kRootBlockHash, std::vector<int32_t>(a)));
  std::vector<uint64_t> h;
  extend_block_hashes(h, iota(11), P);
  EXPECT_EQ(h.size(), 2u);  // full blocks only
  extend_block_hashes(h, iota(12), P);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h[1], block_hash(h[0], iota(4, 4)));
}

TEST(PrefixCache, LookupFindsTheLongestPrefixWithASnapshotWithinTheLimit) {
  CacheManager c(shape(16, 4));
  const std::vector<int32_t> t = iota(20);
  compute_and_release(c, t, {8, 16});
  EXPECT_EQ(c.num_cached_blocks(), 5);
  EXPECT_EQ(c.num_evictable_pages(), 5);
  EXPECT_EQ(c.num_available_pages(), 16);
  PrefixHit h = lookup(c, t, 19);
  EXPECT_EQ(h.tokens, 16);
  EXPECT_EQ(h.kv_tokens, 20);
  h = lookup(c, t, 15);  // the limit: at least one token left to compute
  EXPECT_EQ(h.tokens, 8);
  h = lookup(c, t, 19, 16);  // only grid points count
  EXPECT_EQ(h.tokens, 16);
  h = lookup(c, t, 19, 12);
  EXPECT_EQ(h.tokens, 0);
  std::vector<int32_t> diverged = t;
  diverged[10] = 99;  // block 2 differs: KV matches 8 tokens, the snapshot at 8 resumes
  h = lookup(c, diverged, 19);
  EXPECT_EQ(h.tokens, 8);
  EXPECT_EQ(h.kv_tokens, 8);
  diverged[0] = 99;
  EXPECT_EQ(lookup(c, diverged, 19).kv_tokens, 0);
}

TEST(PrefixCache, AdoptedPagesAreSharedAndNeverEvicted) {
  CacheManager c(shape(6, 2));
  const std::vector<int32_t> t = iota(16);
  compute_and_release(c, t, {8});
  std::vector<uint64_t> hashes;
  extend_block_hashes(hashes, t, P);
  const PrefixHit hit = lookup(c, t, 15);
  ASSERT_EQ(hit.tokens, 8);
  std::vector<int32_t> table;
  c.adopt(hit, hashes, table);
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(c.page_refcount(table[0]), 2);
  EXPECT_EQ(c.num_available_pages(), 4);  // 2 free + the 2 unshared cached pages
  // Growing to 6 pages evicts the two unshared cached pages, never the adopted ones.
  ASSERT_TRUE(c.grow_pages(table, 24));
  EXPECT_EQ(c.num_cached_blocks(), 2);
  EXPECT_FALSE(c.grow_pages(table, 28));
  // The pinned snapshot survives a request for a new slot; the other slot is free.
  const int32_t s1 = c.take_snapshot_slot();
  EXPECT_GE(s1, 0);
  EXPECT_EQ(c.take_snapshot_slot(), -1);  // the only other snapshot is pinned
  c.release_hit(hashes[1]);
  c.release_pages(table);
  EXPECT_EQ(c.num_available_pages(), 6);
  const int32_t s2 = c.take_snapshot_slot();  // now evicts the unpinned one
  EXPECT_GE(s2, 0);
  EXPECT_EQ(lookup(c, t, 15).tokens, 0);
  c.release_snapshot(s1);
  c.release_snapshot(s2);
}

TEST(PrefixCache, EvictsTheLeastRecentlyReleasedDeepestBlocksFirst) {
  CacheManager c(shape(8, 4));
  const std::vector<int32_t> a = iota(12), b = iota(12, 100);
  compute_and_release(c, a, {4, 12});  // released first
  compute_and_release(c, b, {4});
  std::vector<int32_t> table;
  ASSERT_TRUE(c.grow_pages(table, 4 * P));  // 2 free + a's deepest block and the one before it
  EXPECT_EQ(lookup(c, a, 12).kv_tokens, 4);
  EXPECT_EQ(lookup(c, a, 12).tokens, 4);  // a's snapshot at 12 went with its block
  EXPECT_EQ(lookup(c, b, 12).kv_tokens, 12);
  c.release_pages(table);
  EXPECT_EQ(c.num_free_snapshots(), 2);
}

TEST(PrefixCache, DuplicateBlocksKeepTheFirstPageAndSnapshot) {
  CacheManager c(shape(8, 4));
  const std::vector<int32_t> t = iota(8);
  compute_and_release(c, t, {8});
  compute_and_release(c, t, {8});  // the same prompt computed again on other pages
  EXPECT_EQ(c.num_cached_blocks(), 2);
  EXPECT_EQ(c.num_free_pages(), 6);
  EXPECT_EQ(c.num_free_snapshots(), 3);
}

TEST(PrefixCache, OffMeansNoIndexAndNoHits) {
  CacheShape s = shape(4, 2);
  s.prefix_caching = false;
  CacheManager c(s);
  const std::vector<int32_t> t = iota(8);
  std::vector<int32_t> table;
  ASSERT_TRUE(c.grow_pages(table, 8));
  std::vector<uint64_t> hashes;
  extend_block_hashes(hashes, t, P);
  c.index_blocks(hashes, t, table, 0, 2);
  c.release_pages(table);
  EXPECT_EQ(c.num_free_pages(), 4);
  EXPECT_EQ(lookup(c, t, 7).kv_tokens, 0);
  EXPECT_EQ(c.take_snapshot_slot(), -1);
}

}  // namespace
}  // namespace deltaserve::cache
