// Per-token pieces of the fused GDN decode layer (gdn_decode.cuh) that its two forms share: a
// channel's causal conv window and conv-state update, the conv + SiLU output, and a value head's
// gates. Included by the kernels' .cu files only.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn_decode.cuh"
#include "backend/cuda/kernels/gdn_gates.cuh"

namespace deltaserve::cuda::gdn_decode {

constexpr int kDk = 128, kDv = 128, kK = 4;  // the shape the kernels are written for

// Conv channel c of a token: its last kK inputs, oldest first (the conv state's kK - 1, zeros
// for a fresh sequence, then the token's own u).
struct ConvWindow {
  float x[kK];
  __nv_bfloat16 u;
};

__device__ inline __nv_bfloat16* conv_state_of(const GdnDecodeArgs& p, size_t slot, int C, int c) {
  return p.conv_state + (slot * C + c) * (kK - 1);
}

__device__ inline ConvWindow read_conv_window(const GdnDecodeArgs& p, size_t slot, int C, int t,
                                              int c, bool fresh) {
  ConvWindow w;
  const __nv_bfloat16* cs = conv_state_of(p, slot, C, c);
  w.u = p.u[static_cast<size_t>(t) * C + c];
#pragma unroll
  for (int k = 0; k < kK - 1; ++k) w.x[k] = fresh ? 0.0f : __bfloat162float(cs[k]);
  w.x[kK - 1] = __bfloat162float(w.u);
  return w;
}

// silu(conv) of the window, rounded to bf16 as the unfused conv stores it.
__device__ inline float conv_silu(const GdnDecodeArgs& p, int c, const ConvWindow& w) {
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < kK; ++k) acc += __bfloat162float(p.conv_w[c * kK + k]) * w.x[k];
  return round_bf16(silu_fast(acc));
}

// The conv state becomes the window's last kK - 1 inputs.
__device__ inline void write_conv_state(const GdnDecodeArgs& p, size_t slot, int C, int c,
                                        const ConvWindow& w) {
  __nv_bfloat16* cs = conv_state_of(p, slot, C, c);
#pragma unroll
  for (int k = 0; k < kK - 2; ++k) cs[k] = __float2bfloat16(w.x[k + 1]);
  cs[kK - 2] = w.u;
}

// What value head h's gates are computed from, at gate index gi (token * nv + h).
struct GateInputs {
  float b, a, A_log, dt_bias;
};
__device__ inline GateInputs load_gate_inputs(const GdnDecodeArgs& p, size_t gi, int h) {
  return {__bfloat162float(p.bgate[gi]), __bfloat162float(p.a[gi]), p.A_log[h], p.dt_bias[h]};
}

// beta = sigmoid(b) and the decay alpha = e^g, g = -e^A_log softplus(a + dt_bias).
__device__ inline void decode_gates(const GateInputs& in, float& beta, float& alpha) {
  beta = gate_beta(in.b);
  alpha = __expf(gate_log_decay(in.a, in.dt_bias, -__expf(in.A_log)));
}

// In place on the conv outputs ys = q [kDk] | k [kDk] | ... in shared memory: q scaled by
// |q|^-1 dk^-1/2, k by |k|^-1; returns q . k after the scaling. `norms` is 3 shared floats. Called
// by every thread of a block of at least 2 kDk threads, after ys is written.
__device__ inline float normalise_qk(float* ys, float* norms) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  if (tid < 64) {  // warp 0: |q|^2, warp 1: |k|^2
    float ss = 0.0f;
    for (int i = lane; i < kDk; i += 32) ss += ys[warp * kDk + i] * ys[warp * kDk + i];
    ss = warp_sum(ss);
    if (lane == 0)
      norms[warp] =
          warp == 0 ? rsqrtf(ss + 1e-6f) * rsqrtf(static_cast<float>(kDk)) : rsqrtf(ss + 1e-6f);
  }
  __syncthreads();
  if (tid < 2 * kDk) ys[tid] *= norms[tid / kDk];
  __syncthreads();
  if (tid < 32) {
    float qk = 0.0f;
    for (int i = lane; i < kDk; i += 32) qk += ys[i] * ys[kDk + i];
    qk = warp_sum(qk);
    if (lane == 0) norms[2] = qk;
  }
  __syncthreads();
  return norms[2];
}

}  // namespace deltaserve::cuda::gdn_decode
