// The step's batch description as device arrays (one buffer, filled by CudaBackend::set_batch).
#pragma once

#include <cstdint>

namespace deltaserve::cuda {

struct BatchMeta {
  const int32_t* token_pos;      // [T] absolute position of each token
  const int32_t* token_seq;      // [T] sequence of each token
  const int32_t* seq_begin;      // [S] first token row
  const int32_t* seq_len;        // [S] tokens this step
  const int32_t* seq_start;      // [S] tokens already cached (0: fresh, state ignored)
  const int32_t* seq_slot;       // [S] GDN state slot
  const int32_t* seq_page_off;   // [S] offset of the sequence's page table in `pages`
  const int32_t* pages;          // page tables, back to back
  const int32_t* seq_snap_slot;  // [S] snapshot slot of an in-step GDN snapshot
  const int32_t* seq_snap_at;  // [S] ... of the state after this many of its step tokens (0: none)
  int num_tokens;
  int num_seqs;
  int page_size;
  int max_seq_len;  // the most tokens any sequence has in this step
};

// The batch's sequences from `first` on, for a kernel that runs them apart from the first ones:
// token rows, page tables and the token count (workspace layouts) stay the whole batch's.
inline BatchMeta seqs_from(BatchMeta m, int first) {
  for (const int32_t** a : {&m.seq_begin, &m.seq_len, &m.seq_start, &m.seq_slot, &m.seq_page_off,
                            &m.seq_snap_slot, &m.seq_snap_at})
    *a += first;
  m.num_seqs -= first;
  return m;
}

// The batch's first `count` sequences when they are one token each, rows 0 .. count - 1.
inline BatchMeta single_token_seqs(BatchMeta m, int count) {
  m.num_seqs = count;
  m.num_tokens = count;
  m.max_seq_len = 1;
  return m;
}

}  // namespace deltaserve::cuda
