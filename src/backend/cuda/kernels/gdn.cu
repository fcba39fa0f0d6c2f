#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn.cuh"

namespace deltaserve::cuda {
namespace {

// Thread per (token, channel): y[t, c] = silu(sum_i w[c, i] * in(t - (K-1) + i)), where in(j) for
// j < 0 (before this step) comes from the slot's conv state (zeros for a fresh sequence).
__global__ void gdn_conv_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ u,
                                const __nv_bfloat16* __restrict__ w,
                                const __nv_bfloat16* __restrict__ state, int C, int K,
                                __nv_bfloat16* __restrict__ y) {
  const int t = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
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
  y[static_cast<size_t>(t) * C + c] = __float2bfloat16(silu(acc));
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
  __nv_bfloat16 nw[8];
  for (int i = 0; i < km1; ++i) {
    const int src = n - km1 + i;
    nw[i] = src >= 0 ? u[static_cast<size_t>(begin + src) * C + c]
                     : (fresh ? __float2bfloat16(0.0f) : st[km1 + src]);
  }
  for (int i = 0; i < km1; ++i) st[i] = nw[i];
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

// Decode fast path for dv == 128, dk a multiple of 16 up to 256: block (sequence, value head) of 16
// warps; lane l owns columns 4l..4l+3 of the head's whole state (16-byte loads), warp w rows w,
// w + 16, ...; q / k norms are computed once per head.
constexpr int kFastWarps = 16, kFastThreads = 32 * kFastWarps, kFastRows = 256 / kFastWarps;

__global__ void __launch_bounds__(kFastThreads)
    delta_rule_dv128_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ y,
                            const __nv_bfloat16* __restrict__ a,
                            const __nv_bfloat16* __restrict__ bg, const float* __restrict__ A_log,
                            const float* __restrict__ dt_bias, float* __restrict__ state,
                            GdnShape s, __nv_bfloat16* __restrict__ out) {
  __shared__ float qs[256], ks[256];
  __shared__ float4 red[kFastWarps][32];
  const int seq = blockIdx.x, h = blockIdx.y, kh = h / (s.nv / s.nk);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, tid = threadIdx.x;
  const int key_dim = s.nk * s.dk, C = 2 * key_dim + s.nv * 128;
  float4* S = reinterpret_cast<float4*>(state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) *
                                                    s.dk * 128);
  const bool fresh = b.seq_start[seq] == 0;
  const int rows = s.dk / kFastWarps;
  float4 st[kFastRows];
#pragma unroll
  for (int r = 0; r < kFastRows; ++r)
    st[r] = (!fresh && r < rows) ? S[(warp + kFastWarps * r) * 32 + lane]
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float qscale = rsqrtf(static_cast<float>(s.dk));
  const float neg_A = -__expf(A_log[h]), bias = dt_bias[h];
  const int begin = b.seq_begin[seq], n = b.seq_len[seq];
  for (int t = 0; t < n; ++t) {
    const __nv_bfloat16* row = y + static_cast<size_t>(begin + t) * C;
    const bool is_q = tid < 256, has = (tid % 256) < s.dk;
    const int i0 = tid % 256;
    const float x = has ? __bfloat162float(row[(is_q ? 0 : key_dim) + kh * s.dk + i0]) : 0.0f;
    const float sq = block_sum<kFastThreads>(is_q ? x * x : 0.0f);
    const float sk = block_sum<kFastThreads>(is_q ? 0.0f : x * x);
    if (has) {
      if (is_q)
        qs[i0] = x * qscale * rsqrtf(sq + 1e-6f);
      else
        ks[i0] = x * rsqrtf(sk + 1e-6f);
    }
    const size_t gi = static_cast<size_t>(begin + t) * s.nv + h;
    const float beta = 1.0f / (1.0f + __expf(-__bfloat162float(bg[gi])));
    const float xa = __bfloat162float(a[gi]) + bias;
    const float alpha = __expf(neg_A * (xa > 20.0f ? xa : log1pf(__expf(xa))));
    const __nv_bfloat16* vr = row + 2 * key_dim + h * 128 + 4 * lane;
    const float4 v = make_float4(__bfloat162float(vr[0]), __bfloat162float(vr[1]),
                                 __bfloat162float(vr[2]), __bfloat162float(vr[3]));
    __syncthreads();  // qs / ks written
    float4 m = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < kFastRows; ++r)
      if (r < rows) {
        const float kv = ks[warp + kFastWarps * r];
        st[r].x *= alpha;
        st[r].y *= alpha;
        st[r].z *= alpha;
        st[r].w *= alpha;
        m.x = fmaf(st[r].x, kv, m.x);
        m.y = fmaf(st[r].y, kv, m.y);
        m.z = fmaf(st[r].z, kv, m.z);
        m.w = fmaf(st[r].w, kv, m.w);
      }
    red[warp][lane] = m;
    __syncthreads();
    m = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kFastWarps; ++w) {
      const float4 p = red[w][lane];
      m.x += p.x;
      m.y += p.y;
      m.z += p.z;
      m.w += p.w;
    }
    const float4 d =
        make_float4(beta * (v.x - m.x), beta * (v.y - m.y), beta * (v.z - m.z), beta * (v.w - m.w));
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < kFastRows; ++r)
      if (r < rows) {
        const int i = warp + kFastWarps * r;
        const float kv = ks[i], qv = qs[i];
        st[r].x = fmaf(kv, d.x, st[r].x);
        st[r].y = fmaf(kv, d.y, st[r].y);
        st[r].z = fmaf(kv, d.z, st[r].z);
        st[r].w = fmaf(kv, d.w, st[r].w);
        o.x = fmaf(st[r].x, qv, o.x);
        o.y = fmaf(st[r].y, qv, o.y);
        o.z = fmaf(st[r].z, qv, o.z);
        o.w = fmaf(st[r].w, qv, o.w);
      }
    __syncthreads();  // every warp has read red (m)
    red[warp][lane] = o;
    __syncthreads();
    if (warp == 0) {
      o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kFastWarps; ++w) {
        const float4 p = red[w][lane];
        o.x += p.x;
        o.y += p.y;
        o.z += p.z;
        o.w += p.w;
      }
      __nv_bfloat16* op = out + gi * 128 + 4 * lane;
      op[0] = __float2bfloat16(o.x);
      op[1] = __float2bfloat16(o.y);
      op[2] = __float2bfloat16(o.z);
      op[3] = __float2bfloat16(o.w);
    }
    __syncthreads();  // red, qs, ks are rewritten for the next token
  }
