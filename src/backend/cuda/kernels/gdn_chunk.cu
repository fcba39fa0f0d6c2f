// The chunked (chunk 64) gated delta rule of prefill steps on tensor cores: kernel 1 prepares every
// chunk in parallel (the WY form), kernel 2 walks each sequence's chunks in order (the state pass).
#include <mma.h>

#include <algorithm>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn_chunk.cuh"
#include "backend/gdn_workspace.h"

namespace deltaserve::cuda {
namespace {

// ---- Tensor cores for the chunked delta rule: 16x16x8 TF32 WMMA in the "3xTF32" split (a = hi +
// lo, both TF32; a.b ~ hi.hi + hi.lo + lo.hi), which keeps f32-level accuracy on tensor cores.
namespace tc {
using namespace nvcuda;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;
template <class Layout>
using A = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, Layout>;
template <class Layout>
using B = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, Layout>;

template <class Frag>
__device__ inline void split(const Frag& f, Frag& hi, Frag& lo) {
#pragma unroll
  for (int i = 0; i < f.num_elements; ++i) {
    hi.x[i] = wmma::__float_to_tf32(f.x[i]);
    lo.x[i] = wmma::__float_to_tf32(f.x[i] - hi.x[i]);
  }
}

// acc += A (16 x 8k, at a, layout La, leading dim lda) . B (8k x 16, at b, Lb, ldb), k steps of 8
// along the inner dimension (a_step / b_step: pointer advance per step). Even and odd steps, and
// the hi.hi and the cross terms, go to four independent accumulators, so that a warp's MMAs do not
// wait on each other's results; they are summed at the end.
template <class La, class Lb>
__device__ inline void mma(Acc& acc, const float* a, int lda, int a_step, const float* b, int ldb,
                           int b_step, int steps) {
  Acc hi1, lo0, lo1;
  wmma::fill_fragment(hi1, 0.0f);
  wmma::fill_fragment(lo0, 0.0f);
  wmma::fill_fragment(lo1, 0.0f);
  auto step = [&](int k, Acc& hi, Acc& lo) {
    A<La> fa, ah, al;
    B<Lb> fb, bh, bl;
    wmma::load_matrix_sync(fa, a + k * a_step, lda);
    wmma::load_matrix_sync(fb, b + k * b_step, ldb);
    split(fa, ah, al);
    split(fb, bh, bl);
    wmma::mma_sync(lo, al, bh, lo);
    wmma::mma_sync(lo, ah, bl, lo);
    wmma::mma_sync(hi, ah, bh, hi);
  };
  int k = 0;
  for (; k + 2 <= steps; k += 2) {
    step(k, acc, lo0);
    step(k + 1, hi1, lo1);
  }
  if (k < steps) step(k, acc, lo0);
#pragma unroll
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] += hi1.x[i] + (lo0.x[i] + lo1.x[i]);
}
}  // namespace tc

// ---- Chunked prefill (chunk 64, the WY form of the CPU backend and the spec) in two kernels.
// Per (token, value head) the workspace holds, at 16-byte aligned offsets,
// [U dv | W dk | P 64 | q dk | k dk | gamma] f32.
constexpr int kChunk = 64, kChunkThreads = 256, kLdLP = kChunk + 4;
static_assert(backend::gdn_chunk_floats_per_token(0, 0) >= kChunk + 1,
              "the workspace row holds P (chunk) and gamma");

struct WsLayout {
  int u, w, p, q, k, gam, per;
  __host__ __device__ explicit WsLayout(const GdnShape& s)
      : u(0),
        w(s.dv),
        p(s.dv + s.dk),
        q(s.dv + s.dk + kChunk),
        k(s.dv + 2 * s.dk + kChunk),
        gam(s.dv + 3 * s.dk + kChunk),
        per(backend::gdn_chunk_floats_per_token(s.dk, s.dv)) {}
};

// Kernel 1, block (sequence, chunk, value head) — chunks are independent: normalised q / k, gamma
// (cumulative log decay in the chunk), L_ij = beta_i (k_i.k_j) e^(gam_i - gam_j) (j < i),
// P_ij = (q_i.k_j) e^(gam_i - gam_j) (j <= i), and by forward substitution with (I + L)
// U = (I + L)^-1 diag(beta) V, W = (I + L)^-1 diag(beta e^gam) K (one column per thread).
// Shared rows are padded by one float so that lanes reading different rows hit different banks.
__global__ void __launch_bounds__(kChunkThreads)
    gdn_chunk_prep_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ y,
                          const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ bg,
                          const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                          GdnShape s, float* __restrict__ ws) {
  extern __shared__ __align__(128) float sm[];
  // Rows padded to dk + 4 (WMMA wants a multiple of 4; lanes reading other rows hit other banks).
  const int dk = s.dk, dv = s.dv, kp = dk + 4, vp = dv + 1;
  // V takes Q's place once Q K^T is done: two blocks fit an SM at dk = dv = 128.
  float* Ks = sm;                        // [64][dk + 4]
  float* Qs = Ks + kChunk * kp;          // [64][dk + 4]
  float* Vs = Qs;                        // [64][dv + 1], after Q K^T
  float* L = Qs + kChunk * max(kp, vp);  // [64][68]
  float* P = L + kChunk * kLdLP;         // [64][68]
  float* gam = P + kChunk * kLdLP;       // [64]
  float* beta = gam + kChunk;            // [64]
  const int seq = blockIdx.x, chunk = blockIdx.y, h = blockIdx.z, kh = h / (s.nv / s.nk);
  const int t0 = chunk * kChunk, len = b.seq_len[seq];
  if (t0 >= len) return;
  const int n = min(kChunk, len - t0), begin = b.seq_begin[seq] + t0;
  const int key_dim = s.nk * dk, C = 2 * key_dim + s.nv * dv;
  const WsLayout lay(s);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, tid = threadIdx.x;
  constexpr int kW = kChunkThreads / 32;
  const float qscale = rsqrtf(static_cast<float>(dk));
  for (int e = tid; e < kChunk * kp; e += kChunkThreads) {  // rows past n stay zero for the MMAs
    Ks[e] = 0.0f;
    Qs[e] = 0.0f;
  }
  __syncthreads();
  // Normalised q and k (to shared and the workspace), v, gates: warp per token.
  for (int i = warp; i < n; i += kW) {
    const __nv_bfloat16* row = y + static_cast<size_t>(begin + i) * C;
    float sq = 0.0f, sk = 0.0f;
    for (int x = lane; x < dk; x += 32) {
      const float qv = __bfloat162float(row[kh * dk + x]);
      const float kv = __bfloat162float(row[key_dim + kh * dk + x]);
      Qs[i * kp + x] = qv;
      Ks[i * kp + x] = kv;
      sq += qv * qv;
      sk += kv * kv;
    }
    for (int o = 16; o > 0; o >>= 1) {
      sq += __shfl_xor_sync(0xffffffffu, sq, o);
      sk += __shfl_xor_sync(0xffffffffu, sk, o);
    }
    const float rq = qscale * rsqrtf(sq + 1e-6f), rk = rsqrtf(sk + 1e-6f);
    float* wrow = ws + (static_cast<size_t>(begin + i) * s.nv + h) * lay.per;
    for (int x = lane; x < dk; x += 32) {
      Qs[i * kp + x] *= rq;
      Ks[i * kp + x] *= rk;
      wrow[lay.q + x] = Qs[i * kp + x];
      wrow[lay.k + x] = Ks[i * kp + x];
    }
    if (lane == 0) {
      const size_t gi = static_cast<size_t>(begin + i) * s.nv + h;
      beta[i] = 1.0f / (1.0f + __expf(-__bfloat162float(bg[gi])));
      const float xa = __bfloat162float(a[gi]) + dt_bias[h];
      gam[i] = -__expf(A_log[h]) * (xa > 20.0f ? xa : log1pf(__expf(xa)));
    }
  }
  __syncthreads();
  if (tid == 0)
    for (int i = 1; i < n; ++i) gam[i] += gam[i - 1];
  __syncthreads();
  using namespace nvcuda;
  // Q K^T -> P and K K^T -> L on tensor cores (4 x 4 tiles each; 4 tiles per warp), then the
  // decay, beta and causal masks elementwise.
  for (int t = warp; t < 32; t += kW) {
    const int which = t / 16, ti = (t % 16) / 4, tj = t % 4;
    tc::Acc acc;
    wmma::fill_fragment(acc, 0.0f);
    tc::mma<wmma::row_major, wmma::col_major>(acc, (which ? Ks : Qs) + 16 * ti * kp, kp, 8,
                                              Ks + 16 * tj * kp, kp, 8, dk / 8);
    wmma::store_matrix_sync((which ? L : P) + 16 * ti * kLdLP + 16 * tj, acc, kLdLP,
                            wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = warp; i < n; i += kW) {  // v into Q's place (Q K^T is done)
    const __nv_bfloat16* row = y + static_cast<size_t>(begin + i) * C;
    for (int x = lane; x < dv; x += 32)
      Vs[i * vp + x] = __bfloat162float(row[2 * key_dim + h * dv + x]);
  }
  for (int e = tid; e < kChunk * kChunk; e += kChunkThreads) {
    const int i = e / kChunk, j = e % kChunk;
    const float dec = (i < n && j <= i) ? __expf(gam[i] - gam[j]) : 0.0f;
    P[i * kLdLP + j] *= dec;
    L[i * kLdLP + j] = j < i ? L[i * kLdLP + j] * dec * beta[i] : 0.0f;
  }
  __syncthreads();
  // Forward substitution, in place: column col of V (-> U) or of K (-> W) per thread; four
  // independent partial sums per row keep the FMA chain from serialising on its own latency.
  for (int col = tid; col < dv + dk; col += kChunkThreads) {
    const bool is_u = col < dv;
    float* X = is_u ? Vs + col : Ks + (col - dv);
    const int ld = is_u ? vp : kp;
    for (int i = 0; i < n; ++i) {
      const float* Li = L + i * kLdLP;
      float a0 = X[i * ld] * beta[i] * (is_u ? 1.0f : __expf(gam[i])), a1 = 0.0f, a2 = 0.0f,
            a3 = 0.0f;
      int j = 0;
      for (; j + 4 <= i; j += 4) {
        a0 = fmaf(-Li[j], X[j * ld], a0);
        a1 = fmaf(-Li[j + 1], X[(j + 1) * ld], a1);
        a2 = fmaf(-Li[j + 2], X[(j + 2) * ld], a2);
        a3 = fmaf(-Li[j + 3], X[(j + 3) * ld], a3);
      }
      for (; j < i; ++j) a0 = fmaf(-Li[j], X[j * ld], a0);
      X[i * ld] = (a0 + a1) + (a2 + a3);
    }
  }
  __syncthreads();
  for (int i = warp; i < n; i += kW) {
    float* wrow = ws + (static_cast<size_t>(begin + i) * s.nv + h) * lay.per;
    for (int x = lane; x < dv; x += 32) wrow[lay.u + x] = Vs[i * vp + x];
    for (int x = lane; x < dk; x += 32) wrow[lay.w + x] = Ks[i * kp + x];
    for (int j = lane; j < kChunk; j += 32) wrow[lay.p + j] = P[i * kLdLP + j];
    if (lane == 0) wrow[lay.gam] = gam[i];
  }
}

// Kernel 2, block (sequence, value head, 16-column slice of the state): walks the chunks in order
// with the state slice in shared memory, every product on tensor cores (3xTF32). Per chunk:
// stage W, k, P, U (one round of loads); V' = U - W S and V'' = e^(gam_n - gam) V'; stage
// e^gam q; then, in the same phase, O = (e^gam q) S + P V' and S <- e^gam_n S + k^T V'' into
// the other state buffer.
constexpr int kSlice = 16;

__global__ void __launch_bounds__(kChunkThreads)
    gdn_chunk_state_kernel(BatchMeta b, const float* __restrict__ ws, float* __restrict__ state,
                           GdnShape s, __nv_bfloat16* __restrict__ out) {
  using namespace nvcuda;
  extern __shared__ __align__(128) float sm2[];
  const int dk = s.dk, dv = s.dv, kp = dk + 4;  // rows 16-byte aligned, a multiple of 4
  const WsLayout lay(s);
  float* St = sm2;                   // [dk][16]: S before the chunk
  float* Sn = St + dk * kSlice;      // [dk][16]: S after it (the buffers swap every chunk)
  float* X = Sn + dk * kSlice;       // [64][dk + 4]: -W, then e^gam q, then O (first 16 columns)
  float* Kx = X + kChunk * kp;       // [64][dk + 4]: k
  float* Vp = Kx + kChunk * kp;      // [64][16]: U, then V'
  float* Vd = Vp + kChunk * kSlice;  // [64][16]: e^(gam_n - gam) V'
  float* P = Vd + kChunk * kSlice;   // [64][64]
  float* gam = P + kChunk * kChunk;  // [64]
  const int seq = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * kSlice;
  const int tid = threadIdx.x, warp = tid / 32;
  float* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * dk * dv;
  const bool fresh = b.seq_start[seq] == 0;
  for (int e = tid; e < dk * kSlice; e += kChunkThreads) {
    const int x = e / kSlice, col = col0 + e % kSlice;
    St[e] = (!fresh && col < dv) ? S[x * dv + col] : 0.0f;
  }
  const int len = b.seq_len[seq], base = b.seq_begin[seq];
  const int dk4 = dk / 4;
  for (int t0 = 0; t0 < len; t0 += kChunk) {
    const int n = min(kChunk, len - t0), begin = base + t0;
    auto wrow = [&](int i) { return ws + (static_cast<size_t>(begin + i) * s.nv + h) * lay.per; };
    // Rows [0, n) of a workspace field times f(i) into dst; rows past n zero.
    auto stage = [&](float* dst, int off, auto&& f) {
      for (int e = tid; e < kChunk * dk4; e += kChunkThreads) {
        const int i = e / dk4, x4 = e % dk4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < n) {
          v = *reinterpret_cast<const float4*>(wrow(i) + off + 4 * x4);
          const float m = f(i);
          v.x *= m;
          v.y *= m;
          v.z *= m;
          v.w *= m;
        }
        *reinterpret_cast<float4*>(dst + i * kp + 4 * x4) = v;
      }
    };
    if (tid < kChunk) gam[tid] = tid < n ? wrow(tid)[lay.gam] : 0.0f;
    for (int e = tid; e < kChunk * (kChunk / 4); e += kChunkThreads) {
      const int i = e / (kChunk / 4), j4 = e % (kChunk / 4);
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < n) v = *reinterpret_cast<const float4*>(wrow(i) + lay.p + 4 * j4);
      *reinterpret_cast<float4*>(P + i * kChunk + 4 * j4) = v;
    }
    for (int e = tid; e < kChunk * kSlice; e += kChunkThreads) {
      const int i = e / kSlice, col = col0 + e % kSlice;
      Vp[e] = (i < n && col < dv) ? wrow(i)[lay.u + col] : 0.0f;
    }
    stage(X, lay.w, [](int) { return -1.0f; });
    stage(Kx, lay.k, [](int) { return 1.0f; });
    __syncthreads();
    // V' = U - W S (a row tile per warp), and its rows scaled by e^(gam_n - gam) for the update.
    if (warp < kChunk / 16) {
      tc::Acc acc;
      wmma::load_matrix_sync(acc, Vp + 16 * warp * kSlice, kSlice, wmma::mem_row_major);
      tc::mma<wmma::row_major, wmma::row_major>(acc, X + 16 * warp * kp, kp, 8, St, kSlice,
                                                8 * kSlice, dk / 8);
      wmma::store_matrix_sync(Vp + 16 * warp * kSlice, acc, kSlice, wmma::mem_row_major);
      __syncwarp();
      const int lane = tid % 32;
      for (int e = lane; e < 16 * kSlice; e += 32) {
        const int i = 16 * warp + e / kSlice;
        Vd[i * kSlice + e % kSlice] =
            i < n ? Vp[i * kSlice + e % kSlice] * __expf(gam[n - 1] - gam[i]) : 0.0f;
      }
    }
    __syncthreads();
    stage(X, lay.q, [&](int i) { return __expf(gam[i]); });
    __syncthreads();
    // O = (e^gam q) S (warps 0-3) + P V' (warps 4-7), a row tile each, while S' = e^gam_n S +
    // k^T V'' goes to the other buffer (16-row tiles over the warps). Each O part is stored over
    // the rows of X or P that only its warp reads.
    if (warp < kChunk / 16) {
      tc::Acc acc;
      wmma::fill_fragment(acc, 0.0f);
      tc::mma<wmma::row_major, wmma::row_major>(acc, X + 16 * warp * kp, kp, 8, St, kSlice,
                                                8 * kSlice, dk / 8);
      wmma::store_matrix_sync(X + 16 * warp * kp, acc, kp, wmma::mem_row_major);
    } else if (warp < 2 * (kChunk / 16)) {
      const int r = warp - kChunk / 16;
      tc::Acc acc;
      wmma::fill_fragment(acc, 0.0f);
      tc::mma<wmma::row_major, wmma::row_major>(acc, P + 16 * r * kChunk, kChunk, 8, Vp, kSlice,
                                                8 * kSlice, kChunk / 8);
      wmma::store_matrix_sync(P + 16 * r * kChunk, acc, kChunk, wmma::mem_row_major);
    }
    const float en = __expf(gam[n - 1]);
    for (int t = (warp + kChunk / 16) % (kChunkThreads / 32); t < dk / 16;
         t += kChunkThreads / 32) {
      tc::Acc acc;
      wmma::load_matrix_sync(acc, St + 16 * t * kSlice, kSlice, wmma::mem_row_major);
#pragma unroll
      for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= en;
      tc::mma<wmma::col_major, wmma::row_major>(acc, Kx + 16 * t, kp, 8 * kp, Vd, kSlice,
                                                8 * kSlice, kChunk / 8);
      wmma::store_matrix_sync(Sn + 16 * t * kSlice, acc, kSlice, wmma::mem_row_major);
    }
    __syncthreads();
    for (int e = tid; e < n * kSlice; e += kChunkThreads) {
      const int i = e / kSlice, col = col0 + e % kSlice;
      if (col < dv)
        out[(static_cast<size_t>(begin + i) * s.nv + h) * dv + col] =
            __float2bfloat16(X[i * kp + e % kSlice] + P[i * kChunk + e % kSlice]);
    }
    float* t = St;
    St = Sn;
    Sn = t;
    __syncthreads();
    if (t0 + n == b.seq_snap_at[seq]) {  // the in-step snapshot: the state after this chunk
      float* D = state + (static_cast<size_t>(b.seq_snap_slot[seq]) * s.nv + h) * dk * dv;
      for (int e = tid; e < dk * kSlice; e += kChunkThreads) {
        const int x = e / kSlice, col = col0 + e % kSlice;
        if (col < dv) D[x * dv + col] = St[e];
      }
    }
  }
  for (int e = tid; e < dk * kSlice; e += kChunkThreads) {
    const int x = e / kSlice, col = col0 + e % kSlice;
    if (col < dv) S[x * dv + col] = St[e];
  }
}

}  // namespace

