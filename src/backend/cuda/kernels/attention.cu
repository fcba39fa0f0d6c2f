#include <algorithm>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_prefill.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kTcMinLen = 16;  // sequences with this many step tokens: the tensor-core kernel
constexpr int kMaxPer = 8;     // hd <= 256: up to 8 contiguous elements per lane
// Keys a warp loads at once. On the H200 (4B decode steps at context 1k, one run): 2 beats 1 at
// every B (attention 0.455 / 1.047 / 3.77 ms a step at B = 16 / 64 / 256 vs 0.508 / 1.176 / 4.29)
// and 4 at B = 64 / 256 (4: 152 registers, fewer blocks an SM, 1.297 ms at 64; better at B <= 16).
constexpr int kKeys = 2;

// Block (token t, KV head, split): the G = nh / nkv query heads sharing the KV head walk the keys
// [p0, p1) of the token's causal range [0, pos] together (each key and value row is read once for
// all G heads); warps take every kWarps-th run of kKeys keys with an online softmax per head and
// merge at the end. With one split the block writes sigmoid(gate) * softmax(.) v; else the
// unnormalised partial (m, l, acc[hd]) goes to ws [T, nh, splits, hd + 2] for attn_combine_kernel.
template <int kG>
__global__ void __launch_bounds__(32 * kWarps)
    attn_split_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ q,
                      const __nv_bfloat16* __restrict__ gate, const __nv_bfloat16* __restrict__ kc,
                      const __nv_bfloat16* __restrict__ vc, AttnShape s, int splits, int min_len,
                      float* __restrict__ ws, __nv_bfloat16* __restrict__ out) {
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  __shared__ float sm[kWarps][kG], sl[kWarps][kG], sacc[kWarps][kG][256];
  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int G = s.nh / s.nkv, hd = s.hd, per = hd / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int seq = b.token_seq[t], n = b.token_pos[t] + 1;
  if (b.seq_len[seq] >= min_len) return;  // the tensor-core prefill kernel's
  const int chunk = (n + splits - 1) / splits;
  const int p0 = split * chunk, p1 = min(n, p0 + chunk);
  const int* pages = b.pages + b.seq_page_off[seq];
  const float scale = rsqrtf(static_cast<float>(hd));
  float qv[kG][kMaxPer], acc[kG][kMaxPer], m[kG], l[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) {
      acc[g][j] = 0.0f;
      qv[g][j] = (g < G && j < per)
                     ? __bfloat162float(
                           q[(static_cast<size_t>(t) * s.nh + kvh * G + g) * hd + lane * per + j]) *
                           scale
                     : 0.0f;
    }
  }
  // Each warp takes kKeys consecutive keys at a time, their K and V rows loaded before any is
  // used (kKeys x 1 KB in flight a warp at hd = 256), then folds them in one by one.
  for (int p = p0 + warp * kKeys; p < p1; p += kWarps * kKeys) {
    uint4 kw[kKeys], vw[kKeys];
    size_t at[kKeys];
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int pu = min(p + u, p1 - 1);
      const size_t row =
          static_cast<size_t>(pages[pu / b.page_size]) * b.page_size + pu % b.page_size;
      at[u] = (row * s.nkv + kvh) * hd + lane * per;
      if (per == 8) {
        kw[u] = *reinterpret_cast<const uint4*>(kc + at[u]);
        vw[u] = *reinterpret_cast<const uint4*>(vc + at[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      if (p + u >= p1) break;
      float kf[kMaxPer], vf[kMaxPer];
      if (per == 8) {
        const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&kw[u]);
        const __nv_bfloat162* v2 = reinterpret_cast<const __nv_bfloat162*>(&vw[u]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 a = __bfloat1622float2(k2[j]), c = __bfloat1622float2(v2[j]);
          kf[2 * j] = a.x;
          kf[2 * j + 1] = a.y;
          vf[2 * j] = c.x;
          vf[2 * j + 1] = c.y;
        }
      } else {
        const __nv_bfloat16 *kr = kc + at[u], *vr = vc + at[u];
#pragma unroll
        for (int j = 0; j < kMaxPer; ++j) {
          kf[j] = j < per ? __bfloat162float(kr[j]) : 0.0f;
          vf[j] = j < per ? __bfloat162float(vr[j]) : 0.0f;
        }
      }
      float dot[kG];
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        dot[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxPer; ++j) dot[g] = fmaf(qv[g][j], kf[j], dot[g]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int g = 0; g < kG; ++g) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float m_new = fmaxf(m[g], dot[g]), corr = __expf(m[g] - m_new),
                    e = __expf(dot[g] - m_new);
#pragma unroll
        for (int j = 0; j < kMaxPer; ++j) acc[g][j] = fmaf(acc[g][j], corr, e * vf[j]);
        l[g] = l[g] * corr + e;
        m[g] = m_new;
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (lane == 0) {
      sm[warp][g] = m[g];
      sl[warp][g] = l[g];
    }
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j)
      if (j < per) sacc[warp][g][lane * per + j] = acc[g][j];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < G * hd; e += 32 * kWarps) {
    const int g = e / hd, d = e % hd, h = kvh * G + g;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w][g]);
    float L = 0.0f, o = 0.0f;
    if (M > -INFINITY)
      for (int w = 0; w < kWarps; ++w)
        if (sm[w][g] > -INFINITY) {
          const float c = __expf(sm[w][g] - M);
          L += sl[w][g] * c;
          o += sacc[w][g][d] * c;
        }
    const size_t idx = (static_cast<size_t>(t) * s.nh + h) * hd + d;
    if (splits == 1) {
      out[idx] = __float2bfloat16(o / L / (1.0f + __expf(-__bfloat162float(gate[idx]))));
    } else {
      float* part = ws + ((static_cast<size_t>(t) * s.nh + h) * splits + split) * (hd + 2);
      part[2 + d] = o;
      if (d == 0) {
        part[0] = M;
        part[1] = L;
      }
    }
  }
}

