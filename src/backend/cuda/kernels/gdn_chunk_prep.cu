// Kernel 1 of the chunked delta rule: every (sequence, chunk of 64, value head) in parallel. From
// the conv output it forms the normalised q / k and the gates, then on bf16 tensor cores (f32
// accumulation) L = beta_i (k_i . k_j) e^(gam_i - gam_j) (j < i) and P = (q_i . k_j) e^(gam_i -
// gam_j) (j <= i); T = (I + L)^-1 by 16 x 16 blocks in f32; and W = T diag(beta e^gam) K,
// U = T diag(beta) V. See gdn_chunk_layout.cuh for what it writes.
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256, kLdF = kChunk + 1;

struct PrepSmem {
  bf16 q[kChunk][kLd], k[kChunk][kLd], v[kChunk][kLd];
  float l[kChunk][kLdF];   // L (strictly lower)
  float t[kChunk][kLdF];   // T = (I + L)^-1 (lower)
  float x[3][16][17];      // block products of the inverse
  bf16 a_u[kChunk][kLdC];  // T diag(beta)
  bf16 a_w[kChunk][kLdC];  // T diag(beta e^gam)
  float gam[kChunk], beta[kChunk];
};

struct Chunk {
  int begin, n, h, kh, T;  // first token row, valid rows, value head, key head, step tokens
};

// q, k (key head) and v (value head) rows into shared memory (rows past n zero); beta and the
// cumulative log decay gam (rows past n: beta 0, gam flat).
__device__ void stage_inputs(PrepSmem& sm, const Chunk& ch, const bf16* y, const bf16* a,
                             const bf16* bg, const float* A_log, const float* dt_bias,
                             const GdnShape& s) {
  const int key_dim = s.nk * kDim, C = 2 * key_dim + s.nv * kDim;
  for (int e = threadIdx.x; e < 3 * kChunk * 16; e += kThreads) {
    const int which = e / (kChunk * 16), r = (e / 16) % kChunk, c16 = e % 16;
    const int off = which == 0   ? ch.kh * kDim
                    : which == 1 ? key_dim + ch.kh * kDim
                                 : 2 * key_dim + ch.h * kDim;
    const bf16* src = y + static_cast<size_t>(ch.begin + min(r, ch.n - 1)) * C + off + 8 * c16;
    bf16* dst = (which == 0 ? sm.q[r] : which == 1 ? sm.k[r] : sm.v[r]) + 8 * c16;
    mma::cp_async16(dst, src, r < ch.n);
  }
  mma::cp_async_commit();
  if (threadIdx.x < 32) {  // gates, then an inclusive scan of the log decay (two rows per lane)
    const int lane = threadIdx.x;
    float g[2];
    for (int e = 0; e < 2; ++e) {
      const int i = 2 * lane + e;
      g[e] = 0.0f;
      sm.beta[i] = 0.0f;
      if (i < ch.n) {
        const size_t gi = static_cast<size_t>(ch.begin + i) * s.nv + ch.h;
        sm.beta[i] = 1.0f / (1.0f + __expf(-__bfloat162float(bg[gi])));
        const float xa = __bfloat162float(a[gi]) + dt_bias[ch.h];
        g[e] = -__expf(A_log[ch.h]) * (xa > 20.0f ? xa : log1pf(__expf(xa)));
      }
    }
    float run = g[0] + g[1];
    for (int o = 1; o < 32; o <<= 1) {
      const float up = __shfl_up_sync(0xffffffffu, run, o);
      if (lane >= o) run += up;
    }
    sm.gam[2 * lane] = run - g[1];
    sm.gam[2 * lane + 1] = run;
  }
  mma::cp_async_wait<0>();
  __syncthreads();
}

