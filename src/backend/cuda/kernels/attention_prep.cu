// Attention's input preparation for a step: the q / k RMSNorms, NeoX RoPE, the split of q from
// its output gate (unless the attention reads it from qg) and the write of k / v into the paged
// cache (attention.cuh), in bf16 or fp8 e4m3.
#include <type_traits>

#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kv_fp8.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kPrepThreads = 128;

// Any head size (hd <= 512): block (t, head), heads [0, nh) query heads, [nh, nh + nkv) key/value
// heads; a value per thread at a time, through shared memory.
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
    if (gate)  // else the attention reads it from qg
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

// Vector path, hd = 32 kPer (kPer 2, 4 or 8) and (rotary_dim / 2) % kPer == 0: a warp per (token,
// head), lane l holding elements [kPer l, kPer l + kPer) in registers; the norm's sum by shuffles,
// each rotary pair's partner fetched from the lane half a rotary span away; the token's cos / sin
// per frequency computed once per block into shared memory. Same arithmetic as attn_prep_kernel.
constexpr int kPrepWarps = 4;

template <int kPer>
struct Vec {  // kPer bf16 as one 4-, 8- or 16-byte access
  using Raw = std::conditional_t<kPer == 8, uint4, std::conditional_t<kPer == 4, uint2, uint32_t>>;
  __device__ static void load(const __nv_bfloat16* p, float (&x)[kPer]) {
    const Raw raw = *reinterpret_cast<const Raw*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < kPer / 2; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      x[2 * i] = f.x;
      x[2 * i + 1] = f.y;
    }
  }
  __device__ static void store(__nv_bfloat16* p, const float (&x)[kPer]) {
    Raw raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < kPer / 2; ++i) h[i] = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    *reinterpret_cast<Raw*>(p) = raw;
  }
  __device__ static void copy(__nv_bfloat16* dst, const __nv_bfloat16* src) {
    *reinterpret_cast<Raw*>(dst) = *reinterpret_cast<const Raw*>(src);
  }
  // kPer e4m3 bytes as one 2-, 4- or 8-byte access.
  __device__ static void store(uint8_t* p, const float (&x)[kPer]) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < kPer / 2; ++i)
      w[i / 2] |= static_cast<uint32_t>(kv_fp8::narrow2(x[2 * i], x[2 * i + 1])) << (16 * (i % 2));
    if constexpr (kPer == 8) *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    if constexpr (kPer == 4) *reinterpret_cast<uint32_t*>(p) = w[0];
    if constexpr (kPer == 2) *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(w[0]);
  }
  __device__ static void copy(uint8_t* dst, const __nv_bfloat16* src) {
    float x[kPer];
    load(src, x);
    store(dst, x);
  }
};

// The vector kernels' arguments (launch_attn_prep's). KvT: the cache's element (bf16, or uint8_t
// for fp8 e4m3).
template <typename KvT>
struct PrepArgs {
  BatchMeta b;
  const __nv_bfloat16* qg;
  __nv_bfloat16* k;
  const __nv_bfloat16* v;
  const float *q_norm, *k_norm;
  AttnShape s;
  __nv_bfloat16 *q, *gate;
  KvT *k_cache, *v_cache;
};

// A lane's part of one head's NeoX rotate-half over [0, rotary_dim): the cos / sin of its kPer
// elements' frequencies (f32 angles as HF computes them) and the lane holding their partners
// (element i pairs with i +- half, kept by the lane half / kPer away).
template <int kPer>
struct LaneRotation {
  float c[kPer], sn[kPer];
  bool rotary, first;
  int partner;
  __device__ LaneRotation(int lane, const AttnShape& s) {
    const int e0 = kPer * lane, half = s.rotary_dim / 2, span = half / kPer;
    rotary = e0 < s.rotary_dim;
    first = e0 < half;
    partner = rotary ? (first ? lane + span : lane - span) : lane;
  }
};

