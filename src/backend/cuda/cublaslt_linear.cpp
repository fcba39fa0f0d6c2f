#include "backend/cuda/cublaslt_linear.h"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "core/error.h"

namespace deltaserve::cuda {

namespace {

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw DeviceError(std::string("cuBLASLt ") + what + " failed (status " + std::to_string(s) +
                      ")");
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw DeviceError(std::string("cuBLASLt tuning: ") + what + ": " + cudaGetErrorString(e));
}

// Two CUDA events, destroyed with the object.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    check_cuda(cudaEventCreate(&start), "event");
    check_cuda(cudaEventCreate(&stop), "event");
  }
  ~EventPair() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
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
// [in, out]) transposed, B = the stored x (column-major [in, T]). A batch shares x (stride 0).
CublasLtLinear::Plan& CublasLtLinear::plan(const Shape& s) {
  if (const auto it = plans_.find(s.key()); it != plans_.end()) return it->second;
  Plan p;
  check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
        "transa");
  check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
        "transb");
  const auto layout = [&](cublasLtMatrixLayout_t* l, int64_t rows, int64_t cols, int64_t stride,
                          const char* what) {
    check(cublasLtMatrixLayoutCreate(l, CUDA_R_16BF, static_cast<uint64_t>(rows),
                                     static_cast<uint64_t>(cols), rows),
          what);
    if (s.batch == 1) return;
    const int32_t count = s.batch;
    check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                           sizeof count),
          what);
    check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                           sizeof stride),
          what);
  };
  layout(&p.a, s.in, s.out, s.w_stride, "layout a");
  layout(&p.b, s.in, s.T, 0, "layout b");
  layout(&p.c, s.out, s.T, s.y_stride, "layout c");
  const std::vector<cublasLtMatmulAlgo_t> algos = heuristics(p, 1);
  if (algos.empty())
    throw DeviceError("cuBLASLt has no algorithm for a bf16 GEMM of T=" + std::to_string(s.T) +
                      ", in=" + std::to_string(s.in) + ", out=" + std::to_string(s.out) +
                      ", batch=" + std::to_string(s.batch));
  p.algo = algos.front();
  return plans_.emplace(s.key(), p).first->second;
}

std::vector<cublasLtMatmulAlgo_t> CublasLtLinear::heuristics(const Plan& p, int count) {
  cublasLtMatmulPreference_t pref;
  check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes_, sizeof workspace_bytes_),
        "workspace preference");
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref,
                                                           count, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (st != CUBLAS_STATUS_SUCCESS) return algos;
  for (int i = 0; i < found; ++i)
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
      algos.push_back(results[static_cast<size_t>(i)].algo);
  return algos;
}

CublasLtLinear::Tuning CublasLtLinear::tune(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                            __nv_bfloat16* y, int64_t T, int64_t in, int64_t out,
                                            cudaStream_t stream, int candidates, bool accumulate) {
  return tune(Shape{T, in, out}, x, w, y, stream, candidates, accumulate);
}

CublasLtLinear::Tuning CublasLtLinear::tune(const Shape& s, const __nv_bfloat16* x,
                                            const __nv_bfloat16* w, __nv_bfloat16* y,
                                            cudaStream_t stream, int candidates, bool accumulate) {
  Plan& p = plan(s);
  const std::vector<cublasLtMatmulAlgo_t> algos = heuristics(p, candidates);
  const EventPair ev;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  constexpr int kRounds = 3, kCalls = 5;  // a candidate's time: the median round's mean call
  Tuning t{static_cast<int>(algos.size()), 0, 0.0f, 0.0f};
  for (size_t i = 0; i < algos.size(); ++i) {
    const auto call = [&] {
      return cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &algos[i],
                            workspace_, workspace_bytes_, stream);
    };
    if (call() != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; an algorithm may refuse at run time
    std::array<float, kRounds> rounds{};
    for (float& ms : rounds) {
      check_cuda(cudaEventRecord(ev.start, stream), "event record");
      for (int c = 0; c < kCalls; ++c) check(call(), "matmul (tuning)");
      check_cuda(cudaEventRecord(ev.stop, stream), "event record");
      check_cuda(cudaEventSynchronize(ev.stop), "event sync");
      check_cuda(cudaEventElapsedTime(&ms, ev.start, ev.stop), "event time");
    }
    std::sort(rounds.begin(), rounds.end());
    const float ms = rounds[kRounds / 2] / kCalls;
    if (i == 0) t.heuristic_ms = ms;
    if (t.best_ms == 0.0f || ms < t.best_ms) {
      t.best_ms = ms;
      t.chosen = static_cast<int>(i);
      p.algo = algos[i];
    }
  }
  p.tuned = true;
  return t;
}

void CublasLtLinear::enqueue(const Shape& s, const __nv_bfloat16* x, const __nv_bfloat16* w,
                             __nv_bfloat16* y, cudaStream_t stream, bool accumulate) {
  if (s.T == 0) return;
  if (tune_min_rows_ > 0 && s.T >= tune_min_rows_ && !capturing(stream)) {
    const auto known = plans_.find(s.key());
    if (known == plans_.end() || !known->second.tuned) tune(s, x, w, y, stream, 8, accumulate);
  }
  const Plan& p = plan(s);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check(cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                       workspace_, workspace_bytes_, stream),
        "matmul");
}

void CublasLtLinear::run(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
                         int64_t T, int64_t in, int64_t out, cudaStream_t stream, bool accumulate) {
  enqueue(Shape{T, in, out}, x, w, y, stream, accumulate);
}

void CublasLtLinear::run_batched(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
                                 int64_t T, int64_t in, int64_t out, int batch, int64_t w_stride,
                                 int64_t y_stride, cudaStream_t stream) {
  if (batch < 1 || w_stride <= 0 || y_stride <= 0)
    throw DeviceError("cuBLASLt batched GEMM: batch >= 1 and positive strides");
  enqueue(Shape{T, in, out, batch, w_stride, y_stride}, x, w, y, stream, false);
}

}  // namespace deltaserve::cuda