// q / |q| / sqrt(dk) and k / |k| in place (warp per row); q to the workspace (once per key head),
// k e^(gam_last - gam_i) to it, gam to it.
__device__ void normalise(PrepSmem& sm, const Chunk& ch, const GdnShape& s, const Workspace& ws) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool write_q = ch.h % (s.nv / s.nk) == 0;
  const float glast = sm.gam[ch.n - 1];
  for (int r = warp; r < kChunk; r += kThreads / 32) {
    __nv_bfloat162* qr = reinterpret_cast<__nv_bfloat162*>(sm.q[r]) + 2 * lane;
    __nv_bfloat162* kr = reinterpret_cast<__nv_bfloat162*>(sm.k[r]) + 2 * lane;
    float2 q0 = __bfloat1622float2(qr[0]), q1 = __bfloat1622float2(qr[1]);
    float2 k0 = __bfloat1622float2(kr[0]), k1 = __bfloat1622float2(kr[1]);
    float sq = q0.x * q0.x + q0.y * q0.y + q1.x * q1.x + q1.y * q1.y;
    float sk = k0.x * k0.x + k0.y * k0.y + k1.x * k1.x + k1.y * k1.y;
    for (int o = 16; o > 0; o >>= 1) {
      sq += __shfl_xor_sync(0xffffffffu, sq, o);
      sk += __shfl_xor_sync(0xffffffffu, sk, o);
    }
    const float rq = rsqrtf(static_cast<float>(kDim)) * rsqrtf(sq + 1e-6f), rk = rsqrtf(sk + 1e-6f);
    qr[0] = __floats2bfloat162_rn(q0.x * rq, q0.y * rq);
    qr[1] = __floats2bfloat162_rn(q1.x * rq, q1.y * rq);
    kr[0] = __floats2bfloat162_rn(k0.x * rk, k0.y * rk);
    kr[1] = __floats2bfloat162_rn(k1.x * rk, k1.y * rk);
    if (r >= ch.n) continue;
    const size_t tok = static_cast<size_t>(ch.begin + r);
    if (write_q) {
      __nv_bfloat162* dq = reinterpret_cast<__nv_bfloat162*>(ws.q + (tok * s.nk + ch.kh) * kDim);
      dq[2 * lane] = qr[0];
      dq[2 * lane + 1] = qr[1];
    }
    const float d = __expf(glast - sm.gam[r]) * rk;
    __nv_bfloat162* dk = reinterpret_cast<__nv_bfloat162*>(ws.kd + (tok * s.nv + ch.h) * kDim);
    dk[2 * lane] = __floats2bfloat162_rn(k0.x * d, k0.y * d);
    dk[2 * lane + 1] = __floats2bfloat162_rn(k1.x * d, k1.y * d);
  }
  if (threadIdx.x < ch.n)
    ws.gam[static_cast<size_t>(ch.h) * ch.T + ch.begin + threadIdx.x] = sm.gam[threadIdx.x];
  __syncthreads();
}

