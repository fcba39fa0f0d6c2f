// Full attention for the CUDA backend: q/k norm + partial NeoX RoPE + paged KV write, and causal
// GQA attention over each sequence's pages with the sigmoid output gate (split-KV: see below).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels/batch_meta.cuh"

namespace deltaserve::cuda {

struct AttnShape {
  int nh, nkv, hd, rotary_dim;
  float rope_theta, eps;
  // The attention's output gate of (token t, head h) at gate + (t nh + h) gate_stride: hd for a
  // gate of its own [T, nh, hd], 2 hd for the second halves of qg [T, nh, 2 hd] (gate = qg + hd).
  int gate_stride;
};

// qg [T, nh, 2*hd] -> q, gate [T, nh, hd] (gate null: not copied); k [T, nkv, hd] normed+roped in
// place and written with v [T, nkv, hd] to k_cache / v_cache [pages, page_size, nkv, hd]. Norm
// weights f32 [hd]. Preconditions: hd <= 512, hd even. Never allocates or syncs.
void launch_attn_prep(const BatchMeta& b, const __nv_bfloat16* qg, __nv_bfloat16* k,
                      const __nv_bfloat16* v, const float* q_norm, const float* k_norm,
                      const AttnShape& s, __nv_bfloat16* q, __nv_bfloat16* gate,
                      __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, cudaStream_t stream);
// The same into an fp8 e4m3 cache (--kv-cache-dtype fp8; kv_fp8.cuh's rounding): only where
// attn_prep_vec_supported(s) and the pointers are 16-byte aligned; false (nothing launched) else.
bool attn_prep_vec_supported(const AttnShape& s);
bool launch_attn_prep(const BatchMeta& b, const __nv_bfloat16* qg, __nv_bfloat16* k,
                      const __nv_bfloat16* v, const float* q_norm, const float* k_norm,
                      const AttnShape& s, __nv_bfloat16* q, __nv_bfloat16* gate, uint8_t* k_cache,
                      uint8_t* v_cache, cudaStream_t stream);

// Sequences with at least this many step tokens take the tensor-core prefill kernel (when
// attention_prefill_supported); the rest (decode rows) the split-KV kernel.
constexpr int kAttnPrefillMinLen = 16;

// log2(e): both attention kernels run their softmax in base 2 (exp2 of scores scaled by it).
constexpr float kLog2e = 1.4426950408889634f;

// How many key-range splits paged attention uses for a step of `num_tokens` tokens: enough blocks
// for ~2 waves of `num_sms` SMs (at most 32), within a workspace of `ws_bytes`; 1 for prefill-size
// steps. A function of the shapes only, so a captured graph keeps it.
int attention_splits(int num_tokens, const AttnShape& s, int num_sms, size_t ws_bytes);

// out [T, nh, hd] = softmax(q k^T / sqrt(hd)) v over positions [0, pos], times sigmoid(gate).
// GQA: one block per (token, KV head, split) serves the nh / nkv query heads of the KV head on
// tensor cores (the heads as MMA rows); with splits > 1 the partials go to ws
// (T * nh * splits * (hd + 2) floats) and a second kernel merges them. The split-KV kernels cover
// token rows [0, split_rows): every row of a sequence the prefill kernel does not take (all rows
// without it; a mixed step's decode rows come first); the prefill kernel's grid covers sequences
// prefill_from.. (the first ones, all short, need none of its blocks). Preconditions: hd <= 256
// and a multiple of 32; nh / nkv <= 8. Never allocates or syncs.
void launch_paged_attention(const BatchMeta& b, int split_rows, int prefill_from,
                            const __nv_bfloat16* q, const __nv_bfloat16* gate,
                            const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                            const AttnShape& s, int splits, float* ws, __nv_bfloat16* out,
                            cudaStream_t stream);
// The same over an fp8 e4m3 cache (--kv-cache-dtype fp8): both kernels convert the e4m3 keys and
// values to f16 for f16 MMAs (the decode kernel K's and V's MMA fragments straight from its
// copies, the prefill kernel both tiles in shared memory). Preconditions as above, and
// hd % 16 == 0.
void launch_paged_attention(const BatchMeta& b, int split_rows, int prefill_from,
                            const __nv_bfloat16* q, const __nv_bfloat16* gate,
                            const uint8_t* k_cache, const uint8_t* v_cache, const AttnShape& s,
                            int splits, float* ws, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda
