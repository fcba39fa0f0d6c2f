// Sampling on the GPU: many blocks per logits row find its max, sum of exp and penalized argmax
// by slices; then one block per row does greedy or temperature / top-k /
// top-p / min-p with one inverse-CDF draw (backend/sampling.h has the semantics), and the raw
// log-softmax logprobs with the top n. Top-k / top-p cut at thresholds found from a 2048-bin
// histogram of (max - logit) / temperature refined by a 1024-bin one inside the boundary bin, so
// tokens within ~1.5e-5 of the cut are kept or dropped together (the host reference sorts).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace deltaserve::cuda {

struct SampleRowParams {
  float temperature, top_p, min_p, repetition, presence, frequency, u;
  int32_t top_k, num_logprobs;
  int32_t adj_begin, adj_len;  // entries of `adj` for this row, sorted by token
};

// A token with a penalty or ban in one row.
struct SampleAdj {
  int32_t token, out_count, flags;  // flags: 1 = in the prompt, 2 = banned
  float bias;                       // added after the penalties (logit_bias)
};
constexpr int32_t kAdjInPrompt = 1, kAdjBanned = 2;
constexpr int kSampleMaxTop = 20;

// One slice of a row's tokens: its raw logits' max and sum of exp(x - max), and its best
// penalized logit (lowest id on ties). A row is summarised by many blocks, a slice each.
struct SampleRowStats {
  float max, sum_exp, best;
  int32_t best_id;
};
constexpr int kSampleSlice = 4096;  // tokens a slice
inline int sample_slices(int vocab) { return (vocab + kSampleSlice - 1) / kSampleSlice; }

// logits [R, ld] bf16, ids < vocab; stats: workspace of R * sample_slices(vocab); outputs token
// [R], logprob [R], top_ids / top_lp [R, kSampleMaxTop]. Never allocates or syncs.
void launch_sample(const __nv_bfloat16* logits, int64_t ld, int vocab, int rows,
                   const SampleRowParams* params, const SampleAdj* adj, SampleRowStats* stats,
                   int32_t* token, float* logprob, int32_t* top_ids, float* top_lp,
                   cudaStream_t stream);

}  // namespace deltaserve::cuda
