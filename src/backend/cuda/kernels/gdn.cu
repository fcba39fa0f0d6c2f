#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn.cuh"

namespace deltaserve::cuda {
namespace {

// Thread per (sequence, channel): walks the sequence's tokens with a sliding window.
__global__ void gdn_conv_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ u,
                                const __nv_bfloat16* __restrict__ w,
                                __nv_bfloat16* __restrict__ state, int C, int K,
                                __nv_bfloat16* __restrict__ y) {
  const int seq = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float win[8], wc[8];
  const int km1 = K - 1;
  __nv_bfloat16* st = state + (static_cast<size_t>(b.seq_slot[seq]) * C + c) * km1;
  const bool fresh = b.seq_start[seq] == 0;
  for (int i = 0; i < K; ++i) wc[i] = __bfloat162float(w[static_cast<size_t>(c) * K + i]);
  for (int i = 0; i < km1; ++i) win[i] = fresh ? 0.0f : __bfloat162float(st[i]);
  const int begin = b.seq_begin[seq], n = b.seq_len[seq];
  for (int t = 0; t < n; ++t) {
    win[km1] = __bfloat162float(u[static_cast<size_t>(begin + t) * C + c]);
    float acc = 0.0f;
    for (int i = 0; i < K; ++i) acc += wc[i] * win[i];
    y[static_cast<size_t>(begin + t) * C + c] = __float2bfloat16(silu(acc));
    for (int i = 0; i < km1; ++i) win[i] = win[i + 1];
  }
  for (int i = 0; i < km1; ++i) st[i] = __float2bfloat16(win[i]);
}

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kMaxRowsPerWarp = 256 / kWarps;  // dk <= 256

// Block (sequence, value head, 32-column slice of the head's state S [dk, dv]). Lane l owns column
// col0 + l; warp w owns rows w, w + kWarps, ... of it, held in registers across the sequence's
// tokens. Per token: S = alpha * S; m = S^T k; S += k (beta (v - m))^T; o = S^T q, the two column
// sums reduced across warps through shared memory.
__global__ void __launch_bounds__(kThreads)
    delta_rule_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ y,
                      const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ bg,
                      const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                      float* __restrict__ state, GdnShape s, __nv_bfloat16* __restrict__ out) {
  __shared__ float qs[256], ks[256], red[kWarps][32];
  const int seq = blockIdx.x, h = blockIdx.y, kh = h / (s.nv / s.nk);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col = blockIdx.z * 32 + lane;
  const bool has_col = col < s.dv;
  const int key_dim = s.nk * s.dk, C = 2 * key_dim + s.nv * s.dv;
  float* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * s.dk * s.dv;
  const bool fresh = b.seq_start[seq] == 0;
  float st[kMaxRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kMaxRowsPerWarp; ++r) {
    const int i = warp + kWarps * r;
    st[r] = (!fresh && has_col && i < s.dk) ? S[static_cast<size_t>(i) * s.dv + col] : 0.0f;
  }
  const float qscale = rsqrtf(static_cast<float>(s.dk));
  const float neg_A = -__expf(A_log[h]), bias = dt_bias[h];
  const int begin = b.seq_begin[seq], n = b.seq_len[seq];
  for (int t = 0; t < n; ++t) {
    const __nv_bfloat16* row = y + static_cast<size_t>(begin + t) * C;
    const int i0 = threadIdx.x;
    const float qv = i0 < s.dk ? __bfloat162float(row[kh * s.dk + i0]) : 0.0f;
    const float kv = i0 < s.dk ? __bfloat162float(row[key_dim + kh * s.dk + i0]) : 0.0f;
    const float rq = qscale * rsqrtf(block_sum<kThreads>(qv * qv) + 1e-6f);
    const float rk = rsqrtf(block_sum<kThreads>(kv * kv) + 1e-6f);
    if (i0 < s.dk) {
      qs[i0] = qv * rq;
      ks[i0] = kv * rk;
    }
    const size_t gi = static_cast<size_t>(begin + t) * s.nv + h;
    const float beta = 1.0f / (1.0f + __expf(-__bfloat162float(bg[gi])));
    const float x = __bfloat162float(a[gi]) + bias;
    const float alpha = __expf(neg_A * (x > 20.0f ? x : log1pf(__expf(x))));
    const float v = has_col ? __bfloat162float(row[2 * key_dim + h * s.dv + col]) : 0.0f;
    __syncthreads();  // qs / ks written
    float m = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; ++r) {
      const int i = warp + kWarps * r;
      if (i < s.dk) {
        st[r] *= alpha;
        m = fmaf(st[r], ks[i], m);
      }
    }
    red[warp][lane] = m;
    __syncthreads();
    m = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m += red[w][lane];
    const float delta = beta * (v - m);
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; ++r) {
      const int i = warp + kWarps * r;
      if (i < s.dk) {
        st[r] = fmaf(ks[i], delta, st[r]);
        o = fmaf(st[r], qs[i], o);
      }
    }
    __syncthreads();  // every warp has read red (m)
    red[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && has_col) {
      o = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) o += red[w][lane];
      out[gi * s.dv + col] = __float2bfloat16(o);
    }
    __syncthreads();  // red, qs, ks are rewritten for the next token
  }
  if (has_col) {
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; ++r) {
      const int i = warp + kWarps * r;
      if (i < s.dk) S[static_cast<size_t>(i) * s.dv + col] = st[r];
    }
  }
}

}  // namespace

void launch_gdn_conv(const BatchMeta& b, const __nv_bfloat16* u, const __nv_bfloat16* w,
                     __nv_bfloat16* conv_state, int C, int K, __nv_bfloat16* y,
                     cudaStream_t stream) {
  if (b.num_seqs == 0) return;
  gdn_conv_kernel<<<dim3((C + 127) / 128, b.num_seqs), 128, 0, stream>>>(b, u, w, conv_state, C, K,
                                                                         y);
}

void launch_gated_delta_rule(const BatchMeta& b, const __nv_bfloat16* y, const __nv_bfloat16* a,
                             const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                             float* state, const GdnShape& s, __nv_bfloat16* out,
                             cudaStream_t stream) {
  if (b.num_seqs == 0) return;
  delta_rule_kernel<<<dim3(b.num_seqs, s.nv, (s.dv + 31) / 32), kThreads, 0, stream>>>(
      b, y, a, bgate, A_log, dt_bias, state, s, out);
}

}  // namespace deltaserve::cuda
