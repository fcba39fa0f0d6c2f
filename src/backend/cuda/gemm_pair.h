// Two projections of one x and one width that CudaBackend::linear_multi can run as one
// strided-batched cuBLASLt GEMM (CublasLtLinear::run_batched).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <optional>

#include "backend/cuda/cuda_backend_detail.h"

namespace deltaserve::backend {

// Two projections of one width as one batched cuBLASLt GEMM: the lower-addressed weight's first,
// where both the weights and the outputs lie in the same order, 16-byte multiples apart.
struct GemmPair {
  const __nv_bfloat16* w;
  __nv_bfloat16* y;
  int64_t w_stride, y_stride;  // elements
};
inline std::optional<GemmPair> gemm_pair(const Tensor& w0, const Tensor& y0, const Tensor& w1,
                                         const Tensor& y1) {
  if (w0.dim(0) != w1.dim(0)) return std::nullopt;
  const auto at = [](const Tensor& t) { return reinterpret_cast<intptr_t>(t.data); };
  const bool swap = at(w1) < at(w0);
  const Tensor &wa = swap ? w1 : w0, &wb = swap ? w0 : w1;
  const Tensor &ya = swap ? y1 : y0, &yb = swap ? y0 : y1;
  const intptr_t dw = at(wb) - at(wa), dy = at(yb) - at(ya);
  if (dw <= 0 || dy <= 0 || dw % 16 != 0 || dy % 16 != 0) return std::nullopt;
  constexpr intptr_t kElem = sizeof(__nv_bfloat16);
  return GemmPair{cuda_detail::bf(wa), cuda_detail::bf(ya), dw / kElem, dy / kElem};
}

}  // namespace deltaserve::backend