__device__ inline float inv_freq(int f, const AttnShape& s) {
  return 1.0f / powf(s.rope_theta, static_cast<float>(2 * f) / static_cast<float>(s.rotary_dim));
}

// x, a lane's kPer elements of one head of hd = 32 kPer, normed (zero-centred weights w) and
// rotated into y.
template <int kPer>
__device__ void norm_rotate(float (&x)[kPer], const float (&w)[kPer], float eps,
                            const LaneRotation<kPer>& r, float (&y)[kPer]) {
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) ss += x[i] * x[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = rsqrtf(ss / static_cast<float>(32 * kPer) + eps);
#pragma unroll
  for (int i = 0; i < kPer; ++i) x[i] = x[i] * inv * (1.0f + w[i]);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const float other = __shfl_sync(0xffffffffu, x[i], r.partner);
    y[i] = x[i];
    if (r.rotary)
      y[i] = r.first ? x[i] * r.c[i] - other * r.sn[i] : x[i] * r.c[i] + other * r.sn[i];
  }
}

// Key / value head h of token t (at pos) after its norm and rotation (y): into the caches, and
// into the k input too (as the CPU's).
template <int kPer, typename KvT>
__device__ void store_kv(const BatchMeta& b, int t, int pos, int h, const AttnShape& s,
                         const float (&y)[kPer], __nv_bfloat16* k, const __nv_bfloat16* v,
                         KvT* k_cache, KvT* v_cache) {
  using V = Vec<kPer>;
  const int e0 = kPer * (static_cast<int>(threadIdx.x) % 32), hd = 32 * kPer;
  const int page = b.pages[b.seq_page_off[b.token_seq[t]] + pos / b.page_size];
  const size_t row =
      ((static_cast<size_t>(page) * b.page_size + pos % b.page_size) * s.nkv + h) * hd;
  const size_t in = (static_cast<size_t>(t) * s.nkv + h) * hd;
  V::store(k_cache + row + e0, y);
  V::copy(v_cache + row + e0, v + in + e0);
  V::store(k + in + e0, y);
}

template <int kPer>
__device__ void load_weights(const float* w, float (&out)[kPer]) {
#pragma unroll
  for (int i = 0; i < kPer; ++i) out[i] = w[kPer * (threadIdx.x % 32) + i];
}

// Decode-sized steps: block (t, group of kPrepWarps heads), a warp a head, the token's cos / sin
// per frequency computed once per block into shared memory. kEarly (launched as a programmatic
// dependent): the norm weights are loaded before the wait. KvT: the cache's element (bf16, or
// uint8_t for fp8 e4m3).
template <int kPer, bool kEarly, typename KvT>
__global__ void __launch_bounds__(32 * kPrepWarps)
    attn_prep_vec_kernel(const __grid_constant__ PrepArgs<KvT> args) {
  pdl::allow_successor();  // the attention kernel after this one may take its place early
  const auto& [b, qg, k, v, q_norm, k_norm, s, q, gate, k_cache, v_cache] = args;
  using V = Vec<kPer>;
  __shared__ float cos_f[16 * kPer], sin_f[16 * kPer];  // f in [0, rotary_dim / 2 <= hd / 2)
  const int t = blockIdx.x, head = blockIdx.y * kPrepWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32, hd = 32 * kPer, e0 = kPer * lane;
  const int pos = b.token_pos[t], half = s.rotary_dim / 2;
  for (int f = threadIdx.x; f < half; f += 32 * kPrepWarps)
    sincosf(static_cast<float>(pos) * inv_freq(f, s), &sin_f[f], &cos_f[f]);
  __syncthreads();
  if (head >= s.nh + s.nkv) return;  // whole warps
  const bool is_q = head < s.nh;
  const int h = is_q ? head : head - s.nh;
  LaneRotation<kPer> r(lane, s);
  if (r.rotary)
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      r.c[i] = cos_f[(e0 + i) % half];
      r.sn[i] = sin_f[(e0 + i) % half];
    }
  // The rotation (from the step's positions, uploaded before its first kernel) and, kEarly, the
  // norm's weights (never written by a kernel) are ready before the wait for the projection's
  // output.
  float w[kPer];
  if constexpr (kEarly) load_weights(is_q ? q_norm : k_norm, w);
  pdl::wait_for_predecessor();
  const __nv_bfloat16* src = is_q ? qg + (static_cast<size_t>(t) * s.nh + h) * 2 * hd
                                  : k + (static_cast<size_t>(t) * s.nkv + h) * hd;
  float x[kPer], y[kPer];
  V::load(src + e0, x);
  if constexpr (!kEarly) load_weights(is_q ? q_norm : k_norm, w);
  norm_rotate(x, w, s.eps, r, y);
  if (is_q) {
    const size_t row = (static_cast<size_t>(t) * s.nh + h) * hd;
    V::store(q + row + e0, y);
    if (gate) V::copy(gate + row + e0, src + hd + e0);  // else the attention reads it from qg
  } else {
    store_kv(b, t, pos, h, s, y, k, v, k_cache, v_cache);
  }
}

