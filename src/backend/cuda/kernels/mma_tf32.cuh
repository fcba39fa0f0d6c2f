// Warp-level tf32 tensor-core products of f32 matrices in shared memory for sm_80+: mma.sync
// m16n8k8 (tf32 operands rounded to nearest, f32 accumulate) — for small products that need more
// than bf16's 8 mantissa bits (the blocks of a triangular inverse).
//
// Fragment layouts (g = lane / 4, c = lane % 4): an A tile (16 x 8) is four f32 as tf32, (row g,
// col c), (row g+8, col c), (row g, col c+4), (row g+8, col c+4); a B tile (8 x 8) two, (row c,
// col g), (row c+4, col g); the accumulator (16 x 8) as in mma_bf16.cuh.
#pragma once

#include <cstdint>

namespace deltaserve::cuda::mma {

__device__ inline uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// d += a . b (one 16 x 8 x 8 product).
__device__ inline void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc (two 16 x 8 tiles: a 16 x 16 block) += A . B for a 16 x K block of A at `a` and a K x 16
// block of B at `b`, both f32 row-major (leading dimensions lda, ldb, in elements).
template <int K>
__device__ inline void tile_16x16_tf32(float (&acc)[2][4], const float* a, int lda, const float* b,
                                       int ldb) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 8) {
    const uint32_t af[4] = {to_tf32(a[g * lda + k0 + c]), to_tf32(a[(g + 8) * lda + k0 + c]),
                            to_tf32(a[g * lda + k0 + c + 4]),
                            to_tf32(a[(g + 8) * lda + k0 + c + 4])};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
      mma_tf32(acc[nt], af, to_tf32(b[(k0 + c) * ldb + 8 * nt + g]),
               to_tf32(b[(k0 + c + 4) * ldb + 8 * nt + g]));
  }
}

// The 16 x 16 block `acc` (as tile_16x16_tf32 leaves it) times `scale` into f32 row-major `d`.
__device__ inline void store_16x16(float* d, int ldd, const float (&acc)[2][4], float scale) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float* row = d + (g + 8 * hf) * ldd + 8 * nt + 2 * c;
      row[0] = scale * acc[nt][2 * hf];
      row[1] = scale * acc[nt][2 * hf + 1];
    }
}

}  // namespace deltaserve::cuda::mma