// Warps 0-3: K K^T -> L (shared, f32); warps 4-7: Q K^T -> P (the workspace, bf16). A 16-row tile
// per warp.
__device__ void products(PrepSmem& sm, const Chunk& ch, const GdnShape& s, const Workspace& ws) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const bool is_p = warp >= 4;
  const int m = warp % 4;
  float acc[8][4] = {};
  for (int ks = 0; ks < kDim / 16; ++ks) {
    uint32_t af[4];
    mma::load_a(af, (is_p ? sm.q : sm.k)[16 * m] + 16 * ks, kLd);
    for (int np = 0; np < 4; ++np) {
      uint32_t bf[4];
      mma::load_b_trans(bf, sm.k[16 * np] + 16 * ks, kLd);
      mma::mma(acc[2 * np], af, bf[0], bf[1]);
      mma::mma(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
  for (int nt = 0; nt < 8; ++nt)
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * m + g + 8 * hf, j = 8 * nt + 2 * c;
      float v[2];
      for (int e = 0; e < 2; ++e) {
        const bool keep = is_p ? (j + e <= i) : (j + e < i);
        v[e] = keep ? acc[nt][2 * hf + e] * __expf(sm.gam[i] - sm.gam[j + e]) : 0.0f;
      }
      if (!is_p) {
        sm.l[i][j] = sm.beta[i] * v[0];
        sm.l[i][j + 1] = sm.beta[i] * v[1];
      } else if (i < ch.n) {
        const size_t row = static_cast<size_t>(ch.begin + i) * s.nv + ch.h;
        *reinterpret_cast<__nv_bfloat162*>(ws.p + row * kChunk + j) =
            __floats2bfloat162_rn(v[0], v[1]);
      }
    }
  __syncthreads();
}

// T = (I + L)^-1: the four 16 x 16 diagonal blocks by forward substitution (a column per thread),
// then the blocks below them by distance d: T_ij = -T_ii sum_{m=j}^{i-1} L_im T_mj.
__device__ void invert(PrepSmem& sm) {
  const int tid = threadIdx.x;
  for (int e = tid; e < kChunk * kChunk; e += kThreads) {
    const int i = e / kChunk, j = e % kChunk;
    if (i / 16 < j / 16) sm.t[i][j] = 0.0f;
  }
  if (tid < kChunk) {
    const int o = 16 * (tid / 16), c = tid % 16;
    for (int r = 0; r < 16; ++r) {
      float v = r == c ? 1.0f : 0.0f;
      if (r > c) {
        float s0 = 0.0f, s1 = 0.0f;
        int m = c;
        for (; m + 1 < r; m += 2) {
          s0 = fmaf(sm.l[o + r][o + m], sm.t[o + m][o + c], s0);
          s1 = fmaf(sm.l[o + r][o + m + 1], sm.t[o + m + 1][o + c], s1);
        }
        if (m < r) s0 = fmaf(sm.l[o + r][o + m], sm.t[o + m][o + c], s0);
        v = -(s0 + s1);
      }
      sm.t[o + r][o + c] = v;
    }
  }
  __syncthreads();
  for (int d = 1; d < 4; ++d) {
    const int blocks = 4 - d;
    for (int e = tid; e < blocks * 256; e += kThreads) {
      const int bi = d + e / 256, bj = bi - d, r = (e / 16) % 16, c = e % 16;
      float acc = 0.0f;
      for (int m = 16 * bj; m < 16 * bi; ++m)
        acc = fmaf(sm.l[16 * bi + r][m], sm.t[m][16 * bj + c], acc);
      sm.x[e / 256][r][c] = acc;
    }
    __syncthreads();
    for (int e = tid; e < blocks * 256; e += kThreads) {
      const int bi = d + e / 256, bj = bi - d, r = (e / 16) % 16, c = e % 16;
      float acc = 0.0f;
      for (int m = 0; m <= r; ++m)
        acc = fmaf(sm.t[16 * bi + r][16 * bi + m], sm.x[e / 256][m][c], acc);
      sm.t[16 * bi + r][16 * bj + c] = -acc;
    }
    __syncthreads();
  }
  for (int e = tid; e < kChunk * kChunk; e += kThreads) {
    const int i = e / kChunk, j = e % kChunk;
    const float tb = sm.t[i][j] * sm.beta[j];
    sm.a_u[i][j] = __float2bfloat16(tb);
    sm.a_w[i][j] = __float2bfloat16(tb * __expf(sm.gam[j]));
  }
  __syncthreads();
}

// Warps 0-3: W = (T diag(beta e^gam)) K; warps 4-7: U = (T diag(beta)) V; 16 rows per warp, in two
// halves of 64 columns; straight to the workspace.
__device__ void solve(PrepSmem& sm, const Chunk& ch, const GdnShape& s, const Workspace& ws) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const bool is_u = warp >= 4;
  const int m = warp % 4;
  const bf16(*A)[kLdC] = is_u ? sm.a_u : sm.a_w;
  const bf16(*X)[kLd] = is_u ? sm.v : sm.k;
  bf16* dst = is_u ? ws.u : ws.w;
  for (int half = 0; half < 2; ++half) {
    float acc[8][4] = {};
    mma::tile_16x64<kChunk>(acc, A[16 * m], kLdC, X[0] + 64 * half, kLd);
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * m + g + 8 * hf;
      if (i >= ch.n) continue;
      bf16* row = dst + (static_cast<size_t>(ch.begin + i) * s.nv + ch.h) * kDim + 64 * half;
      for (int nt = 0; nt < 8; ++nt)
        *reinterpret_cast<__nv_bfloat162*>(row + 8 * nt + 2 * c) =
            __floats2bfloat162_rn(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 2)
    prep_kernel(BatchMeta b, const bf16* __restrict__ y, const bf16* __restrict__ a,
                const bf16* __restrict__ bg, const float* __restrict__ A_log,
                const float* __restrict__ dt_bias, GdnShape s, Workspace ws) {
  extern __shared__ __align__(128) unsigned char prep_raw[];
  PrepSmem& sm = *reinterpret_cast<PrepSmem*>(prep_raw);
  const int seq = blockIdx.x, t0 = blockIdx.y * kChunk, len = b.seq_len[seq];
  if (t0 >= len) return;
  const Chunk ch{b.seq_begin[seq] + t0, min(kChunk, len - t0), static_cast<int>(blockIdx.z),
                 static_cast<int>(blockIdx.z) / (s.nv / s.nk), b.num_tokens};
  stage_inputs(sm, ch, y, a, bg, A_log, dt_bias, s);
  normalise(sm, ch, s, ws);
  products(sm, ch, s, ws);
  invert(sm);
  solve(sm, ch, s, ws);
}

}  // namespace

void launch_prep(const BatchMeta& b, const bf16* y, const bf16* a, const bf16* bgate,
                 const float* A_log, const float* dt_bias, const GdnShape& s, const Workspace& ws,
                 cudaStream_t stream) {
  constexpr int smem = sizeof(PrepSmem);
  cudaFuncSetAttribute(prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const int chunks = (b.max_seq_len + kChunk - 1) / kChunk;
  prep_kernel<<<dim3(b.num_seqs, chunks, s.nv), kThreads, smem, stream>>>(b, y, a, bgate, A_log,
                                                                          dt_bias, s, ws);
}

}  // namespace deltaserve::cuda::gdn_chunk
