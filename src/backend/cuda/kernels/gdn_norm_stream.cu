// The gated RMSNorm of a single sequence's GDN output, streamed behind the state pass: launched as
// the pass's programmatic dependent, so that its blocks start beside the pass's (which let it once
// they all run), each (chunk, value head) is normed as soon as ws.chunk_done counts every pass
// block of it done, instead of in a kernel of its own after the pass. The same bits as the norm
// kernel (gated_rms_norm_row.cuh).
#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/gated_rms_norm_row.cuh"
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
// A row of kDim values on kLanes lanes; a block takes a chunk's rows in kPasses passes.
constexpr int kThreads = 256, kLanes = kDim / 8, kRowsPerPass = kThreads / kLanes,
              kPasses = kChunk / kRowsPerPass;

// Spins (sleeping between reads) until *count >= target; acquire: the writes its raisers made
// visible before raising it are visible to this thread after.
__device__ inline void wait_for_count(const int* count, int target) {
  for (;;) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(count) : "memory");
    if (v >= target) return;
    __nanosleep(256);
  }
}

// Items (chunk, value head) in chunk order, item i's counter ws.chunk_done[i]: the pass's chunk
// order. Rows past the sequence repeat its last row (every lane joins the shuffles) and store
// nothing.
__global__ void __launch_bounds__(kThreads)
    streamed_norm_kernel(BatchMeta b, GatedNorm norm, Workspace ws, int parts, int items,
                         bf16* __restrict__ out) {
  const int lane = static_cast<int>(threadIdx.x) % kLanes, r0 = threadIdx.x / kLanes;
  const int base = b.seq_begin[0], len = b.seq_len[0], nv = ws.nv;
  const F32x8 w = load_f32x8(norm.w + 8 * lane);
  for (int i = blockIdx.x; i < items; i += gridDim.x) {
    const int c = i / nv, h = i % nv, n = min(kChunk, len - c * kChunk);
    if (threadIdx.x == 0) wait_for_count(ws.chunk_done + i, parts);
    __syncthreads();  // thread 0's acquire orders the block's reads after the pass's stores
    F32x8 o[kPasses], z[kPasses];
    size_t at[kPasses];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int r = min(r0 + p * kRowsPerPass, n - 1);
      at[p] = (static_cast<size_t>(base + c * kChunk + r) * nv + h) * kDim + 8 * lane;
      // Written by the pass while this kernel runs: read from L2, not through L1.
      o[p] = unpack_bf16x8(__ldcg(reinterpret_cast<const uint4*>(out + at[p])));
      z[p] = load_bf16x8(norm.z + at[p]);
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const F32x8 y = gated_norm_lane<kLanes>(o[p], z[p], w, norm.eps);
      if (r0 + p * kRowsPerPass < n) store_bf16x8(out + at[p], y);
    }
  }
  // The pass complete before this grid is: a later kernel's wait for this one orders the pass too.
  pdl::wait_for_predecessor();
}

}  // namespace

bool streamed_norm_fits(const BatchMeta& b, const GatedNorm& norm, const GdnShape& s,
                        const __nv_bfloat16* out) {
  return b.num_seqs == 1 && norm.z != nullptr && s.dv == kDim &&
         b.num_tokens - norm.first_row == b.max_seq_len && aligned16(out, norm.z, norm.w);
}

void launch_streamed_norm(const BatchMeta& b, const Workspace& ws, const GatedNorm& norm, int parts,
                          int num_sms, __nv_bfloat16* out, cudaStream_t stream) {
  const int items = (b.max_seq_len + kChunk - 1) / kChunk * ws.nv;
  pdl::launch_dependent(streamed_norm_kernel, dim3(std::min(items, num_sms)), dim3(kThreads), 0,
                        stream, b, norm, ws, parts, items, out);
}

}  // namespace deltaserve::cuda::gdn_chunk
