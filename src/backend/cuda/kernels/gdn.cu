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

constexpr int kThreads = 128;

// Block (sequence, value head); thread j owns column j of the head's state S [dk, dv].
__global__ void delta_rule_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ y,
                                  const __nv_bfloat16* __restrict__ a,
                                  const __nv_bfloat16* __restrict__ bg,
                                  const float* __restrict__ A_log,
                                  const float* __restrict__ dt_bias, float* __restrict__ state,
                                  GdnShape s, __nv_bfloat16* __restrict__ out) {
  __shared__ float qs[256], ks[256];
  const int seq = blockIdx.x, h = blockIdx.y, kh = h / (s.nv / s.nk);
  const int key_dim = s.nk * s.dk, C = 2 * key_dim + s.nv * s.dv;
  float* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * s.dk * s.dv;
  if (b.seq_start[seq] == 0)
    for (int i = threadIdx.x; i < s.dk * s.dv; i += kThreads) S[i] = 0.0f;
  __syncthreads();
  const float qscale = rsqrtf(static_cast<float>(s.dk));
  const int begin = b.seq_begin[seq], n = b.seq_len[seq];
  for (int t = 0; t < n; ++t) {
    const __nv_bfloat16* row = y + static_cast<size_t>(begin + t) * C;
    float sq = 0.0f, sk = 0.0f;
    for (int i = threadIdx.x; i < s.dk; i += kThreads) {
      qs[i] = __bfloat162float(row[kh * s.dk + i]);
      ks[i] = __bfloat162float(row[key_dim + kh * s.dk + i]);
      sq += qs[i] * qs[i];
      sk += ks[i] * ks[i];
    }
    const float rq = qscale * rsqrtf(block_sum<kThreads>(sq) + 1e-6f);
    const float rk = rsqrtf(block_sum<kThreads>(sk) + 1e-6f);
    for (int i = threadIdx.x; i < s.dk; i += kThreads) {
      qs[i] *= rq;
      ks[i] *= rk;
    }
    __syncthreads();
    const size_t gi = static_cast<size_t>(begin + t) * s.nv + h;
    const float beta = 1.0f / (1.0f + __expf(-__bfloat162float(bg[gi])));
    const float x = __bfloat162float(a[gi]) + dt_bias[h];
    const float g = -__expf(A_log[h]) * (x > 20.0f ? x : log1pf(__expf(x)));
    const float alpha = __expf(g);
    for (int j = threadIdx.x; j < s.dv; j += kThreads) {
      float m = 0.0f;
      for (int i = 0; i < s.dk; ++i) {
        const float v = S[i * s.dv + j] * alpha;
        S[i * s.dv + j] = v;
        m += v * ks[i];
      }
      const float delta = beta * (__bfloat162float(row[2 * key_dim + h * s.dv + j]) - m);
      float o = 0.0f;
      for (int i = 0; i < s.dk; ++i) {
        const float v = S[i * s.dv + j] + ks[i] * delta;
        S[i * s.dv + j] = v;
        o += v * qs[i];
      }
      out[gi * s.dv + j] = __float2bfloat16(o);
    }
    __syncthreads();  // qs / ks are rewritten for the next token
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
  delta_rule_kernel<<<dim3(b.num_seqs, s.nv), kThreads, 0, stream>>>(b, y, a, bgate, A_log, dt_bias,
                                                                     state, s, out);
}

}  // namespace deltaserve::cuda
