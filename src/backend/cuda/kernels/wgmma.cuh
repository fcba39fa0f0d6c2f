// Hopper warpgroup tensor-core building blocks (sm_90a): shared-memory matrix descriptors for the
// 128-byte-swizzled layout, wgmma.mma_async bf16 x bf16 -> f32 at m64 with N = 16 / 32 / 64 / 128 /
// 256 (f16 x f16 too where a kF16 parameter says so), and the fence / commit / wait that order
// them. Issued by a warpgroup (4 consecutive warps starting at a warp index divisible by 4); the
// accumulators stay in registers.
//
// Shared layout (the "SW128" atom): a tile of R rows x 64 bf16 (128 bytes a row) with the 16-byte
// chunk j of row r stored at chunk j ^ (r % 8); wider tiles are such 64-column blocks one after
// the other. Tiles start at 1024-byte boundaries. Accumulator fragments: thread t of the
// warpgroup holds rows 16 (t / 32) + t % 32 / 4 (+ 8) and, per 8-column block i, columns
// 8 i + 2 (t % 4) (+ 1) in d[4 i .. 4 i + 3] (the mma.sync m16n8 layout, per warp).
//
// Inline asm takes no arrays: the wrappers' accumulator operands are listed through macros, their
// register placeholders written out.
#pragma once

#include <cstdint>

namespace deltaserve::cuda::wgmma {

// Bytes of one row of an SW128 atom, and of a whole 8-row atom.
constexpr uint32_t kRowBytes = 128, kAtomBytes = 1024;

// Byte offset of element (r, c) in an SW128 tile of `rows` rows (c < 64 * blocks).
__host__ __device__ constexpr uint32_t sw128_offset(int rows, int r, int c) {
  return static_cast<uint32_t>((c / 64) * rows * kRowBytes + r * kRowBytes +
                               ((((c % 64) / 8) ^ (r % 8)) * 16) + (c % 8) * 2);
}

// The descriptor of an SW128 operand starting at shared address `addr`: lbo = bytes between
// 64-element blocks along M / N (MN-major operands only), sbo = bytes between 8-row groups.
__device__ inline uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// A kernel's dynamic shared memory `raw` as a T starting at the next atom (1024-byte) boundary
// (SW128 tiles need it: the swizzle follows address bits 7..9; the runtime does not promise it),
// reached by an offset from `raw` itself: the compiler then still knows every access through it
// is to shared memory (a pointer rebuilt from an integer would be generic).
template <class T>
__device__ inline T* atom_aligned(unsigned char* raw) {
  const int at = static_cast<int>(__cvta_generic_to_shared(raw));
  return reinterpret_cast<T*>(raw + (-at & static_cast<int>(kAtomBytes - 1)));
}

// Moves registers between warpgroups (setmaxnreg; every warp of the warpgroup executes it): this
// warpgroup's threads give up registers down to / take them up to kRegs. The launch's registers
// must cover the sum over warpgroups after the moves, or an increase waits for good.
template <int kRegs>
__device__ inline void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ inline void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

__device__ inline void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ inline void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Orders this thread's generic-proxy shared-memory writes (stores, cp.async) before later
// wgmma reads of them (with a barrier after it).
__device__ inline void fence_shared_for_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Output operands of accumulator registers d[i .. i + 31] (the wrappers' operand lists).
#define DS_WGMMA_ACC8(i)                                                                      \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define DS_WGMMA_ACC32(i) \
  DS_WGMMA_ACC8(i), DS_WGMMA_ACC8(i + 8), DS_WGMMA_ACC8(i + 16), DS_WGMMA_ACC8(i + 24)
// The wrapper's asm (a macro of the operand type's name) for bf16, or (kF16) f16.
#define DS_WGMMA_TYPED(ASM) \
  if constexpr (kF16)       \
    ASM("f16");             \
  else                      \
    ASM("bf16")

// d (64 x 64) = (accumulate ? d : 0) + A B, A (64 x 16) and B (16 x 64, stored N x K) both
// K-major in shared memory; bf16 operands, or (kF16) f16.
#define DS_WGMMA_64x64_SS(T)                                                                     \
  asm volatile(                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                               \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T                                      \
      " "                                                                                        \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "   \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, " \
      "0;\n"                                                                                     \
      "}\n"                                                                                      \
      : DS_WGMMA_ACC32(0)                                                                        \
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)))
template <bool kF16 = false>
__device__ inline void mma_64x64_ss(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  DS_WGMMA_TYPED(DS_WGMMA_64x64_SS);
}
#undef DS_WGMMA_64x64_SS

