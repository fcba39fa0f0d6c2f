// The workspace the kernels of the chunked delta rule share (gdn_chunk_prep.cu writes it, the state
// passes and gdn_chunk_out.cu read it), and their fixed shape: chunks of 64 tokens, head dims of
// 128.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels/batch_meta.cuh"
#include "backend/cuda/kernels/gdn.cuh"
#include "backend/cuda/kernels/gdn_chunk.cuh"

namespace deltaserve::cuda::gdn_chunk {

constexpr int kChunk = 64, kDim = 128;
constexpr int kLd = kDim + 8;     // shared rows of 128 bf16, padded: ldmatrix rows hit other banks
constexpr int kLdC = kChunk + 8;  // shared rows of 64 bf16, padded

// Per step, for T tokens (regions 16-byte aligned), bf16 unless said:
//   w  [T][nv][dk]  W = (I + L)^-1 diag(beta e^gam) K
//   u  [T][nv][dv]  U = (I + L)^-1 diag(beta) V
//   kd [T][nv][dk]  k_i e^(gam_last - gam_i): the chunk's contribution to the next state
//   q  [T][nk][dk]  q / |q| / sqrt(dk)
//   p  [T][nv][64]  P_ij = (q_i . k_j) e^(gam_i - gam_j), j <= i, within the chunk
//   gam [nv][T] f32 the cumulative log decay within the chunk
//   h  [T / 64 + number of sequences][nv][dv][dk]  the state before each chunk, transposed
//                            (S^T), written by the slice pass (gdn_chunk_scan.cu): chunk c of
//                            sequence i (first token row r) at chunk_state_index(r, i, c)
// The slice pass writes V' = U - W S over u.
// Room for chunk-start states past T / 64 of them, in head states (dk x dv): the slice pass serves
// steps whose sequences x value heads fit it.
constexpr int kStatePassRoom = 256;

// Where chunk c of sequence i, whose first token row is r, keeps its chunk-start state: its
// chunks' ranges [r / 64 + i, r / 64 + i + ceil(len / 64)) never overlap, and stay below
// T / 64 + number of sequences.
__host__ __device__ inline int chunk_state_index(int r, int i, int c) { return r / kChunk + i + c; }

struct Workspace {
  __nv_bfloat16 *w, *u, *kd, *q, *p, *h;
  float* gam;

  __host__ __device__ static size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }
  __host__ __device__ Workspace(void* base, int T, const GdnShape& s) {
    char* at = static_cast<char*>(base);
    auto take = [&](size_t elems, size_t size) {
      char* r = at;
      at += align16(elems * size);
      return r;
    };
    const size_t tv = static_cast<size_t>(T) * s.nv, tk = static_cast<size_t>(T) * s.nk;
    w = reinterpret_cast<__nv_bfloat16*>(take(tv * s.dk, 2));
    u = reinterpret_cast<__nv_bfloat16*>(take(tv * s.dv, 2));
    kd = reinterpret_cast<__nv_bfloat16*>(take(tv * s.dk, 2));
    q = reinterpret_cast<__nv_bfloat16*>(take(tk * s.dk, 2));
    p = reinterpret_cast<__nv_bfloat16*>(take(tv * kChunk, 2));
    gam = reinterpret_cast<float*>(take(tv, 4));
    h = reinterpret_cast<__nv_bfloat16*>(take(tv * s.dk * s.dv / kChunk, 2));  // + room after it
  }
};

void launch_prep(const BatchMeta& b, const GdnQkvSource& in, const __nv_bfloat16* a,
                 const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                 const GdnShape& s, const Workspace& ws, cudaStream_t stream);
// Whether a step takes the head pass, and in how many column parts a head (1: enough sequences x
// value heads to fill sm_count SMs with a block a head, or too many for the slice pass's room), or
// (0) the slice pass and launch_out.
int head_pass_split(int num_seqs, const GdnShape& s, int sm_count);
// The state pass forming every output, a block a head's `split` (1 or 2) column part
// (gdn_chunk_pass.cu).
void launch_head_pass(const BatchMeta& b, const Workspace& ws, GdnState state, const GdnShape& s,
                      int split, __nv_bfloat16* out, cudaStream_t stream);
// The state pass over 32-column slices (gdn_chunk_scan.cu): V', the chunk-start states and the
// final state.
void launch_slice_pass(const BatchMeta& b, const Workspace& ws, GdnState state, const GdnShape& s,
                       cudaStream_t stream);
// Every chunk's output from the chunk-start states and V' (gdn_chunk_out.cu), after the slice
// pass, normed by `norm`.
void launch_out(const BatchMeta& b, const Workspace& ws, const GdnShape& s, const GatedNorm& norm,
                __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda::gdn_chunk
