// Kernel 3 of the chunked delta rule for steps of few sequences: every chunk's output, all in
// parallel (block: sequence, chunk, value head), from what the slice pass (gdn_chunk_scan.cu) left
// in the workspace — the chunk-start state as S^T (bf16) and V' (over U):
//   O = e^gam (q S) + P V'
// on bf16 mma.sync with f32 accumulation; warp (row tile m, column half) owns 16 x 64 of O, stored
// through the gated RMSNorm (gdn_chunk_norm.cuh) when there is one. The operands come by the bulk
// tensor copy engine into 128-byte-swizzled tiles (72 KB: three blocks an SM), q and S^T on one
// barrier and P, V' on another, so q S starts while P and V' land; the norm's z tile lands over q
// once q S is done, on a third. Rows past a sequence's end are the next sequence's (or zeros past
// the step): P is zero above its diagonal, so they only reach output rows that are not stored.
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/gdn_chunk_norm.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/tma_map.h"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

// q [T][nk dk], the chunk-start states S^T [states nv dv][dk], V' [T][nv dv], P [T][nv 64], the
// norm's z [T][nv dv], in boxes of 64 columns.
struct OutMaps {
  CUtensorMap q, h, v, p, z;
};

struct OutSmem {            // SW128 tiles: 64-column blocks of the rows, one after the other
  bf16 q[kChunk * kDim];    // q [token][dk], then the norm's z [token][dv]
  bf16 s[kDim * kDim];      // S^T [dv][dk]
  bf16 v[kChunk * kDim];    // V' [token][dv]
  bf16 p[kChunk * kChunk];  // P [token][token]
};
constexpr int kSmem = sizeof(OutSmem) + wgmma::kAtomBytes;  // + alignment
static_assert(3 * (kSmem + sizeof(RowSums) + 1024) <= 227 * 1024, "three blocks an SM");

// One thread: q and S^T onto ready[0], V' and P onto ready[1].
__device__ void copy_operands(OutSmem& sm, const OutMaps& maps, int r0, int kh, int h,
                              int state_row, uint64_t* ready) {
  constexpr int kBox = kChunk * 64;  // elements of a 64-row box
  tma::arrive_expect_bytes(&ready[0], sizeof(sm.q) + sizeof(sm.s));
  for (int half = 0; half < 2; ++half) {
    tma::load_2d(sm.q + half * kBox, &maps.q, kh * kDim + 64 * half, r0, &ready[0]);
    tma::load_2d(sm.s + half * 2 * kBox, &maps.h, 64 * half, state_row, &ready[0]);
  }
  tma::arrive_expect_bytes(&ready[1], sizeof(sm.v) + sizeof(sm.p));
  for (int half = 0; half < 2; ++half)
    tma::load_2d(sm.v + half * kBox, &maps.v, h * kDim + 64 * half, r0, &ready[1]);
  tma::load_2d(sm.p, &maps.p, h * kChunk, r0, &ready[1]);
}

// One thread, once every warp is done with q: the norm's z tile over it, onto `ready`.
__device__ void copy_z(OutSmem& sm, const OutMaps& maps, int r0, int h, uint64_t* ready) {
  tma::arrive_expect_bytes(ready, sizeof(sm.q));
  for (int half = 0; half < 2; ++half)
    tma::load_2d(sm.q + half * kChunk * 64, &maps.z, h * kDim + 64 * half, r0, ready);
}

__global__ void __launch_bounds__(kThreads, 3)
    out_kernel(BatchMeta b, const __grid_constant__ OutMaps maps, Workspace ws, GdnShape s,
               GatedNorm norm, bf16* __restrict__ out) {
  extern __shared__ unsigned char out_raw[];
  OutSmem& sm = *wgmma::atom_aligned<OutSmem>(out_raw);
  __shared__ uint64_t ready[3];
  __shared__ RowSums sums;
  const int seq = blockIdx.x, c = blockIdx.y, h = blockIdx.z, len = b.seq_len[seq];
  if (c * kChunk >= len) return;
  const int r0 = b.seq_begin[seq] + c * kChunk, n = min(kChunk, len - c * kChunk);
  if (threadIdx.x == 0) {
    tma::barrier_init(&ready[0], 1);
    tma::barrier_init(&ready[1], 1);
    tma::barrier_init(&ready[2], 1);
    tma::barrier_init_fence();
    const int state = chunk_state_index(b.seq_begin[seq], seq, c);
    copy_operands(sm, maps, r0, h / (s.nv / s.nk), h, (state * s.nv + h) * kDim, ready);
  }
  __syncthreads();  // the barriers initialised
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, cl = lane % 4;
  const int m = warp % 4, half = warp / 4;
  float o[8][4] = {};
  tma::wait(&ready[0], 0);
  // q S, from S^T
  mma::tile_16x64_at<kDim, true>(o, Sw128Rows<kChunk>{sm.q}, 16 * m, Sw128Rows<kDim>{sm.s},
                                 64 * half);
  for (int hf = 0; hf < 2; ++hf) {
    const int i = min(16 * m + g + 8 * hf, n - 1);
    const float eg = __expf(ws.gam[static_cast<size_t>(h) * b.num_tokens + r0 + i]);
    for (int nt = 0; nt < 8; ++nt) {
      o[nt][2 * hf] *= eg;
      o[nt][2 * hf + 1] *= eg;
    }
  }
  if (norm.z != nullptr) {
    __syncthreads();  // q read by every warp
    if (threadIdx.x == 0) copy_z(sm, maps, r0, h, &ready[2]);
  }
  tma::wait(&ready[1], 0);
  mma::tile_16x64_at<kChunk>(o, Sw128Rows<kChunk>{sm.p}, 16 * m, Sw128Rows<kChunk>{sm.v},
                             64 * half);
  if (norm.z != nullptr) {
    half_row_sums(&o[0][0], m, half, sums);
    __syncthreads();  // both halves' sums
    tma::wait(&ready[2], 0);
    gated_norm(&o[0][0], m, half, sums, norm, [&](int hf, int nt) {
      return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
          Sw128Rows<kChunk>{sm.q}.at(16 * m + g + 8 * hf, 64 * half + 8 * nt + 2 * cl)));
    });
  }
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

void launch_out(const BatchMeta& b, const Workspace& ws, const GdnShape& s, const GatedNorm& norm,
                bf16* out, cudaStream_t stream) {
  const int chunks = (b.max_seq_len + kChunk - 1) / kChunk;
  const int64_t T = b.num_tokens, states = T / kChunk + b.num_seqs;
  const int64_t cols = static_cast<int64_t>(s.nv) * kDim;
  const OutMaps maps{
      encode_tma_2d_bf16(ws.q, T, static_cast<int64_t>(s.nk) * kDim, kChunk),
      encode_tma_2d_bf16(ws.h, states * s.nv * kDim, kDim, kDim),
      encode_tma_2d_bf16(ws.u, T, cols, kChunk),
      encode_tma_2d_bf16(ws.p, T, static_cast<int64_t>(s.nv) * kChunk, kChunk),
      norm.z != nullptr ? encode_tma_2d_bf16(norm.z, T, cols, kChunk) : CUtensorMap{}};
  cudaFuncSetAttribute(out_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  out_kernel<<<dim3(b.num_seqs, chunks, s.nv), kThreads, kSmem, stream>>>(b, maps, ws, s, norm,
                                                                          out);
}

}  // namespace deltaserve::cuda::gdn_chunk
