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
// A row of kDim values on kLanes lanes, two rows a warp at once; a warp takes a (chunk, value head)
// item's rows in batches of kBatch row pairs, every load of a batch issued before the math.
constexpr int kThreads = 256, kWarps = kThreads / 32, kLanes = kDim / 8, kBatch = 8,
              kBatchRows = 2 * kBatch;
static_assert(kLanes == 16, "two rows a warp");

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

// Items (chunk, value head) in chunk order, item i's counter ws.chunk_done[i] (the pass's chunk
// order), a warp an item at a time: many in flight, so that the norm keeps up with the pass. Rows
// past the sequence repeat its last row (every lane joins the shuffles) and store nothing.
__global__ void __launch_bounds__(kThreads)
    streamed_norm_kernel(BatchMeta b, GatedNorm norm, Workspace ws, int parts, int items,
                         bf16* __restrict__ out) {
  const int lane = static_cast<int>(threadIdx.x) % 32, half = lane / kLanes, l = lane % kLanes;
  const int base = b.seq_begin[0], len = b.seq_len[0], nv = ws.nv;
  const F32x8 w = load_f32x8(norm.w + 8 * l);
  for (int i = blockIdx.x * kWarps + static_cast<int>(threadIdx.x) / 32; i < items;
       i += gridDim.x * kWarps) {
    const int c = i / nv, h = i % nv, n = min(kChunk, len - c * kChunk);
    if (lane == 0) wait_for_count(ws.chunk_done + i, parts);
    __syncwarp();  // lane 0's acquire orders the warp's reads after the pass's stores
    for (int r0 = 0; r0 < n; r0 += kBatchRows) {
      uint4 o[kBatch], z[kBatch];
      size_t at[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int r = min(r0 + 2 * j + half, n - 1);
        at[j] = (static_cast<size_t>(base + c * kChunk + r) * nv + h) * kDim + 8 * l;
        // Written by the pass while this kernel runs: read from L2, not through L1.
        o[j] = __ldcg(reinterpret_cast<const uint4*>(out + at[j]));
        z[j] = *reinterpret_cast<const uint4*>(norm.z + at[j]);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const F32x8 y =
            gated_norm_lane<kLanes>(unpack_bf16x8(o[j]), unpack_bf16x8(z[j]), w, norm.eps);
        if (r0 + 2 * j + half < n) store_bf16x8(out + at[j], y);
      }
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
  const int blocks = std::min((items + kWarps - 1) / kWarps, num_sms);
  pdl::launch_dependent(streamed_norm_kernel, dim3(blocks), dim3(kThreads), 0, stream, b, norm, ws,
                        parts, items, out);
}

}  // namespace deltaserve::cuda::gdn_chunk