// Prefill-sized steps: a warp a token, over all its heads: its rotation computed once, in
// registers, and kLoads heads' inputs loaded before the first is normed (more bytes in flight
// than a warp a head, which waits on one load). The same arithmetic as attn_prep_vec_kernel.
constexpr int kLoads = 4;
// A token's n heads in a warp: kLoads heads' inputs loaded (load(h, x)) before the first is
// normed and rotated, then each stored (store(h, y)).
template <int kPer, class Load, class Store>
__device__ inline void norm_rotate_heads(int n, const float (&w)[kPer], float eps,
                                         const LaneRotation<kPer>& r, Load load, Store store) {
  for (int h0 = 0; h0 < n; h0 += kLoads) {
    float x[kLoads][kPer];
#pragma unroll
    for (int j = 0; j < kLoads; ++j)
      if (h0 + j < n) load(h0 + j, x[j]);
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      if (h0 + j >= n) continue;
      float y[kPer];
      norm_rotate(x[j], w, eps, r, y);
      store(h0 + j, y);
    }
  }
}

template <int kPer, typename KvT>
__global__ void __launch_bounds__(32 * kPrepWarps)
    attn_prep_token_kernel(const __grid_constant__ PrepArgs<KvT> args) {
  const auto& [b, qg, k, v, q_norm, k_norm, s, q, gate, k_cache, v_cache] = args;
  using V = Vec<kPer>;
  const int t = blockIdx.x * kPrepWarps + static_cast<int>(threadIdx.x) / 32;
  if (t >= b.num_tokens) return;  // whole warps
  const int lane = threadIdx.x % 32, hd = 32 * kPer, e0 = kPer * lane;
  const int pos = b.token_pos[t], half = s.rotary_dim / 2;
  LaneRotation<kPer> r(lane, s);
  if (r.rotary)
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      sincosf(static_cast<float>(pos) * inv_freq((e0 + i) % half, s), &r.sn[i], &r.c[i]);
  float w[kPer];
  load_weights(q_norm, w);
  // The lambdas read args' fields: a lambda cannot capture a structured binding (C++17).
  norm_rotate_heads(
      s.nh, w, s.eps, r,
      [&](int h, float(&x)[kPer]) {
        V::load(args.qg + (static_cast<size_t>(t) * args.s.nh + h) * 2 * hd + e0, x);
      },
      [&](int h, const float(&y)[kPer]) {
        const size_t row = (static_cast<size_t>(t) * args.s.nh + h) * hd;
        V::store(args.q + row + e0, y);
        if (args.gate) V::copy(args.gate + row + e0, args.qg + 2 * row + hd + e0);
      });
  load_weights(k_norm, w);
  norm_rotate_heads(
      s.nkv, w, s.eps, r,
      [&](int h, float(&x)[kPer]) {
        V::load(args.k + (static_cast<size_t>(t) * args.s.nkv + h) * hd + e0, x);
      },
      [&](int h, const float(&y)[kPer]) {
        store_kv(args.b, t, pos, h, args.s, y, args.k, args.v, args.k_cache, args.v_cache);
      });
}

