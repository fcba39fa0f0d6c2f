// The causal depthwise conv (+ SiLU) of the GDN layers over a step's tokens, with the slot-indexed
// conv state read before the step's first token and rewritten after (gdn.cuh).
#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn.cuh"
#include "backend/cuda/kernels/gdn_conv4.cuh"

namespace deltaserve::cuda {
namespace {

// Thread per (token from row first_row on, channel): y[t, c] = silu(sum_i w[c, i] * in(t - (K-1) +
// i)), where in(j) for j < 0 (before this step) comes from the slot's conv state (zeros for a
// fresh sequence).
__global__ void gdn_conv_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ u,
                                const __nv_bfloat16* __restrict__ w,
                                const __nv_bfloat16* __restrict__ state, int C, int K,
                                int first_row, __nv_bfloat16* __restrict__ y) {
  const int t = first_row + blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int seq = b.token_seq[t], begin = b.seq_begin[seq], j = t - begin, km1 = K - 1;
  const bool fresh = b.seq_start[seq] == 0;
  const __nv_bfloat16* st = state + (static_cast<size_t>(b.seq_slot[seq]) * C + c) * km1;
  float acc = 0.0f;
  for (int i = 0; i < K; ++i) {
    const int src = j - km1 + i;  // relative to the step's first token of the sequence
    float x;
    if (src >= 0)
      x = __bfloat162float(u[static_cast<size_t>(begin + src) * C + c]);
    else
      x = fresh ? 0.0f : __bfloat162float(st[km1 + src]);
    acc += __bfloat162float(w[static_cast<size_t>(c) * K + i]) * x;
  }
  y[static_cast<size_t>(t) * C + c] = __float2bfloat16(silu_fast(acc));
}

// Thread per (sequence, channel): the new conv state, the last K-1 inputs (after every read of
// the old one: a separate launch).
__global__ void gdn_conv_state_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ u,
                                      __nv_bfloat16* __restrict__ state, int C, int K) {
  const int seq = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int km1 = K - 1, begin = b.seq_begin[seq], n = b.seq_len[seq];
  const bool fresh = b.seq_start[seq] == 0;
  __nv_bfloat16* st = state + (static_cast<size_t>(b.seq_slot[seq]) * C + c) * km1;
  if (const int at = b.seq_snap_at[seq]; at > 0) {  // the in-step snapshot: inputs before `at`
    __nv_bfloat16* snap = state + (static_cast<size_t>(b.seq_snap_slot[seq]) * C + c) * km1;
    for (int i = 0; i < km1; ++i) {
      const int src = at - km1 + i;
      snap[i] = src >= 0 ? u[static_cast<size_t>(begin + src) * C + c]
                         : (fresh ? __float2bfloat16(0.0f) : st[km1 + src]);
    }
  }
  __nv_bfloat16 nw[8];
  for (int i = 0; i < km1; ++i) {
    const int src = n - km1 + i;
    nw[i] = src >= 0 ? u[static_cast<size_t>(begin + src) * C + c]
                     : (fresh ? __float2bfloat16(0.0f) : st[km1 + src]);
  }
  for (int i = 0; i < km1; ++i) st[i] = nw[i];
}

// Thread per (8 channels, up to `per_thread` consecutive tokens from row first_row on), K = 4,
// C % 8 == 0, 16-byte aligned rows: the window of the K - 1 previous inputs stays in registers
// while the thread walks its tokens (refilled where a new sequence begins), so each input is read
// once; loads and stores are 16-byte vectors. Same sums, in the same order, as gdn_conv_kernel.
// Prefill-heavy steps walk 8 tokens a thread; decode-like ones (a token or a few per sequence) 1,
// for parallelism.
constexpr int kConvThreads = 128;
__global__ void __launch_bounds__(kConvThreads)
    gdn_conv_vec_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ u,
                        const __nv_bfloat16* __restrict__ w,
                        const __nv_bfloat16* __restrict__ state, int C, int per_thread,
                        int first_row, __nv_bfloat16* __restrict__ y) {
  constexpr int km1 = kConvK - 1;
  const int c = 8 * (blockIdx.x * kConvThreads + threadIdx.x);
  if (c >= C) return;
  const int t0 = first_row + blockIdx.y * per_thread, t1 = min(t0 + per_thread, b.num_tokens);
  const ConvTaps taps = load_conv_taps(w, c);
  F32x8 win[km1];  // inputs t - 3, t - 2, t - 1
  int seq_of_window = -1;
  for (int t = t0; t < t1; ++t) {
    const int seq = b.token_seq[t];
    if (seq != seq_of_window) {
      const int begin = b.seq_begin[seq], j = t - begin;
      const bool fresh = b.seq_start[seq] == 0;
      const __nv_bfloat16* st = state + (static_cast<size_t>(b.seq_slot[seq]) * C + c) * km1;
#pragma unroll
      for (int i = 0; i < km1; ++i) {
        const int src = j - km1 + i;
        if (src >= 0) {
          win[i] = load_bf16x8(u + static_cast<size_t>(begin + src) * C + c);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            win[i].v[e] = fresh ? 0.0f : __bfloat162float(st[e * km1 + km1 + src]);
        }
      }
      seq_of_window = seq;
    }
    const F32x8 cur = load_bf16x8(u + static_cast<size_t>(t) * C + c);
    store_bf16x8(y + static_cast<size_t>(t) * C + c, conv_silu(taps, win, cur));
    conv_shift(win, cur);
  }
}

}  // namespace

void launch_gdn_conv(const BatchMeta& b, const __nv_bfloat16* u, const __nv_bfloat16* w,
                     __nv_bfloat16* conv_state, int C, int K, __nv_bfloat16* y,
                     cudaStream_t stream) {
  launch_gdn_conv_from(b, 0, u, w, conv_state, C, K, y, stream);
}

void launch_gdn_conv_from(const BatchMeta& b, int first, const __nv_bfloat16* u,
                          const __nv_bfloat16* w, __nv_bfloat16* conv_state, int C, int K,
                          __nv_bfloat16* y, cudaStream_t stream) {
  const int rows = b.num_tokens - first, seqs = b.num_seqs - first;
  if (seqs <= 0) return;
  if (K == kConvK && C % 8 == 0 && aligned16(u, w, conv_state, y)) {
    const int per_thread = rows >= 8 * seqs ? 8 : 1;
    const dim3 grid((C / 8 + kConvThreads - 1) / kConvThreads,
                    (rows + per_thread - 1) / per_thread);
    gdn_conv_vec_kernel<<<grid, kConvThreads, 0, stream>>>(b, u, w, conv_state, C, per_thread,
                                                           first, y);
  } else {
    gdn_conv_kernel<<<dim3((C + 127) / 128, rows), 128, 0, stream>>>(b, u, w, conv_state, C, K,
                                                                     first, y);
  }
  launch_gdn_conv_state(seqs_from(b, first), u, conv_state, C, K, stream);
}

void launch_gdn_conv_state(const BatchMeta& b, const __nv_bfloat16* u, __nv_bfloat16* conv_state,
                           int C, int K, cudaStream_t stream) {
  if (b.num_seqs == 0) return;
  gdn_conv_state_kernel<<<dim3((C + 127) / 128, b.num_seqs), 128, 0, stream>>>(b, u, conv_state, C,
                                                                               K);
}

}  // namespace deltaserve::cuda
