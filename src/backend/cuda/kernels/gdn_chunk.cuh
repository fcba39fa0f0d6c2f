// The chunked gated delta rule of prefill steps (gdn_chunk.cu), run by launch_gated_delta_rule.
#pragma once

#include "backend/cuda/kernels/gdn.cuh"

namespace deltaserve::cuda {

// Whether the chunked form handles these head shapes (else the token recurrence runs).
bool gdn_chunked_supported(const GdnShape& s);

// Where the chunked form takes q | k | v from: the conv outputs y [T, C] (launch_gdn_conv's), or,
// with y null, the pre-conv inputs u [T, C], the conv (width 4) + SiLU done on the way in with the
// taps conv_w [C, 4] and, before a continued sequence's first step token, its conv_state
// [slots, C, 3] (read, not updated: launch_gdn_conv_state runs after).
struct GdnQkvSource {
  const __nv_bfloat16 *y, *u, *conv_w, *conv_state;
};

// Whether a mixer step whose q | k | v come from the conv inputs u had better run the conv kernel
// into y and then launch_gdn_chunked from y, which takes the fused kernel (gdn_chunk_fused.cu:
// prep and state pass in one, for steps of enough sequences; it does not convolve), than
// launch_gdn_chunked with the conv on the way in.
bool gdn_chunked_fuses_after_conv(const BatchMeta& b, const GdnShape& s, int num_sms);

// Whether the chunked form can take q | k | v as `in` says with the conv (width conv_kernel) on
// the way in: width 4, 16-byte aligned u, conv_w, conv_state (and the shapes it handles).
bool gdn_chunked_conv_supported(const GdnShape& s, int conv_kernel, const GdnQkvSource& in);

// The gated RMSNorm of the output: out = o * rsqrt(mean(o^2) + eps) * w * silu(z) per value head,
// z [T, nv dv] bf16 (rows as the output's), w [dv] f32, over the rows from first_row on (the
// batch's sequences' rows: a mixed step's leading decode rows are not theirs), by the
// gated_rms_norm kernel after the state pass. A null z: no norm.
struct GatedNorm {
  const __nv_bfloat16* z;
  const float* w;
  float eps;
  int first_row;
};

// The conv-state update (launch_gdn_conv_state) of a step whose conv runs inside the prep: it
// waits only for the prep (the old state's last reader), so it runs on `aux` beside the state pass
// and the gated norm (events `fork` / `join`, the caller's), and the stream waits for it after
// them (before anything can overwrite u).
struct ConvStateUpdate {
  const __nv_bfloat16* u;
  __nv_bfloat16* conv_state;
  int C, K;
  cudaStream_t aux;
  cudaEvent_t fork, join;
};

// As launch_gated_delta_rule, for a step with a prefill, the output normed by `norm`; `ws` holds
// gdn_chunk_workspace_floats(b.num_tokens, s) floats. With `conv` (only where in.y is null: the
// conv inside the prep), also that update. Returns cudaErrorInvalidValue for a `conv` with y, else
// the first failure of the fork / join (the kernels' launch errors are left to cudaGetLastError,
// as elsewhere).
cudaError_t launch_gdn_chunked(const BatchMeta& b, const GdnQkvSource& in, const __nv_bfloat16* a,
                               const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                               GdnState state, const GdnShape& s, const GatedNorm& norm, float* ws,
                               int num_sms, __nv_bfloat16* out, cudaStream_t stream,
                               const ConvStateUpdate* conv = nullptr);

}  // namespace deltaserve::cuda
