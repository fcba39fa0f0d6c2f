// Kernel 3 of the chunked delta rule for steps of few sequences: every chunk's output, all in
// parallel (block: sequence, chunk, value head), from what the slice pass (gdn_chunk_scan.cu) left
// in the workspace — the chunk-start state as S^T (bf16) and V' (over U):
//   O = e^gam (q S) + P V'
// on bf16 mma.sync with f32 accumulation; warp (row tile m, column half) owns 16 x 64 of O.
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

struct OutSmem {
  bf16 q[kChunk][kLd], s[kDim][kLd], v[kChunk][kLd];  // s: S^T [dv][dk]
  bf16 p[kChunk][kLdC];
  float gam[kChunk];
};

// The chunk's n rows from token row r0 of value head h, with its chunk-start state H, into shared
// memory as one cp.async group (rows past n zero: P V' must not meet stale workspace values).
__device__ void stage(OutSmem& sm, int r0, int n, int h, int kh, const bf16* H, const Workspace& ws,
                      const GdnShape& s, int T) {
  for (int e = threadIdx.x; e < (2 * kChunk + kDim) * 16; e += kThreads) {
    const int r = e / 16, c16 = e % 16, t = r0 + (r % kChunk < n ? r % kChunk : 0);
    if (r < kChunk)
      mma::cp_async16(sm.q[r] + 8 * c16,
                      ws.q + (static_cast<size_t>(t) * s.nk + kh) * kDim + 8 * c16, r < n);
    else if (r < 2 * kChunk)
      mma::cp_async16(sm.v[r - kChunk] + 8 * c16,
                      ws.u + (static_cast<size_t>(t) * s.nv + h) * kDim + 8 * c16, r - kChunk < n);
    else
      mma::cp_async16(sm.s[r - 2 * kChunk] + 8 * c16, H + (r - 2 * kChunk) * kDim + 8 * c16, true);
  }
  for (int e = threadIdx.x; e < kChunk * 8; e += kThreads) {
    const int r = e / 8, c8 = e % 8, t = r0 + (r < n ? r : 0);
    mma::cp_async16(sm.p[r] + 8 * c8, ws.p + (static_cast<size_t>(t) * s.nv + h) * kChunk + 8 * c8,
                    r < n);
  }
  if (threadIdx.x < kChunk)
    mma::cp_async4(&sm.gam[threadIdx.x],
                   ws.gam + static_cast<size_t>(h) * T + r0 + (threadIdx.x < n ? threadIdx.x : 0),
                   threadIdx.x < n);
  mma::cp_async_commit();
}

__global__ void __launch_bounds__(kThreads, 2)
    out_kernel(BatchMeta b, Workspace ws, GdnShape s, bf16* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char out_raw[];
  OutSmem& sm = *reinterpret_cast<OutSmem*>(out_raw);
  const int seq = blockIdx.x, c = blockIdx.y, h = blockIdx.z, len = b.seq_len[seq];
  if (c * kChunk >= len) return;
  const int r0 = b.seq_begin[seq] + c * kChunk, n = min(kChunk, len - c * kChunk);
  const size_t head = static_cast<size_t>(kDim) * kDim;
  const bf16* H =
      ws.h + (static_cast<size_t>(chunk_state_index(b.seq_begin[seq], seq, c)) * s.nv + h) * head;
  stage(sm, r0, n, h, h / (s.nv / s.nk), H, ws, s, b.num_tokens);
  mma::cp_async_wait<0>();
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, cl = lane % 4;
  const int m = warp % 4, half = warp / 4;
  float o[8][4] = {};
  mma::tile_16x64<kDim, true>(o, sm.q[16 * m], kLd, sm.s[64 * half], kLd);  // q S, from S^T
  for (int hf = 0; hf < 2; ++hf) {
    const float eg = __expf(sm.gam[16 * m + g + 8 * hf]);
    for (int nt = 0; nt < 8; ++nt) {
      o[nt][2 * hf] *= eg;
      o[nt][2 * hf + 1] *= eg;
    }
  }
  mma::tile_16x64<kChunk>(o, sm.p[16 * m], kLdC, sm.v[0] + 64 * half, kLd);
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * m + g + 8 * hf;
    if (i >= n) continue;
    bf16* row = out + (static_cast<size_t>(r0 + i) * s.nv + h) * kDim + 64 * half;
    for (int nt = 0; nt < 8; ++nt)
      *reinterpret_cast<__nv_bfloat162*>(row + 8 * nt + 2 * cl) =
          __floats2bfloat162_rn(o[nt][2 * hf], o[nt][2 * hf + 1]);
  }
}

}  // namespace

void launch_out(const BatchMeta& b, const Workspace& ws, const GdnShape& s, bf16* out,
                cudaStream_t stream) {
  const int chunks = (b.max_seq_len + kChunk - 1) / kChunk;
  constexpr int smem = sizeof(OutSmem);
  cudaFuncSetAttribute(out_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  out_kernel<<<dim3(b.num_seqs, chunks, s.nv), kThreads, smem, stream>>>(b, ws, s, out);
}

}  // namespace deltaserve::cuda::gdn_chunk
