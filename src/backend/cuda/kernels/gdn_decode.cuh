// The fused GDN decode layer: for steps of one token per sequence, everything between the GDN
// input projections and out_proj in one kernel — the causal conv + SiLU with its conv-state update,
// the q / k L2 norms, beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), the delta rule with
// the recurrent state read and written once, and the gated RMSNorm. Same results as gdn_conv +
// the recurrent delta rule + gated_rms_norm up to f32 rounding order (the intermediate y and o
// are rounded to bf16 where the unfused ops store them).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/batch_meta.cuh"
#include "backend/cuda/kernels/gdn_state.cuh"

namespace deltaserve::cuda {

struct GdnDecodeArgs {
  const __nv_bfloat16* u;  // [T, C] the conv's inputs (q | k | v channels), C = 2 nk dk + nv dv
  const __nv_bfloat16* conv_w;     // [C, K]
  __nv_bfloat16* conv_state;       // [slots, C, K - 1], oldest first
  const __nv_bfloat16 *a, *bgate;  // [T, nv] raw gate projections
  const float *A_log, *dt_bias;    // [nv]
  const __nv_bfloat16* z;          // [T, nv * dv] the output gate
  const float* norm_w;             // [dv]
  float eps;
  int nk, nv;
  __nv_bfloat16* out;  // [T, nv, dv]
};

// The shapes the kernel supports: dk = dv = 128, K = 4, up to 4 value heads per key head.
bool gdn_decode_supported(int nk, int nv, int dk, int dv, int K);

// Precondition: one token per sequence (num_tokens == num_seqs), gdn_decode_supported; a
// sequence starting at 0 starts from zero states. No in-step snapshots (one token per sequence).
// num_sms, the device's multiprocessors, picks the form: while a grid of a block per (sequence,
// key head) fills at most an eighth of them (one sequence at the 4B shape), a cluster of blocks
// per key head, each a quarter of a value head's state columns (gdn_decode_split.cuh; up to 2
// value heads a key head; DS_GDN_DECODE_SPLIT=0 turns it off, for A/B timing); while it fills at
// most all of them, two value heads a block; else one.
void launch_gdn_decode(const BatchMeta& b, const GdnDecodeArgs& p, GdnState state, int num_sms,
                       cudaStream_t stream);

// Whether the kernels load a sequence's recurrent state before their wait for the kernel before
// them (a programmatic dependent), so that its DRAM round trip overlaps that kernel's tail
// (DS_GDN_EARLY_STATE=0: after the wait, A/B). Safe because within a step nothing before the
// layer's decode kernel writes a decode row's state: the previous step's kernel wrote it (and a
// step begins after the host has synced on the previous one's tokens), the snapshot restores are
// plain launches before the step's first kernel (so that kernel, and every one after it, starts
// only once they have completed), and the chunked prefill kernels of a mixed step write other
// sequences' slots. The batch description (BatchMeta) is uploaded before the step, like the
// positions the attention prep reads before its wait.
inline bool gdn_decode_early_state() {
  static const bool on = ab_switch_on("DS_GDN_EARLY_STATE");
  return on;
}

}  // namespace deltaserve::cuda
