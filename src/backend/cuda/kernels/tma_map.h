// Host side of the bulk tensor copies: encoding a tensor map for a row-major bf16 matrix, through
// the driver's cuTensorMapEncodeTiled reached via the runtime (no link against libcuda).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace deltaserve::cuda {

// The map of a row-major bf16 matrix [rows, cols] at `base` (16-byte aligned, cols % 8 == 0) read
// in boxes of box_rows x 64 columns with the 128-byte swizzle (the wgmma SW128 layout). Throws
// deltaserve::Error when the driver rejects it.
CUtensorMap encode_tma_2d_bf16(const void* base, int64_t rows, int64_t cols, int box_rows);

}  // namespace deltaserve::cuda
