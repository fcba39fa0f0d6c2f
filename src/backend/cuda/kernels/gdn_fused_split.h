// When the chunked GDN rule takes the fused kernel (gdn_chunk_fused.cu: a block per (sequence,
// value head) walking its chunks in order) rather than the prep kernel + state pass (a plain
// header: the launcher and a host-side test share it). Its blocks must cover a share of the SMs:
// 5/8 when q / k / v come from the conv outputs y, 7/8 when the mixer first runs the conv kernel
// into y for it (that pass over u and y costs what the fused kernel gains until its blocks nearly
// fill the GPU).
#pragma once

#include <cstdint>

namespace deltaserve::cuda::gdn_chunk {

constexpr int kFusedEighthsFromY = 5, kFusedEighthsAfterConv = 7;

// Whether num_seqs x nv blocks cover at least `eighths` / 8 of sm_count SMs.
inline bool fused_blocks_cover(int64_t num_seqs, int64_t nv, int sm_count, int eighths) {
  return num_seqs * nv * 8 >= static_cast<int64_t>(sm_count) * eighths;
}

}  // namespace deltaserve::cuda::gdn_chunk
