// The workspace the kernels of the chunked delta rule share (gdn_chunk_prep.cu writes it, the state
// pass reads it), and their fixed shape: chunks of 64 tokens, head dims of 128.
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
struct Workspace {
  __nv_bfloat16 *w, *u, *kd, *q, *p;
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
  }
};

// Every chunk's W / U / kd / q / P / gam into ws (gdn_chunk_prep.cu); num_sms picks the block
// form.
void launch_prep(const BatchMeta& b, const GdnQkvSource& in, const __nv_bfloat16* a,
                 const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                 const GdnShape& s, const Workspace& ws, int num_sms, cudaStream_t stream);
// The state pass forming every output (gdn_chunk_pass.cu): a block a (sequence, value head) —
// or, where those blocks would leave most of the device's sm_count SMs idle (few sequences), a
// block a half or a quarter of a head's state columns, the most parts whose blocks all fit at
// once.
void launch_state_pass(const BatchMeta& b, const Workspace& ws, GdnState state, const GdnShape& s,
                       int sm_count, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deltaserve::cuda::gdn_chunk
