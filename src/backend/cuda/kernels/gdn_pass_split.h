// Into how many column parts a head the GDN state pass (gdn_chunk_pass.cu) splits its blocks (a
// plain header: the launcher and a host-side test share it). 1: a block per (sequence, value head)
// of two warpgroups of 64 state columns; 2 or 4: a block of one warpgroup per half or quarter of a
// head's columns, each staging the head's chunk operands itself — shorter chunk-to-chunk chains,
// which pay while every block runs at once (one block an SM), and lose once they add waves.
#pragma once

#include <cstdint>

namespace deltaserve::cuda::gdn_chunk {

constexpr int kMaxPassParts = 4;

// The most parts (1, 2 or 4) whose num_seqs x nv x parts blocks fit sm_count SMs; 1 when even the
// whole-head blocks do not.
inline int state_pass_parts(int num_seqs, int nv, int sm_count) {
  int parts = 1;
  while (parts < kMaxPassParts && static_cast<int64_t>(num_seqs) * nv * 2 * parts <= sm_count)
    parts *= 2;
  return parts;
}

}  // namespace deltaserve::cuda::gdn_chunk