#pragma unroll
  for (int r = 0; r < kFastRows; ++r)
    if (r < rows) S[(warp + kFastWarps * r) * 32 + lane] = st[r];
}

// ---- Chunked prefill (chunk 64, the WY form of the CPU backend and the spec) in two kernels.
// Per (token, value head) the workspace holds, at 16-byte aligned offsets,
// [U dv | W dk | P 64 | q dk | k dk | gamma] f32.
constexpr int kChunk = 64, kChunkThreads = 256;

struct WsLayout {
  int u, w, p, q, k, gam, per;
  __host__ __device__ explicit WsLayout(const GdnShape& s)
      : u(0),
        w(s.dv),
        p(s.dv + s.dk),
        q(s.dv + s.dk + kChunk),
        k(s.dv + 2 * s.dk + kChunk),
        gam(s.dv + 3 * s.dk + kChunk),
        per((s.dv + 3 * s.dk + kChunk + 1 + 3) / 4 * 4) {}
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
  extern __shared__ float sm[];
  const int dk = s.dk, dv = s.dv, kp = dk + 1, vp = dv + 1;
  float* Ks = sm;                // [64][dk + 1]
  float* Qs = Ks + kChunk * kp;  // [64][dk + 1]
  float* Vs = Qs + kChunk * kp;  // [64][dv + 1]
  float* L = Vs + kChunk * vp;   // [64][65]
  float* P = L + kChunk * 65;    // [64][65]
  float* gam = P + kChunk * 65;  // [64]
  float* beta = gam + kChunk;    // [64]
  const int seq = blockIdx.x, chunk = blockIdx.y, h = blockIdx.z, kh = h / (s.nv / s.nk);
  const int t0 = chunk * kChunk, len = b.seq_len[seq];
  if (t0 >= len) return;
  const int n = min(kChunk, len - t0), begin = b.seq_begin[seq] + t0;
  const int key_dim = s.nk * dk, C = 2 * key_dim + s.nv * dv;
  const WsLayout lay(s);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, tid = threadIdx.x;
  constexpr int kW = kChunkThreads / 32;
  const float qscale = rsqrtf(static_cast<float>(dk));
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
    for (int x = lane; x < dv; x += 32)
      Vs[i * vp + x] = __bfloat162float(row[2 * key_dim + h * dv + x]);
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
  // L and P: warp per row i, lanes over j (j <= i).
  for (int i = warp; i < n; i += kW)
    for (int j = lane; j <= i; j += 32) {
      float dqk = 0.0f, dkk = 0.0f;
      for (int x = 0; x < dk; ++x) {
        const float kj = Ks[j * kp + x];
        dqk = fmaf(Qs[i * kp + x], kj, dqk);
        dkk = fmaf(Ks[i * kp + x], kj, dkk);
      }
      const float dec = __expf(gam[i] - gam[j]);
      P[i * 65 + j] = dqk * dec;
      L[i * 65 + j] = j < i ? beta[i] * dkk * dec : 0.0f;
    }
  __syncthreads();
  // Forward substitution, in place: column col of V (-> U) or of K (-> W) per thread.
  for (int col = tid; col < dv + dk; col += kChunkThreads) {
    const bool is_u = col < dv;
    float* X = is_u ? Vs + col : Ks + (col - dv);
    const int ld = is_u ? vp : kp;
    for (int i = 0; i < n; ++i) {
      float acc = X[i * ld] * beta[i] * (is_u ? 1.0f : __expf(gam[i]));
      for (int j = 0; j < i; ++j) acc = fmaf(-L[i * 65 + j], X[j * ld], acc);
      X[i * ld] = acc;
    }
  }
  __syncthreads();
  for (int i = warp; i < n; i += kW) {
    float* wrow = ws + (static_cast<size_t>(begin + i) * s.nv + h) * lay.per;
    for (int x = lane; x < dv; x += 32) wrow[lay.u + x] = Vs[i * vp + x];
    for (int x = lane; x < dk; x += 32) wrow[lay.w + x] = Ks[i * kp + x];
    for (int j = lane; j < kChunk; j += 32) wrow[lay.p + j] = j <= i ? P[i * 65 + j] : 0.0f;
    if (lane == 0) wrow[lay.gam] = gam[i];
  }
}

