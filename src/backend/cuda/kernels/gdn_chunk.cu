// The chunked (chunk 64) gated delta rule of prefill steps: gdn_chunk_prep.cu prepares every chunk
// in parallel (the WY form); a state pass walks each sequence's chunks in order — for few
// sequences gdn_chunk_scan.cu over 32-column slices (the states only) with gdn_chunk_out.cu
// forming every chunk's output in parallel after it, for enough sequences to fill the GPU
// gdn_chunk_pass.cu, a block a head, forming the outputs itself.
#include "backend/cuda/kernels/gated_rms_norm.cuh"
#include "backend/cuda/kernels/gdn_chunk.cuh"
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/gdn_conv4.cuh"
#include "backend/gdn_workspace.h"

namespace deltaserve::cuda {

bool gdn_chunked_supported(const GdnShape& s) {
  return s.dk == gdn_chunk::kDim && s.dv == gdn_chunk::kDim && s.nk > 0 && s.nv % s.nk == 0;
}

bool gdn_chunked_conv_supported(const GdnShape& s, int conv_kernel, const GdnQkvSource& in) {
  return gdn_chunked_supported(s) && conv_kernel == kConvK &&
         aligned16(in.u, in.conv_w, in.conv_state);
}

void launch_gdn_chunked(const BatchMeta& b, const GdnQkvSource& in, const __nv_bfloat16* a,
                        const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                        GdnState state, const GdnShape& s, const GatedNorm& norm, float* ws,
                        int num_sms, __nv_bfloat16* out, cudaStream_t stream) {
  const gdn_chunk::Workspace w(ws, b.num_tokens, s);
  gdn_chunk::launch_prep(b, in, a, bgate, A_log, dt_bias, s, w, stream);
  if (const int split = gdn_chunk::head_pass_split(b.num_seqs, s, num_sms); split > 0) {
    gdn_chunk::launch_head_pass(b, w, state, s, split, out, stream);
    if (norm.z != nullptr) {
      const size_t at = static_cast<size_t>(norm.first_row) * s.nv * s.dv;
      launch_gated_rms_norm_bf16(out + at, norm.z + at, norm.w, norm.eps,
                                 (b.num_tokens - norm.first_row) * s.nv, s.dv, stream);
    }
  } else {
    gdn_chunk::launch_slice_pass(b, w, state, s, stream);
    gdn_chunk::launch_out(b, w, s, norm, out, stream);
  }
}

size_t gdn_chunk_workspace_floats(int num_tokens, const GdnShape& s) {
  constexpr size_t kRegions = 7, kAlign = 16;  // Workspace's regions, each 16-byte aligned
  const size_t bytes =
      static_cast<size_t>(num_tokens) * s.nv * backend::gdn_chunk_bytes_per_token(s.dk, s.dv) +
      static_cast<size_t>(gdn_chunk::kStatePassRoom) * s.dk * s.dv * 2 + kRegions * kAlign;
  return (bytes + sizeof(float) - 1) / sizeof(float);
}

}  // namespace deltaserve::cuda
