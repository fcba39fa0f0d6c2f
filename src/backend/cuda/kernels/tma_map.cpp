#include "backend/cuda/kernels/tma_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/driver_entry.h"
#include "core/error.h"

namespace deltaserve::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const auto fn =
      driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
  return fn;
}

}  // namespace

CUtensorMap encode_tma_2d_bf16(const void* base, int64_t rows, int64_t cols, int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t steps[2] = {1, 1};
  const CUresult r =
      encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw DeviceError("cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                      ") for a " + std::to_string(rows) + " x " + std::to_string(cols) +
                      " bf16 matrix");
  return map;
}

}  // namespace deltaserve::cuda
