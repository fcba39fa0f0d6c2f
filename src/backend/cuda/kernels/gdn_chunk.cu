// The chunked (chunk 64) gated delta rule of prefill steps: gdn_chunk_prep.cu prepares every chunk
// in parallel (the WY form); the state pass (gdn_chunk_pass.cu) walks each sequence's chunks in
// order, forming their outputs as it goes — or, for steps of enough sequences from the conv
// outputs, gdn_chunk_fused.cu does both in one kernel; the gated RMSNorm of the output follows.
#include "backend/cuda/kernels/gated_rms_norm.cuh"
#include "backend/cuda/kernels/gdn.cuh"
#include "backend/cuda/kernels/gdn_chunk.cuh"
#include "backend/cuda/kernels/gdn_chunk_fused.h"
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/gdn_conv4.cuh"
#include "backend/gdn_workspace.h"

namespace deltaserve::cuda {

bool gdn_chunked_supported(const GdnShape& s) {
  return s.dk == gdn_chunk::kDim && s.dv == gdn_chunk::kDim && s.nk > 0 && s.nv % s.nk == 0;
}

bool gdn_chunked_fuses_after_conv(const BatchMeta& b, const GdnShape& s, int num_sms) {
  return gdn_chunked_supported(s) && gdn_chunk::fused_pays_after_conv(b, s, num_sms);
}

bool gdn_chunked_conv_supported(const GdnShape& s, int conv_kernel, const GdnQkvSource& in) {
  return gdn_chunked_supported(s) && conv_kernel == kConvK &&
         aligned16(in.u, in.conv_w, in.conv_state);
}

cudaError_t launch_gdn_chunked(const BatchMeta& b, const GdnQkvSource& in, const __nv_bfloat16* a,
                               const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                               GdnState state, const GdnShape& s, const GatedNorm& norm, float* ws,
                               int num_sms, __nv_bfloat16* out, cudaStream_t stream,
                               const ConvStateUpdate* conv) {
  if (conv != nullptr && in.y != nullptr) return cudaErrorInvalidValue;  // the conv is in the prep
  if (in.y != nullptr && gdn_chunk::fused_pays(b, s, num_sms)) {
    gdn_chunk::launch_fused(b, in, a, bgate, A_log, dt_bias, state, s, out, stream);
  } else {
    const gdn_chunk::Workspace w(ws, b.num_tokens, s);
    gdn_chunk::launch_prep(b, in, a, bgate, A_log, dt_bias, s, w, num_sms, stream);
    if (conv != nullptr) {
      if (const cudaError_t e = cudaEventRecord(conv->fork, stream); e != cudaSuccess) return e;
      if (const cudaError_t e = cudaStreamWaitEvent(conv->aux, conv->fork); e != cudaSuccess)
        return e;
      launch_gdn_conv_state(b, conv->u, conv->conv_state, conv->C, conv->K, conv->aux);
      if (const cudaError_t e = cudaEventRecord(conv->join, conv->aux); e != cudaSuccess) return e;
    }
    gdn_chunk::launch_state_pass(b, w, state, s, num_sms, out, stream);
  }
  if (norm.z != nullptr) {
    const size_t at = static_cast<size_t>(norm.first_row) * s.nv * s.dv;
    launch_gated_rms_norm_bf16(out + at, norm.z + at, norm.w, norm.eps,
                               (b.num_tokens - norm.first_row) * s.nv, s.dv, stream);
  }
  return conv != nullptr ? cudaStreamWaitEvent(stream, conv->join) : cudaSuccess;
}

size_t gdn_chunk_workspace_floats(int num_tokens, const GdnShape& s) {
  constexpr size_t kRegions = 6, kAlign = 16;  // Workspace's regions, each 16-byte aligned
  const size_t bytes =
      static_cast<size_t>(num_tokens) * s.nv * backend::gdn_chunk_bytes_per_token(s.dk, s.dv) +
      kRegions * kAlign;
  return (bytes + sizeof(float) - 1) / sizeof(float);
}

}  // namespace deltaserve::cuda
