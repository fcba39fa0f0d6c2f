// The steps of the fused GDN decode layer's block-per-key-head forms (gdn_decode.cu): a key head's
// conv + SiLU, and the delta rule and gated RMSNorm of one of its value heads, with the head's
// state held by kHeadWarps warps — thread (warp w, lane l) rows w, w + kHeadWarps, ... and columns
// 4l .. 4l + 3.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn_decode.cuh"
#include "backend/cuda/kernels/gdn_decode_step.cuh"
#include "backend/cuda/kernels/gdn_state.cuh"

namespace deltaserve::cuda::gdn_decode {

constexpr int kHeadWarps = 8, kHeadThreads = 32 * kHeadWarps;
constexpr int kHeadRows = kDk / kHeadWarps;  // state rows per thread
constexpr int kMaxHeadsPerKey = 4;
static_assert(kHeadThreads >= 2 * kDk, "a thread per q / k channel scales them by their norms");

// The conv outputs of a key head in shared memory: q | k | v of each of its value heads.
constexpr int kKeyHeadChannels = 2 * kDk + kMaxHeadsPerKey * kDv;

__device__ inline float4 fma4(float4 a, float s, float4 c) {
  return make_float4(fmaf(a.x, s, c.x), fmaf(a.y, s, c.y), fmaf(a.z, s, c.z), fmaf(a.w, s, c.w));
}
__device__ inline float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// The thread's rows of a value head's state at S (global or shared memory); zeros when fresh.
template <class StateT>
__device__ inline void load_head_state(const StateT* S, bool fresh, int warp, int lane,
                                       float4 (&st)[kHeadRows]) {
#pragma unroll
  for (int r = 0; r < kHeadRows; ++r)
    st[r] = fresh ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                  : StateIo<StateT>::load4(S + ((warp + kHeadWarps * r) * 32 + lane) * 4);
}

// Conv + SiLU of key head kh's q and k channels and its value heads' v channels into ys, thread
// `tid` of `stride` taking every stride-th channel; the conv state becomes the last K - 1 inputs.
// (Each channel, and so its conv state, belongs to the one block that convolves its key head.)
__device__ inline void convolve_key_head(const GdnDecodeArgs& p, size_t slot, int t, int kh,
                                         bool fresh, float* ys, int tid, int stride) {
  const int g = p.nv / p.nk, key_dim = p.nk * kDk, C = 2 * key_dim + p.nv * kDv;
  const int n_ch = 2 * kDk + g * kDv;
  for (int i = tid; i < n_ch; i += stride) {
    const int c = i < kDk       ? kh * kDk + i
                  : i < 2 * kDk ? key_dim + kh * kDk + (i - kDk)
                                : 2 * key_dim + kh * g * kDv + (i - 2 * kDk);
    const ConvWindow w = read_conv_window(p, slot, C, t, c, fresh);
    ys[i] = conv_silu(p, c, w);
    write_conv_state(p, slot, C, c, w);
  }
}

// Shared memory a head's pass reduces its columns' sums through.
struct HeadScratch {
  float4 m[kHeadWarps][32], o[kHeadWarps][32];
};

// The delta rule of value head h (gate index gi = token * nv + h) on the thread's state rows st,
// the new state stored to S (global memory), and the gated RMSNorm of its output row (warp 0).
// ys holds the key head's normalised q | k, v the head's values, qk = q . k; nw the thread's
// four norm weights. `sync` is a barrier of the head's kHeadThreads threads; sh is free again
// when this returns.
template <class StateT, class Sync>
__device__ inline void delta_rule_head(const GdnDecodeArgs& p, const float4 (&st)[kHeadRows],
                                       const float* ys, const float* v, float qk, size_t gi, int h,
                                       StateT* S, const float (&nw)[4], HeadScratch& sh,
                                       Sync sync) {
  const int lane = static_cast<int>(threadIdx.x) % 32,
            warp = (static_cast<int>(threadIdx.x) / 32) % kHeadWarps;
  float beta, alpha;
  decode_gates(load_gate_inputs(p, gi, h), beta, alpha);
  // One pass over the state: m = S^T k and S^T q; with S' = alpha S + k delta^T,
  // delta = beta (v - alpha S^T k) and o = S'^T q = alpha S^T q + delta (k . q).
  float4 m = make_float4(0.0f, 0.0f, 0.0f, 0.0f), o = m;
#pragma unroll
  for (int r = 0; r < kHeadRows; ++r) {
    const int i = warp + kHeadWarps * r;
    m = fma4(st[r], ys[kDk + i], m);
    o = fma4(st[r], ys[i], o);
  }
  sh.m[warp][lane] = m;
  sh.o[warp][lane] = o;
  sync();
  m = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  o = m;
#pragma unroll
  for (int w = 0; w < kHeadWarps; ++w) {
    m = add4(m, sh.m[w][lane]);
    if (warp == 0) o = add4(o, sh.o[w][lane]);
  }
  const float* vl = v + 4 * lane;
  const float4 delta = make_float4(beta * (vl[0] - alpha * m.x), beta * (vl[1] - alpha * m.y),
                                   beta * (vl[2] - alpha * m.z), beta * (vl[3] - alpha * m.w));
#pragma unroll
  for (int r = 0; r < kHeadRows; ++r) {
    const int i = warp + kHeadWarps * r;
    const float kv = ys[kDk + i];
    const float4 s = st[r];
    StateIo<StateT>::store4(
        S + (i * 32 + lane) * 4,
        make_float4(fmaf(kv, delta.x, alpha * s.x), fmaf(kv, delta.y, alpha * s.y),
                    fmaf(kv, delta.z, alpha * s.z), fmaf(kv, delta.w, alpha * s.w)));
  }
  if (warp == 0) {  // o rounded as the unfused rule stores it, then the gated RMSNorm
    const float ov[4] = {
        round_bf16(fmaf(alpha, o.x, delta.x * qk)), round_bf16(fmaf(alpha, o.y, delta.y * qk)),
        round_bf16(fmaf(alpha, o.z, delta.z * qk)), round_bf16(fmaf(alpha, o.w, delta.w * qk))};
    const float ss = warp_sum(ov[0] * ov[0] + ov[1] * ov[1] + ov[2] * ov[2] + ov[3] * ov[3]);
    const float inv = rsqrtf(ss / static_cast<float>(kDv) + p.eps);
    const size_t at = gi * kDv + 4 * lane;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      p.out[at + e] = __float2bfloat16(ov[e] * inv * nw[e] * silu(__bfloat162float(p.z[at + e])));
  }
  sync();  // sh is rewritten by the next head
}

}  // namespace deltaserve::cuda::gdn_decode
