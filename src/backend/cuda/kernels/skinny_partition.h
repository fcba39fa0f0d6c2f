// How the weight-streaming GEMM (skinny_gemm.cu) splits a launch's work between its blocks (a
// plain header: the kernel and the host-side tests share it). A unit is one 128-row tile's
// 64-column k-tile; the units are ordered tile after tile, each tile's k-tiles in order, and block
// c takes units [first_unit(c), first_unit(c + 1)): the same share for every block (stream-K). A
// tile split between blocks is summed from partials: each sharing block stores its part in a slot
// of its own.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/host_device.h"

namespace deltaserve::cuda::skinny {

// Each block takes at least kMinUnitsPerBlock units, and enough that no tile is shared by more
// than kMaxParts blocks.
constexpr int kMinUnitsPerBlock = 4, kMaxParts = 128;

// The grid: at most one block per multiprocessor, each with enough units.
inline int blocks_for(int units, int k_tiles, int sm_count) {
  const int min_units = std::max(kMinUnitsPerBlock, (k_tiles + kMaxParts - 3) / (kMaxParts - 2));
  return std::max(1, std::min(sm_count, units / min_units));
}

DS_HOST_DEVICE inline int first_unit(int c, int units, int blocks) {
  return static_cast<int>(static_cast<int64_t>(c) * units / blocks);
}

// The block whose units include u.
DS_HOST_DEVICE inline int block_of(int u, int units, int blocks) {
  int c = static_cast<int>((static_cast<int64_t>(u) + 1) * blocks / units);
#ifdef __CUDA_ARCH__
  c = min(max(c, 0), blocks - 1);
#else
  c = std::min(std::max(c, 0), blocks - 1);
#endif
  while (c > 0 && first_unit(c, units, blocks) > u) --c;
  while (c + 1 < blocks && first_unit(c + 1, units, blocks) <= u) ++c;
  return c;
}

// Block c's partial sums of a tile it shares land in slot 2c when the tile holds the block's
// first unit, else (the block's last tile) in slot 2c + 1.
DS_HOST_DEVICE inline int slot_of(int c, int tile, int units, int blocks, int k_tiles) {
  return 2 * c + (first_unit(c, units, blocks) < tile * k_tiles ? 1 : 0);
}

// A tile's partial sums in block order: block first_block's in first_slot (slot_of: the tile may
// be its last), then block first_block + j's in slot 2 (first_block + j) for j in 1 .. count - 1
// (each starts inside the tile, its first). count 1: one block holds the whole tile.
struct TileParts {
  int first_slot, first_block, count;
};
DS_HOST_DEVICE inline TileParts tile_parts(int tile, int units, int blocks, int k_tiles) {
  const int c0 = block_of(tile * k_tiles, units, blocks);
  const int c1 = block_of((tile + 1) * k_tiles - 1, units, blocks);
  return {slot_of(c0, tile, units, blocks, k_tiles), c0, c1 - c0 + 1};
}
DS_HOST_DEVICE inline int part_slot(const TileParts& t, int j) {
  return j == 0 ? t.first_slot : 2 * (t.first_block + j);
}

// The units of `tile` that lie in the middle of a block's share: the tile's last k-tiles, where the
// block holding them starts inside the tile and streams on past its end (its first segment). That
// block marks them without waiting; a block whose share ends in the tile sums it. 0 where the tile
// is not shared or its last block's share ends with it. A block has at most one such segment.
DS_HOST_DEVICE inline int mid_units(int tile, int units, int blocks, int k_tiles) {
  const int begin = tile * k_tiles, end = begin + k_tiles;
  const int c = block_of(end - 1, units, blocks);
  const int first = first_unit(c, units, blocks), next = first_unit(c + 1, units, blocks);
  return first > begin && next > end ? end - first : 0;
}

}  // namespace deltaserve::cuda::skinny
