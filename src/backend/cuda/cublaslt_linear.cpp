#include "backend/cuda/cublaslt_linear.h"

#include <string>

#include "core/error.h"

namespace deltaserve::cuda {

namespace {

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw DeviceError(std::string("cuBLASLt ") + what + " failed (status " + std::to_string(s) +
                      ")");
}

}  // namespace

CublasLtLinear::CublasLtLinear(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  check(cublasLtCreate(&handle_), "create");
  if (cudaMalloc(&workspace_, workspace_bytes_) != cudaSuccess)
    throw DeviceError("cuBLASLt workspace allocation failed");
}

CublasLtLinear::~CublasLtLinear() {
  for (auto& [k, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

// Row-major y [T, out] is column-major y^T [out, T] = W . x^T: A = the stored w (column-major
// [in, out]) transposed, B = the stored x (column-major [in, T]).
const CublasLtLinear::Plan& CublasLtLinear::plan(int64_t T, int64_t in, int64_t out) {
  const auto key = std::make_tuple(T, in, out);
  if (const auto it = plans_.find(key); it != plans_.end()) return it->second;
  Plan p;
  check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
        "transa");
  check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
        "transb");
  check(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, static_cast<uint64_t>(in),
                                   static_cast<uint64_t>(out), in),
        "layout a");
  check(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, static_cast<uint64_t>(in),
                                   static_cast<uint64_t>(T), in),
        "layout b");
  check(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, static_cast<uint64_t>(out),
                                   static_cast<uint64_t>(T), out),
        "layout c");
  cublasLtMatmulPreference_t pref;
  check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes_, sizeof workspace_bytes_),
        "workspace preference");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    throw DeviceError("cuBLASLt has no algorithm for a bf16 GEMM of T=" + std::to_string(T) +
                      ", in=" + std::to_string(in) + ", out=" + std::to_string(out));
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void CublasLtLinear::run(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
                         int64_t T, int64_t in, int64_t out, cudaStream_t stream, bool accumulate) {
  if (T == 0) return;
  const Plan& p = plan(T, in, out);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check(cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                       workspace_, workspace_bytes_, stream),
        "matmul");
}

}  // namespace deltaserve::cuda
