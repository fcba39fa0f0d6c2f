// Warp-level bf16 tensor-core building blocks for sm_80+: mma.sync m16n8k16 (f32 accumulate),
// ldmatrix loads of its operand fragments from shared memory, and cp.async copies.
//
// Fragment layouts (g = lane / 4, c = lane % 4): an A tile (16 x 16) is four registers of two bf16,
// (row g, cols 2c..2c+1), (row g+8, same), (row g, cols 8+2c..), (row g+8, cols 8+2c..); a B tile
// (16 x 8) two, (rows 2c..2c+1, col g), (rows 8+2c.., col g); an accumulator (16 x 8) four f32,
// (row g, cols 2c, 2c+1), (row g+8, cols 2c, 2c+1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels/smem_view.cuh"

namespace deltaserve::cuda::mma {

__device__ inline uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ inline void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

__device__ inline void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// Four 8 x 8 bf16 matrices to shared memory, transposed: r[j] holds matrix j in the accumulator
// pair layout (row g, columns 2c..2c+1); lane 8 j + i gives the address of stored row i of
// matrix j, which receives the matrix's column i (16 bytes).
__device__ inline void stsm_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                     uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// d += a . b (one 16 x 8 x 16 product).
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a . b for an A tile whose rows 8..15 are zero (a0: row g, cols 2c..2c+1; a2: row g,
// cols 8+2c..): only the accumulator's rows 0..7 (d[0..1]: row g, cols 2c, 2c+1) are kept. kF16:
// f16 operands (the decode attention over an fp8 KV cache, whose e4m3 values widen to f16 in one
// conversion) instead of bf16.
template <bool kF16 = false>
__device__ inline void mma_rows8(float (&d)[2], uint32_t a0, uint32_t a2, uint32_t b0,
                                 uint32_t b1) {
#define DS_MMA_ROWS8(T)                                \
  asm volatile(                                        \
      "{\n.reg .f32 unused0, unused1;\n"               \
      "mma.sync.aligned.m16n8k16.row.col.f32." T "." T \
      ".f32 {%0,%1,unused0,unused1}, "                 \
      "{%2,%4,%3,%4}, {%5,%6}, {%0,%1,%7,%7};\n}\n"    \
      : "+f"(d[0]), "+f"(d[1])                         \
      : "r"(a0), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(0.0f))
  if constexpr (kF16)
    DS_MMA_ROWS8("f16");
  else
    DS_MMA_ROWS8("bf16");
#undef DS_MMA_ROWS8
}

// Fragment loads from a shared-memory view (smem_view.cuh: element (r, c) at v.at(r, c)).
// The A tile (16 x 16) at rows r0.., columns k0.. of `a`.
template <class V>
__device__ inline void load_a_at(uint32_t (&r)[4], const V& a, int r0, int k0) {
  const int lane = threadIdx.x % 32;
  ldsm_x4(r, a.at(r0 + lane % 16, k0 + (lane / 16) * 8));
}
// The A tile X^T for X stored k-major in `x` (X[k][m] = x.at(k, m)): rows k0.., columns m0...
template <class V>
__device__ inline void load_a_trans_at(uint32_t (&r)[4], const V& x, int k0, int m0) {
  const int lane = threadIdx.x % 32;
  ldsm_x4_trans(r, x.at(k0 + lane % 8 + (lane / 16) * 8, m0 + ((lane / 8) % 2) * 8));
}
// Two B tiles (16 x 16: columns n0..n0+7 in r[0..1], n0+8.. in r[2..3]) of B stored k-major in
// `b` (B[k][n] = b.at(k, n)).
template <class V>
__device__ inline void load_b_at(uint32_t (&r)[4], const V& b, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  ldsm_x4_trans(r, b.at(k0 + lane % 8 + ((lane / 8) % 2) * 8, n0 + (lane / 16) * 8));
}
// Two B tiles of B = X^T for X stored n-major in `x` (X[n][k] = x.at(n, k)): e.g. K^T for Q K^T.
template <class V>
__device__ inline void load_b_trans_at(uint32_t (&r)[4], const V& x, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldsm_x4(r, x.at(n0 + lane % 8 + (lane / 16) * 8, k0 + ((lane / 8) % 2) * 8));
}

// load_b_at / load_b_trans_at at `m` / `x` (row-major, ld).
__device__ inline void load_b(uint32_t (&b)[4], const __nv_bfloat16* m, int ld) {
  load_b_at(b, PaddedRows{m, ld}, 0, 0);
}
__device__ inline void load_b_trans(uint32_t (&b)[4], const __nv_bfloat16* x, int ld) {
  load_b_trans_at(b, PaddedRows{x, ld}, 0, 0);
}

// acc (eight 16 x 8 tiles) += A . B for the 16 x K tile of A at rows r0.. of view `a` and the K x
// 64 tile of B at columns n0.. : k-major (B[k][n] = b.at(k, n)), or with kBT its transpose X = B^T
// n-major (X[n][k] = b.at(n, k): e.g. K for Q K^T, or S^T for q S). Views: smem_view.cuh.
template <int K, bool kBT = false, class A, class B>
__device__ inline void tile_16x64_at(float (&acc)[8][4], const A& a, int r0, const B& b, int n0) {
  for (int ks = 0; ks < K / 16; ++ks) {
    uint32_t af[4];
    load_a_at(af, a, r0, 16 * ks);
    for (int np = 0; np < 4; ++np) {
      uint32_t bf[4];
      if constexpr (kBT)
        load_b_trans_at(bf, b, n0 + 16 * np, 16 * ks);
      else
        load_b_at(bf, b, 16 * ks, n0 + 16 * np);
      mma(acc[2 * np], af, bf[0], bf[1]);
      mma(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// As tile_16x64_at for A at `a` (row-major, lda) and B at `b` (ldb).
template <int K, bool kBT = false>
__device__ inline void tile_16x64(float (&acc)[8][4], const __nv_bfloat16* a, int lda,
                                  const __nv_bfloat16* b, int ldb) {
  tile_16x64_at<K, kBT>(acc, PaddedRows{a, lda}, 0, PaddedRows{b, ldb}, 0);
}

__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// lo, hi as a pair of 16-bit MMA operands (lo in the low half): bf16, or (kF16) f16.
template <bool kF16>
__device__ inline uint32_t pack_16(float lo, float hi) {
  if constexpr (kF16) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    return pack_bf16(lo, hi);
  }
}

// A bf16 pair as an f16 pair (rounded to nearest).
__device__ inline uint32_t bf16x2_to_f16x2(uint32_t x) {
  const __half2 f =
      __float22half2_rn(__bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x)));
  return *reinterpret_cast<const uint32_t*>(&f);
}

// 16 bytes global -> shared, asynchronously; zeros when !valid.
__device__ inline void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ inline void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace deltaserve::cuda::mma