// Prefill-sized steps on attn_prep_token_kernel (DS_ATTN_PREP_TOKEN=0: the warp-a-head kernel,
// for A/B).
bool token_warps() {
  static const bool on = ab_switch_on("DS_ATTN_PREP_TOKEN");
  return on;
}

template <int kPer, typename KvT>
void launch_vec(const PrepArgs<KvT>& a, cudaStream_t stream) {
  const int tokens = a.b.num_tokens;
  const dim3 grid(tokens, (a.s.nh + a.s.nkv + kPrepWarps - 1) / kPrepWarps);
  if (tokens <= pdl::kDecodeSizedRows)
    pdl::launch_dependent(attn_prep_vec_kernel<kPer, true, KvT>, grid, 32 * kPrepWarps, 0, stream,
                          a);
  else if (token_warps())
    attn_prep_token_kernel<kPer, KvT>
        <<<(tokens + kPrepWarps - 1) / kPrepWarps, 32 * kPrepWarps, 0, stream>>>(a);
  else
    attn_prep_vec_kernel<kPer, false, KvT><<<grid, 32 * kPrepWarps, 0, stream>>>(a);
}

// The vector path for the shape and pointers: launched (true) or not (false: nothing ran).
template <typename KvT>
bool launch_prep_vec(const PrepArgs<KvT>& a, cudaStream_t stream) {
  const int per = a.s.hd / 32;
  if (!attn_prep_vec_supported(a.s) || !aligned16(a.qg, a.k, a.v, a.q, a.gate, a.k_cache) ||
      !aligned16(a.v_cache, a.q_norm, a.k_norm))
    return false;
  if (per == 8) launch_vec<8>(a, stream);
  if (per == 4) launch_vec<4>(a, stream);
  if (per == 2) launch_vec<2>(a, stream);
  return true;
}

}  // namespace

bool attn_prep_vec_supported(const AttnShape& s) {
  const int per = s.hd / 32, half = s.rotary_dim / 2;
  return s.hd % 32 == 0 && (per == 2 || per == 4 || per == 8) && half % per == 0 &&
         s.rotary_dim <= s.hd;
}

void launch_attn_prep(const BatchMeta& b, const __nv_bfloat16* qg, __nv_bfloat16* k,
                      const __nv_bfloat16* v, const float* q_norm, const float* k_norm,
                      const AttnShape& s, __nv_bfloat16* q, __nv_bfloat16* gate,
                      __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, cudaStream_t stream) {
  if (b.num_tokens == 0 || launch_prep_vec(PrepArgs<__nv_bfloat16>{b, qg, k, v, q_norm, k_norm, s,
                                                                   q, gate, k_cache, v_cache},
                                           stream))
    return;
  attn_prep_kernel<<<dim3(b.num_tokens, s.nh + s.nkv), kPrepThreads, 0, stream>>>(
      b, qg, k, v, q_norm, k_norm, s, q, gate, k_cache, v_cache);
}

bool launch_attn_prep(const BatchMeta& b, const __nv_bfloat16* qg, __nv_bfloat16* k,
                      const __nv_bfloat16* v, const float* q_norm, const float* k_norm,
                      const AttnShape& s, __nv_bfloat16* q, __nv_bfloat16* gate, uint8_t* k_cache,
                      uint8_t* v_cache, cudaStream_t stream) {
  return b.num_tokens == 0 ||
         launch_prep_vec(
             PrepArgs<uint8_t>{b, qg, k, v, q_norm, k_norm, s, q, gate, k_cache, v_cache}, stream);
}

}  // namespace deltaserve::cuda