// Block (t, head): merges the splits' partials and applies the gate.
__global__ void attn_combine_kernel(BatchMeta b, AttnShape s, int splits, int min_len,
                                    const float* __restrict__ ws,
                                    const __nv_bfloat16* __restrict__ gate,
                                    __nv_bfloat16* __restrict__ out) {
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  const int t = blockIdx.x, h = blockIdx.y, hd = s.hd;
  if (b.seq_len[b.token_seq[t]] >= min_len) return;
  const float* part = ws + (static_cast<size_t>(t) * s.nh + h) * splits * (hd + 2);
  float M = -INFINITY;
  for (int k = 0; k < splits; ++k) M = fmaxf(M, part[k * (hd + 2)]);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float L = 0.0f, o = 0.0f;
    for (int k = 0; k < splits; ++k) {
      const float* pk = part + k * (hd + 2);
      if (pk[0] == -INFINITY) continue;
      const float c = __expf(pk[0] - M);
      L += pk[1] * c;
      o += pk[2 + d] * c;
    }
    const size_t idx = (static_cast<size_t>(t) * s.nh + h) * hd + d;
    out[idx] = __float2bfloat16(o / L / (1.0f + __expf(-__bfloat162float(gate[idx]))));
  }
}

template <int kG>
void launch_split(const BatchMeta& b, const __nv_bfloat16* q, const __nv_bfloat16* gate,
                  const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, const AttnShape& s,
                  int splits, int min_len, float* ws, __nv_bfloat16* out, cudaStream_t stream) {
  attn_split_kernel<kG><<<dim3(b.num_tokens, s.nkv, splits), 32 * kWarps, 0, stream>>>(
      b, q, gate, k_cache, v_cache, s, splits, min_len, ws, out);
}

}  // namespace

int attention_splits(int num_tokens, const AttnShape& s, int num_sms, size_t ws_bytes) {
  if (num_tokens > 256) return 1;  // prefill: enough blocks without splitting
  const int blocks = num_tokens * s.nkv;
  int splits = std::min(32, std::max(1, (2 * num_sms + blocks - 1) / blocks));
  while (splits > 1 &&
         static_cast<size_t>(num_tokens) * s.nh * splits * (s.hd + 2) * sizeof(float) > ws_bytes)
    --splits;
  return splits;
}

void launch_paged_attention(const BatchMeta& b, const __nv_bfloat16* q, const __nv_bfloat16* gate,
                            const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                            const AttnShape& s, int splits, float* ws, __nv_bfloat16* out,
                            cudaStream_t stream) {
  if (b.num_tokens == 0) return;
  // Sequences with at least kTcMinLen tokens in the step (prefills) take the tensor-core kernel
  // when the head size has one; the rest (decode rows) the split-KV kernel.
  int min_len = 1 << 30;
  if (b.max_seq_len >= kTcMinLen && attention_prefill_supported(s)) {
    min_len = kTcMinLen;
    launch_attention_prefill(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
    if (b.num_tokens == b.max_seq_len) return;  // one sequence, all of it prefill
  }
  const int G = s.nh / s.nkv;
  if (G <= 1)
    launch_split<1>(b, q, gate, k_cache, v_cache, s, splits, min_len, ws, out, stream);
  else if (G <= 2)
    launch_split<2>(b, q, gate, k_cache, v_cache, s, splits, min_len, ws, out, stream);
  else if (G <= 4)
    launch_split<4>(b, q, gate, k_cache, v_cache, s, splits, min_len, ws, out, stream);
  else
    launch_split<8>(b, q, gate, k_cache, v_cache, s, splits, min_len, ws, out, stream);
  if (splits > 1)
    attn_combine_kernel<<<dim3(b.num_tokens, s.nh), std::min(s.hd, 256), 0, stream>>>(
        b, s, splits, min_len, ws, gate, out);
}

}  // namespace deltaserve::cuda
