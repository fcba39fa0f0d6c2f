// The GDN layer's gates, as every kernel that forms them computes them: per token beta =
// sigmoid(b) and the log decay g = -e^A_log softplus(a + dt_bias) (the decay alpha = e^g), and
// within a chunk the cumulative log decay.
#pragma once

namespace deltaserve::cuda {

__device__ inline float gate_beta(float b) { return 1.0f / (1.0f + __expf(-b)); }

// neg_A = -e^A_log, the value head's (formed once where a kernel takes many tokens).
__device__ inline float gate_log_decay(float a, float dt_bias, float neg_A) {
  const float xa = a + dt_bias;
  return neg_A * (xa > 20.0f ? xa : log1pf(__expf(xa)));
}

// The inclusive scan of a chunk's log decays across a warp, lane l holding rows 2 l and 2 l + 1
// (g0, g1): the cumulative log decay through row 2 l + 1 (through row 2 l: the result - g1).
__device__ inline float scan_row_pairs(float g0, float g1) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float run = g0 + g1;
  for (int o = 1; o < 32; o <<= 1) {
    const float up = __shfl_up_sync(0xffffffffu, run, o);
    if (lane >= o) run += up;
  }
  return run;
}

}  // namespace deltaserve::cuda
