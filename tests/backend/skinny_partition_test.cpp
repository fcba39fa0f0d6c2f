// The weight-streaming GEMM's split of a launch between blocks (skinny_partition.h), checked on
// the host for every projection group of the published Qwen3.5 shapes (bench/configs) at tensor
// parallel degrees 1 to 8 and GPUs of 1 to 132 multiprocessors: every unit in exactly one block,
// blocks of at least the minimum share, at most two shared tiles a block, the partial-sum slots of
// a shared tile distinct and within the workspace (2 a block), and the mid-stream segments
// (mid_units): at most one a block, its first, and every shared tile left with a segment that ends
// a block's share (the one that sums it); a reader's view of a tile's partials (tile_parts) names
// the slots its blocks wrote, in block order.
#include "backend/cuda/kernels/skinny_partition.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace deltaserve::cuda::skinny {
namespace {

constexpr int kTileRows = 128, kTileK = 64;

void check_partition(int tiles, int k_tiles, int sms) {
  const int units = tiles * k_tiles, blocks = blocks_for(units, k_tiles, sms);
  ASSERT_GE(blocks, 1);
  ASSERT_LE(blocks, sms);
  ASSERT_EQ(first_unit(0, units, blocks), 0);
  ASSERT_EQ(first_unit(blocks, units, blocks), units);
  std::map<int, int> slot_tile;  // the tile whose partial each slot holds (one a launch)
  std::map<int, int> mid_seen;   // tile -> units of its mid-stream segment, walking the blocks
  for (int c = 0; c < blocks; ++c) {
    const int u0 = first_unit(c, units, blocks), u1 = first_unit(c + 1, units, blocks);
    ASSERT_LT(u0, u1) << "block " << c << " has no units";
    if (blocks > 1) EXPECT_GE(u1 - u0, kMinUnitsPerBlock);
    for (int u = u0; u < u1; ++u) ASSERT_EQ(block_of(u, units, blocks), c) << "unit " << u;
    int partial = 0;
    for (int u = u0; u < u1;) {  // the block's segments, as the kernel walks them
      const int tile = u / k_tiles, end = std::min(u1, (tile + 1) * k_tiles);
      const bool whole = u == tile * k_tiles && end == (tile + 1) * k_tiles;
      // The kernel's test for a mid-stream segment (shared, and the block streams on past it).
      if (!whole && end < u1) {
        EXPECT_EQ(u, u0) << "block " << c << ": a mid-stream segment that is not its first";
        EXPECT_TRUE(mid_seen.insert({tile, end - u}).second) << "tile " << tile << ": two";
      }
      if (!whole) {
        ++partial;
        const int slot = slot_of(c, tile, units, blocks, k_tiles);
        EXPECT_TRUE(slot == 2 * c || slot == 2 * c + 1);
        EXPECT_TRUE(slot_tile.insert({slot, tile}).second) << "slot " << slot << " written twice";
      }
      u = end;
    }
    EXPECT_LE(partial, 2) << "block " << c;
  }
  for (int tile = 0; tile < tiles; ++tile) {  // the reducing block's view of a shared tile
    const int c0 = block_of(tile * k_tiles, units, blocks);
    const int c1 = block_of((tile + 1) * k_tiles - 1, units, blocks);
    ASSERT_LE(c1 - c0 + 1, kMaxParts) << "tile " << tile;
    if (c0 == c1) {
      EXPECT_EQ(mid_units(tile, units, blocks, k_tiles), 0) << "tile " << tile << " is whole";
      EXPECT_EQ(tile_parts(tile, units, blocks, k_tiles).count, 1) << "tile " << tile;
      continue;
    }
    const int mid = mid_units(tile, units, blocks, k_tiles);
    const auto seen = mid_seen.find(tile);
    EXPECT_EQ(mid, seen == mid_seen.end() ? 0 : seen->second) << "tile " << tile;
    EXPECT_LT(mid, k_tiles) << "tile " << tile << ": no segment ends a block's share";
    if (mid > 0)
      EXPECT_EQ(first_unit(c1, units, blocks), (tile + 1) * k_tiles - mid) << "tile " << tile;
    std::set<int> slots;
    const TileParts parts = tile_parts(tile, units, blocks, k_tiles);
    EXPECT_EQ(parts.first_block, c0);
    EXPECT_EQ(parts.count, c1 - c0 + 1);
    for (int c = c0; c <= c1; ++c) {
      const int slot = slot_of(c, tile, units, blocks, k_tiles);
      EXPECT_EQ(part_slot(parts, c - c0), slot) << "tile " << tile << " block " << c;
      const auto it = slot_tile.find(slot);
      EXPECT_TRUE(it != slot_tile.end() && it->second == tile)
          << "tile " << tile << " reads slot " << slot << ", not its own partial";
      EXPECT_TRUE(slots.insert(slot).second);
    }
  }
}

int tiles_of(const std::vector<int64_t>& widths) {
  int tiles = 0;
  for (const int64_t n : widths) tiles += static_cast<int>((n + kTileRows - 1) / kTileRows);
  return tiles;
}

TEST(SkinnyPartition, EveryProjectionOfThePublishedShapes) {
  const std::filesystem::path configs =
      std::filesystem::path(DS_TEST_DATA).parent_path() / "bench" / "configs";
  int checked = 0;
  for (const auto& dir : std::filesystem::directory_iterator(configs)) {
    const model::ModelConfig c = model::load_model_config(dir.path());
    const int64_t H = c.hidden_size, attn = c.num_heads * c.head_dim,
                  kv = c.num_kv_heads * c.head_dim;
    for (const int tp : {1, 2, 4, 8}) {
      // A rank's launches: the rows it holds of each projection and the input width (column-
      // parallel projections split their rows, row-parallel ones their inputs).
      const auto col = [tp](int64_t n) { return n / tp; };
      const std::vector<std::pair<std::vector<int64_t>, int64_t>> groups{
          {{col(c.conv_dim()), col(c.value_dim()), col(c.lin_num_v_heads), col(c.lin_num_v_heads)},
           H},
          {{H}, col(c.value_dim())},
          {{col(2 * attn), col(kv), col(kv)}, H},
          {{H}, col(attn)},
          {{col(c.intermediate_size), col(c.intermediate_size)}, H},
          {{H}, col(c.intermediate_size)},
          {{col(c.vocab_size)}, H}};
      for (const auto& [widths, K] : groups)
        for (const int sms : {132, 114, 78, 16, 1}) {
          SCOPED_TRACE(dir.path().filename().string() + " tp " + std::to_string(tp) + " K " +
                       std::to_string(K) + " sms " + std::to_string(sms));
          check_partition(tiles_of(widths), static_cast<int>((K + kTileK - 1) / kTileK), sms);
          ++checked;
        }
    }
  }
  EXPECT_GE(checked, 3 * 4 * 7 * 5) << "bench/configs holds the 4B, 9B and 27B shapes";
}

// Small and lopsided splits: one tile, one k-tile, more blocks than units.
TEST(SkinnyPartition, EdgeShapes) {
  for (const auto& [tiles, k_tiles] : std::vector<std::pair<int, int>>{
           {1, 1}, {1, 3}, {1, 500}, {2, 1}, {7, 5}, {1940, 40}, {20, 272}, {3, 1000}})
    for (const int sms : {132, 16, 1}) {
      SCOPED_TRACE(std::to_string(tiles) + " x " + std::to_string(k_tiles) + " sms " +
                   std::to_string(sms));
      check_partition(tiles, k_tiles, sms);
    }
}

}  // namespace
}  // namespace deltaserve::cuda::skinny
