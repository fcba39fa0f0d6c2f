#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/common.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kPrepThreads = 128;

// Block (t, head): heads [0, nh) are query heads, [nh, nh + nkv) key/value heads.
__global__ void attn_prep_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ qg,
                                 __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                                 const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                 AttnShape s, __nv_bfloat16* __restrict__ q,
                                 __nv_bfloat16* __restrict__ gate,
                                 __nv_bfloat16* __restrict__ k_cache,
                                 __nv_bfloat16* __restrict__ v_cache) {
  __shared__ float x[512];
  const int t = blockIdx.x, head = blockIdx.y, hd = s.hd;
  const bool is_q = head < s.nh;
  const int h = is_q ? head : head - s.nh;
  const __nv_bfloat16* src = is_q ? qg + (static_cast<size_t>(t) * s.nh + h) * 2 * hd
                                  : k + (static_cast<size_t>(t) * s.nkv + h) * hd;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hd; i += kPrepThreads) {
    x[i] = __bfloat162float(src[i]);
    ss += x[i] * x[i];
  }
  const float inv = rsqrtf(block_sum<kPrepThreads>(ss) / static_cast<float>(hd) + s.eps);
  const float* w = is_q ? q_norm : k_norm;
  for (int i = threadIdx.x; i < hd; i += kPrepThreads) x[i] = x[i] * inv * (1.0f + w[i]);
  __syncthreads();
  const int pos = b.token_pos[t], half = s.rotary_dim / 2;
  __nv_bfloat16* dst;
  if (is_q) {
    dst = q + (static_cast<size_t>(t) * s.nh + h) * hd;
    for (int i = threadIdx.x; i < hd; i += kPrepThreads)
      gate[(static_cast<size_t>(t) * s.nh + h) * hd + i] = src[hd + i];
  } else {
    const int seq = b.token_seq[t];
    const int page = b.pages[b.seq_page_off[seq] + pos / b.page_size];
    const size_t row = static_cast<size_t>(page) * b.page_size + pos % b.page_size;
    dst = k_cache + (row * s.nkv + h) * hd;
    const __nv_bfloat16* vs = v + (static_cast<size_t>(t) * s.nkv + h) * hd;
    for (int i = threadIdx.x; i < hd; i += kPrepThreads)
      v_cache[(row * s.nkv + h) * hd + i] = vs[i];
  }
  for (int i = threadIdx.x; i < hd; i += kPrepThreads) {
    float y = x[i];
    if (i < s.rotary_dim) {
      const int f =
          i % half;  // NeoX rotate-half: pairs (f, f + half), f32 angles as HF computes them
      const float inv_freq =
          1.0f / powf(s.rope_theta, static_cast<float>(2 * f) / static_cast<float>(s.rotary_dim));
      const float ang = static_cast<float>(pos) * inv_freq;
      const float c = cosf(ang), sn = sinf(ang);
      y = i < half ? x[i] * c - x[i + half] * sn : x[i] * c + x[i - half] * sn;
    }
    dst[i] = __float2bfloat16(y);
  }
  if (!is_q)  // the k input gets the normed, roped values too (as the CPU backend's)
    for (int i = threadIdx.x; i < hd; i += kPrepThreads)
      k[(static_cast<size_t>(t) * s.nkv + h) * hd + i] = dst[i];
}

constexpr int kWarps = 4;

// Block (t, h): each warp walks every kWarps-th key with an online softmax; warps merge at the end.
__global__ void paged_attention_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ q,
                                       const __nv_bfloat16* __restrict__ gate,
                                       const __nv_bfloat16* __restrict__ kc,
                                       const __nv_bfloat16* __restrict__ vc, AttnShape s,
                                       __nv_bfloat16* __restrict__ out) {
  constexpr int kMaxPer = 8;  // hd <= 256
  const int t = blockIdx.x, h = blockIdx.y, hd = s.hd, per = hd / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int kvh = h / (s.nh / s.nkv), seq = b.token_seq[t], n = b.token_pos[t] + 1;
  const int* pages = b.pages + b.seq_page_off[seq];
  const float scale = rsqrtf(static_cast<float>(hd));
  float qv[kMaxPer], acc[kMaxPer];
  for (int j = 0; j < per; ++j) {
    qv[j] = __bfloat162float(q[(static_cast<size_t>(t) * s.nh + h) * hd + lane + 32 * j]) * scale;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int p = warp; p < n; p += kWarps) {
    const size_t row = static_cast<size_t>(pages[p / b.page_size]) * b.page_size + p % b.page_size;
    const __nv_bfloat16* kr = kc + (row * s.nkv + kvh) * hd;
    float dot = 0.0f;
    for (int j = 0; j < per; ++j) dot += qv[j] * __bfloat162float(kr[lane + 32 * j]);
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float m_new = fmaxf(m, dot), corr = __expf(m - m_new), e = __expf(dot - m_new);
    const __nv_bfloat16* vr = vc + (row * s.nkv + kvh) * hd;
    for (int j = 0; j < per; ++j) acc[j] = acc[j] * corr + e * __bfloat162float(vr[lane + 32 * j]);
    l = l * corr + e;
    m = m_new;
  }
  __shared__ float sm[kWarps], sl[kWarps], sacc[kWarps][256];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  for (int j = 0; j < per; ++j) sacc[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  if (warp == 0) {
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
    float L = 0.0f;
    for (int w = 0; w < kWarps; ++w) L += sm[w] == -INFINITY ? 0.0f : sl[w] * __expf(sm[w] - M);
    for (int j = 0; j < per; ++j) {
      const int d = lane + 32 * j;
      float o = 0.0f;
      for (int w = 0; w < kWarps; ++w)
        if (sm[w] != -INFINITY) o += sacc[w][d] * __expf(sm[w] - M);
      const size_t idx = (static_cast<size_t>(t) * s.nh + h) * hd + d;
      out[idx] = __float2bfloat16(o / L / (1.0f + __expf(-__bfloat162float(gate[idx]))));
    }
  }
}

}  // namespace

void launch_attn_prep(const BatchMeta& b, const __nv_bfloat16* qg, __nv_bfloat16* k,
                      const __nv_bfloat16* v, const float* q_norm, const float* k_norm,
                      const AttnShape& s, __nv_bfloat16* q, __nv_bfloat16* gate,
                      __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, cudaStream_t stream) {
  if (b.num_tokens == 0) return;
  attn_prep_kernel<<<dim3(b.num_tokens, s.nh + s.nkv), kPrepThreads, 0, stream>>>(
      b, qg, k, v, q_norm, k_norm, s, q, gate, k_cache, v_cache);
}

void launch_paged_attention(const BatchMeta& b, const __nv_bfloat16* q, const __nv_bfloat16* gate,
                            const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                            const AttnShape& s, __nv_bfloat16* out, cudaStream_t stream) {
  if (b.num_tokens == 0) return;
  paged_attention_kernel<<<dim3(b.num_tokens, s.nh), 32 * kWarps, 0, stream>>>(b, q, gate, k_cache,
                                                                               v_cache, s, out);
}

}  // namespace deltaserve::cuda