bool gdn_chunked_supported(const GdnShape& s) {
  return s.dk <= 128 && s.dv <= 256 && s.dk % 16 == 0 && s.dv % 4 == 0;
}

void launch_gdn_chunked(const BatchMeta& b, const __nv_bfloat16* y, const __nv_bfloat16* a,
                        const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                        float* state, const GdnShape& s, float* ws, __nv_bfloat16* out,
                        cudaStream_t stream) {
  const size_t smem1 = (static_cast<size_t>(kChunk) * (s.dk + 4 + std::max(s.dk + 4, s.dv + 1)) +
                        2 * kChunk * kLdLP + 2 * kChunk) *
                       sizeof(float);
  const size_t smem2 = (2 * static_cast<size_t>(s.dk) * kSlice + 2 * kChunk * (s.dk + 4) +
                        2 * kChunk * kSlice + kChunk * kChunk + kChunk) *
                       sizeof(float);
  cudaFuncSetAttribute(gdn_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem1));
  cudaFuncSetAttribute(gdn_chunk_state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem2));
  const int chunks = (b.max_seq_len + kChunk - 1) / kChunk;
  gdn_chunk_prep_kernel<<<dim3(b.num_seqs, chunks, s.nv), kChunkThreads, smem1, stream>>>(
      b, y, a, bgate, A_log, dt_bias, s, ws);
  gdn_chunk_state_kernel<<<dim3(b.num_seqs, s.nv, (s.dv + kSlice - 1) / kSlice), kChunkThreads,
                           smem2, stream>>>(b, ws, state, s, out);
}

size_t gdn_chunk_workspace_floats(int num_tokens, const GdnShape& s) {
  return static_cast<size_t>(num_tokens) * s.nv * WsLayout(s).per;
}

}  // namespace deltaserve::cuda
