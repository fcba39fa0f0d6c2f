// The host side of the vocabulary-parallel embedding and lm_head under tensor parallelism: rank r
// holds rows [r * rows, (r + 1) * rows) of both (model/tp_shard.h). Each rank looks up the ids it
// holds (zero rows for the others) and the residual stream is all-reduced; each computes the
// logits of its slice, and the slices are all-gathered into whole rows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deltaserve::dist {

// `ids` as rank `rank` looks them up in its slice of `rows` rows: id - rank * rows, or -1 (the
// embedding's zero row) for an id another rank holds.
inline std::vector<int32_t> local_token_ids(std::span<const int32_t> ids, int rank, int64_t rows) {
  std::vector<int32_t> out(ids.size());
  const int64_t first = rank * rows;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t local = ids[i] - first;
    out[i] = local >= 0 && local < rows ? static_cast<int32_t>(local) : -1;
  }
  return out;
}

// All-gathered logits come as [shards][R][rows]; row r * shards + k of the whole rows
// [R][shards][rows] is row k * R + r of them (a row gather in this order).
inline std::vector<int32_t> vocab_gather_order(int64_t R, int shards) {
  std::vector<int32_t> order(static_cast<size_t>(R * shards));
  for (int64_t r = 0; r < R; ++r)
    for (int k = 0; k < shards; ++k)
      order[static_cast<size_t>(r * shards + k)] = static_cast<int32_t>(k * R + r);
  return order;
}

}  // namespace deltaserve::dist
