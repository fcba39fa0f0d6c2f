// How a step's sequences divide between the CUDA backend's decode kernels and its prefill kernels,
// read on the host from the StepBatch: a mixed step's leading decode rows take the fused GDN decode
// kernel (the rest the chunked rule), the split-KV attention kernel covers the token rows through
// the last short sequence (the rest of a long one is the prefill kernel's), and the prefill
// kernel's grid starts at the first long sequence.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/step_batch.h"

namespace deltaserve::backend {

// How many of a step's first sequences are one token each (decode rows: the scheduler puts them
// first), in row order and without an in-step snapshot.
inline int32_t leading_single_token_seqs(const StepBatch& batch) {
  int32_t n = 0;
  for (const StepSeq& s : batch.seqs()) {
    if (s.num_tokens != 1 || s.token_begin != n || s.mid_snapshot >= 0) break;
    ++n;
  }
  return n;
}

// How many of a step's first sequences have fewer than `min_len` step tokens: the prefill attention
// kernel's grid starts after them (a mixed step's decode rows would each add a sequence's worth of
// blocks that only exit).
inline int32_t leading_short_seqs(const StepBatch& batch, int32_t min_len) {
  int32_t n = 0;
  for (const StepSeq& s : batch.seqs()) {
    if (s.num_tokens >= min_len) break;
    ++n;
  }
  return n;
}

// The token rows [0, n) that hold every sequence of fewer than `min_len` step tokens (0: none).
inline int32_t rows_through_short_seqs(const StepBatch& batch, int32_t min_len) {
  int32_t n = 0;
  for (const StepSeq& s : batch.seqs())
    if (s.num_tokens < min_len) n = std::max(n, s.token_begin + s.num_tokens);
  return n;
}

}  // namespace deltaserve::backend
