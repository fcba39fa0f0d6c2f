// The gated RMSNorm of the GDN state pass's output (HF's Qwen3NextRMSNormGated over a value
// head's 128 values), applied as the pass stores each chunk's output rows (gdn_chunk_pass.cu):
//   y = o * rsqrt(mean(o^2) + eps) * w * silu(z)
// with o rounded to bf16 first, the value the unfused path stores and gated_rms_norm reads. A
// head's columns are split into parts — two warpgroups of one block, or the blocks of a
// thread-block cluster — whose row sums of squares meet in shared memory: each part stores its
// sums into every part's copy (a cluster's through distributed shared memory), slots alternating
// by chunk, so that one barrier a chunk orders them (a part can only be one chunk ahead of
// another when it writes).
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/kernels/bf16x8.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn_chunk.cuh"
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/tma.cuh"

namespace deltaserve::cuda::gdn_chunk {

constexpr int kMaxNormParts = 4;

struct PassNormSums {
  float ss[2][kMaxNormParts][kChunk];  // chunk parity, column part, row
};

// A warpgroup's share of one chunk's output: kCols columns from col0 of 64 rows, in the m64 x kCols
// accumulator layout (thread: rows 16 warp + lane / 4 (+ 8), per 8-column block columns
// 2 (lane % 4) (+ 1)).
template <int kCols>
struct PassNorm {
  static constexpr int kPairs = kCols / 8;
  __nv_bfloat162 z[2][kPairs];  // the output gate at the thread's values (bf16: registers)

  __device__ static int row(int hf) {
    return 16 * (static_cast<int>(threadIdx.x) / 32 % 4) + static_cast<int>(threadIdx.x) % 32 / 4 +
           8 * hf;
  }

  // The gate of rows [0, n) of the chunk whose first row of z is z_rows (head h's columns of each
  // token row at z_rows + token * stride); early, so that the loads land under the chunk's MMAs.
  __device__ void load_z(const __nv_bfloat16* z_rows, size_t stride, int n, int col0) {
    const int c = static_cast<int>(threadIdx.x) % 4;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int nt = 0; nt < kPairs; ++nt)
        z[hf][nt] = row(hf) < n ? *reinterpret_cast<const __nv_bfloat162*>(
                                      z_rows + row(hf) * stride + col0 + 8 * nt + 2 * c)
                                : __floats2bfloat162_rn(0.0f, 0.0f);
  }

  // Rounds o to bf16; returns the sum of squares of the thread's row hf over the warpgroup's
  // columns (complete in the quad's first lane).
  __device__ static float row_sum(float* o, int hf) {
    float ss = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kPairs; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = o[4 * nt + 2 * hf + e];
        v = round_bf16(v);
        ss += v * v;
      }
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    return ss;
  }

  // Part `part` of `parts`: the row sums into every part's slots of this chunk's parity, in this
  // block's shared memory (parts in one block) or in each cluster rank's (a part a block).
  __device__ static void publish(float* o, PassNormSums& sums, int parity, int part, int parts,
                                 bool cluster) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float ss = row_sum(o, hf);
      if (threadIdx.x % 4 != 0) continue;
      float* slot = &sums.ss[parity][part][row(hf)];
      if (!cluster) {
        *slot = ss;
        continue;
      }
      for (int r = 0; r < parts; ++r) tma::store_f32_to_cta(slot, ss, static_cast<uint32_t>(r));
    }
  }

  // o normed and gated, once every part's sums of this parity have landed.
  __device__ void apply(float* o, const PassNormSums& sums, int parity, int parts,
                        const GatedNorm& norm, int col0) const {
    const int c = static_cast<int>(threadIdx.x) % 4;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float total = 0.0f;
      for (int p = 0; p < parts; ++p) total += sums.ss[parity][p][row(hf)];
      const float inv = rsqrtf(total / kDim + norm.eps);
#pragma unroll
      for (int nt = 0; nt < kPairs; ++nt) {
        const float2 w = __ldg(reinterpret_cast<const float2*>(norm.w + col0 + 8 * nt + 2 * c));
        const float2 zf = __bfloat1622float2(z[hf][nt]);
        float* v = &o[4 * nt + 2 * hf];
        v[0] = v[0] * inv * w.x * silu(zf.x);  // gated_rms_norm's order of products
        v[1] = v[1] * inv * w.y * silu(zf.y);
      }
    }
  }
};

}  // namespace deltaserve::cuda::gdn_chunk