// d (64 x 256) = (accumulate ? d : 0) + A B, A (64 x 16) and B (16 x 256, stored N x K) both
// K-major in shared memory.
__device__ inline void mma_64x256_ss(float (&d)[128], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "
      "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "
      "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, "
      "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "
      "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, "
      "0, 0;\n"
      "}\n"
      : DS_WGMMA_ACC32(0), DS_WGMMA_ACC32(32), DS_WGMMA_ACC32(64), DS_WGMMA_ACC32(96)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// d (64 x 16) = (accumulate ? d : 0) + A B, A (64 x 16) and B (16 x 16, stored N x K) both
// K-major in shared memory.
__device__ inline void mma_64x16_ss(float (&d)[8], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n"
      "}\n"
      : DS_WGMMA_ACC8(0)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// d (64 x 32) = (accumulate ? d : 0) + A B, A (64 x 16) and B (16 x 32, stored N x K) both
// K-major in shared memory.
__device__ inline void mma_64x32_ss(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, "
      "0, 0;\n"
      "}\n"
      : DS_WGMMA_ACC8(0), DS_WGMMA_ACC8(8)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// d (64 x 32) = (accumulate ? d : 0) + A B, A (64 x 16) in registers (the mma.sync A fragment
// layout per warp), B (16 x 32, stored N x K) K-major in shared memory.
__device__ inline void mma_64x32_rs_kmajor(float (&d)[16], const uint32_t (&a)[4], uint64_t b,
                                           bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, "
      "%19}, %20, p, 1, 1, 0;\n"
      "}\n"
      : DS_WGMMA_ACC8(0), DS_WGMMA_ACC8(8)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

// d (64 x 64) = (accumulate ? d : 0) + A B, A (64 x 16) in registers (the mma.sync A fragment
// layout per warp: rows 16 w + g (+ 8), columns 2c (+ 8)), B (16 x 64) in shared memory,
// MN-major (kMnMajorB) or K-major (stored N x K); bf16 operands, or (kF16) f16.
#define DS_WGMMA_64x64_RS(T)                                                                     \
  asm volatile(                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                               \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T                                      \
      " "                                                                                        \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "   \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, " \
      "%36, p, 1, 1, %38;\n"                                                                     \
      "}\n"                                                                                      \
      : DS_WGMMA_ACC32(0)                                                                        \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),   \
        "n"(kMnMajorB ? 1 : 0))
template <bool kMnMajorB = true, bool kF16 = false>
__device__ inline void mma_64x64_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                    bool accumulate = true) {
  DS_WGMMA_TYPED(DS_WGMMA_64x64_RS);
}
#undef DS_WGMMA_64x64_RS

// d (64 x 128) += A B, A (64 x 16) in registers (the mma.sync A fragment layout per warp: rows
// 16 w + g (+ 8), columns 2c (+ 8)), B (16 x 128) MN-major in shared memory; bf16 operands, or
// (kF16) f16.
#define DS_WGMMA_64x128_RS(T)                                                                     \
  asm volatile(                                                                                   \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T                                      \
      " "                                                                                         \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "    \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "     \
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "     \
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, " \
      "1, 1;\n"                                                                                   \
      "}\n"                                                                                       \
      : DS_WGMMA_ACC32(0), DS_WGMMA_ACC32(32)                                                     \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
template <bool kF16 = false>
__device__ inline void mma_64x128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  DS_WGMMA_TYPED(DS_WGMMA_64x128_RS);
}
#undef DS_WGMMA_64x128_RS

// d (64 x 256) += A B, A (64 x 16) in registers (the mma.sync A fragment layout per warp: rows
// 16 w + g (+ 8), columns 2c (+ 8)), B (16 x 256) MN-major in shared memory; bf16 operands, or
// (kF16) f16.
#define DS_WGMMA_64x256_RS(T)                                                                  \
  asm volatile(                                                                                \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                            \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T                                   \
      " "                                                                                      \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "  \
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "  \
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "  \
      "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "  \
      "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, "    \
      "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "   \
      "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, " \
      "%131}, %132, p, 1, 1, 1;\n"                                                             \
      "}\n"                                                                                    \
      : DS_WGMMA_ACC32(0), DS_WGMMA_ACC32(32), DS_WGMMA_ACC32(64), DS_WGMMA_ACC32(96)          \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
template <bool kF16 = false>
__device__ inline void mma_64x256_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
  DS_WGMMA_TYPED(DS_WGMMA_64x256_RS);
}
#undef DS_WGMMA_64x256_RS

#undef DS_WGMMA_TYPED
#undef DS_WGMMA_ACC32
#undef DS_WGMMA_ACC8

}  // namespace deltaserve::cuda::wgmma