// Kernel 2, block (sequence, value head, 16-column slice of the state): walks the chunks in order
// with the state slice in shared memory: V' = U - W S; O = e^gam q S + P V'; S = e^gam_n S +
// sum_j e^(gam_n - gam_j) k_j V'_j. Thread (group g of 16, column c): rows g, g + 16, ...
constexpr int kSlice = 16, kGroups = kChunkThreads / kSlice;

__global__ void __launch_bounds__(kChunkThreads)
    gdn_chunk_state_kernel(BatchMeta b, const float* __restrict__ ws, float* __restrict__ state,
                           GdnShape s, __nv_bfloat16* __restrict__ out) {
  extern __shared__ float sm[];
  const int dk = s.dk, dv = s.dv, kp = dk + 4;  // rows stay 16-byte aligned
  const WsLayout lay(s);
  float* St = sm;                    // [dk][16]
  float* X = St + dk * kSlice;       // [64][dk + 4]: W, then q, then k of the chunk
  float* Vp = X + kChunk * kp;       // [64][16]
  float* P = Vp + kChunk * kSlice;   // [64][64]
  float* gam = P + kChunk * kChunk;  // [64]
  float* dec = gam + kChunk;         // [64] e^(gam_n - gam_j)
  const int seq = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * kSlice;
  const int tid = threadIdx.x, c = tid % kSlice, g = tid / kSlice;
  const int col = col0 + c;
  const bool has = col < dv;
  float* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * dk * dv;
  const bool fresh = b.seq_start[seq] == 0;
  for (int x = g; x < dk; x += kGroups)
    St[x * kSlice + c] = (!fresh && has) ? S[x * dv + col] : 0.0f;
  const int len = b.seq_len[seq], base = b.seq_begin[seq];
  const int dk4 = dk / 4;
  for (int t0 = 0; t0 < len; t0 += kChunk) {
    const int n = min(kChunk, len - t0), begin = base + t0;
    auto wrow = [&](int i) { return ws + (static_cast<size_t>(begin + i) * s.nv + h) * lay.per; };
    auto stage = [&](int off) {  // rows [0, n) of the workspace field at `off` into X
      for (int e = tid; e < n * dk4; e += kChunkThreads) {
        const int i = e / dk4, x4 = e % dk4;
        *reinterpret_cast<float4*>(X + i * kp + 4 * x4) =
            *reinterpret_cast<const float4*>(wrow(i) + off + 4 * x4);
      }
    };
    stage(lay.w);
    for (int e = tid; e < n * (kChunk / 4); e += kChunkThreads) {
      const int i = e / (kChunk / 4), j4 = e % (kChunk / 4);
      *reinterpret_cast<float4*>(P + i * kChunk + 4 * j4) =
          *reinterpret_cast<const float4*>(wrow(i) + lay.p + 4 * j4);
    }
    if (tid < n) gam[tid] = wrow(tid)[lay.gam];
    __syncthreads();
    if (tid < n) dec[tid] = __expf(gam[n - 1] - gam[tid]);
    for (int i = g; i < n; i += kGroups) {
      float acc = has ? wrow(i)[lay.u + col] : 0.0f;
      for (int x = 0; x < dk; ++x) acc = fmaf(-X[i * kp + x], St[x * kSlice + c], acc);
      Vp[i * kSlice + c] = acc;
    }
    __syncthreads();
    stage(lay.q);
    __syncthreads();
    for (int i = g; i < n; i += kGroups) {
      float qs = 0.0f;
      for (int x = 0; x < dk; ++x) qs = fmaf(X[i * kp + x], St[x * kSlice + c], qs);
      float o = __expf(gam[i]) * qs;
      for (int j = 0; j <= i; ++j) o = fmaf(P[i * kChunk + j], Vp[j * kSlice + c], o);
      if (has) out[(static_cast<size_t>(begin + i) * s.nv + h) * dv + col] = __float2bfloat16(o);
    }
    __syncthreads();
    stage(lay.k);
    __syncthreads();
    const float en = __expf(gam[n - 1]);
    for (int x = g; x < dk; x += kGroups) {
      float acc = St[x * kSlice + c] * en;
      for (int j = 0; j < n; ++j) acc = fmaf(X[j * kp + x] * dec[j], Vp[j * kSlice + c], acc);
      St[x * kSlice + c] = acc;
    }
    __syncthreads();
  }
  if (has)
    for (int x = g; x < dk; x += kGroups) S[x * dv + col] = St[x * kSlice + c];
}

}  // namespace

