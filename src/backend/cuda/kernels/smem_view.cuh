// Where element (r, c) of a bf16 matrix staged in shared memory lies, for the ldmatrix-fed MMA
// helpers that take a view instead of a pointer and leading dimension: row-major rows padded to
// `ld` elements (cp.async copies), or wgmma.cuh's 128-byte-swizzled layout of kRows-row blocks of
// 64 columns (what the bulk tensor copies write). Both keep an ldmatrix's eight 16-byte rows in
// different banks.
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda {

struct PaddedRows {
  const __nv_bfloat16* m;
  int ld;
  __device__ const __nv_bfloat16* at(int r, int c) const { return m + r * ld + c; }
};

template <int kRows>
struct Sw128Rows {
  const __nv_bfloat16* tile;  // 1024-byte aligned
  __device__ const __nv_bfloat16* at(int r, int c) const {
    return reinterpret_cast<const __nv_bfloat16*>(reinterpret_cast<const char*>(tile) +
                                                  wgmma::sw128_offset(kRows, r, c));
  }
};

}  // namespace deltaserve::cuda