void launch_gdn_conv(const BatchMeta& b, const __nv_bfloat16* u, const __nv_bfloat16* w,
                     __nv_bfloat16* conv_state, int C, int K, __nv_bfloat16* y,
                     cudaStream_t stream) {
  if (b.num_seqs == 0) return;
  gdn_conv_kernel<<<dim3((C + 127) / 128, b.num_tokens), 128, 0, stream>>>(b, u, w, conv_state, C,
                                                                           K, y);
  gdn_conv_state_kernel<<<dim3((C + 127) / 128, b.num_seqs), 128, 0, stream>>>(b, u, conv_state, C,
                                                                               K);
}

void launch_gated_delta_rule(const BatchMeta& b, const __nv_bfloat16* y, const __nv_bfloat16* a,
                             const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                             float* state, const GdnShape& s, float* ws, __nv_bfloat16* out,
                             cudaStream_t stream) {
  if (b.num_seqs == 0) return;
  if (s.dv == 128 && s.dk % kFastWarps == 0 && s.dk <= 256 && b.num_tokens == b.num_seqs) {
    delta_rule_dv128_kernel<<<dim3(b.num_seqs, s.nv), kFastThreads, 0, stream>>>(
        b, y, a, bgate, A_log, dt_bias, state, s, out);
    return;
  }
  if (ws != nullptr && b.num_tokens > b.num_seqs && s.dk <= 128 && s.dv <= 256 && s.dk % 4 == 0 &&
      s.dv % 4 == 0) {
    const size_t smem1 =
        (static_cast<size_t>(kChunk) * (2 * (s.dk + 1) + s.dv + 1) + 2 * kChunk * 65 + 2 * kChunk) *
        sizeof(float);
    const size_t smem2 = (static_cast<size_t>(s.dk) * kSlice + kChunk * (s.dk + 4) +
                          kChunk * kSlice + kChunk * kChunk + 2 * kChunk) *
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
    return;
  }
  delta_rule_kernel<<<dim3(b.num_seqs, s.nv, (s.dv + 31) / 32), kThreads, 0, stream>>>(
      b, y, a, bgate, A_log, dt_bias, state, s, out);
}

size_t gdn_chunk_workspace_floats(int num_tokens, const GdnShape& s) {
  return static_cast<size_t>(num_tokens) * s.nv * WsLayout(s).per;
}

}  // namespace deltaserve::cuda
