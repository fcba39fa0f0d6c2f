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
// [in, out]) transposed, B = the stored x (column-major [in, T]).
CublasLtLinear::Plan& CublasLtLinear::plan(int64_t T, int64_t in, int64_t out) {
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
  const std::vector<cublasLtMatmulAlgo_t> algos = heuristics(p, 1);
  if (algos.empty())
    throw DeviceError("cuBLASLt has no algorithm for a bf16 GEMM of T=" + std::to_string(T) +
                      ", in=" + std::to_string(in) + ", out=" + std::to_string(out));
  p.algo = algos.front();
  return plans_.emplace(key, p).first->second;
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
  Plan& p = plan(T, in, out);
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

void CublasLtLinear::run(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
                         int64_t T, int64_t in, int64_t out, cudaStream_t stream, bool accumulate) {
  if (T == 0) return;
  if (tune_min_rows_ > 0 && T >= tune_min_rows_ && !capturing(stream)) {
    const auto known = plans_.find(std::make_tuple(T, in, out));
    if (known == plans_.end() || !known->second.tuned)
      tune(x, w, y, T, in, out, stream, 8, accumulate);
  }
  const Plan& p = plan(T, in, out);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check(cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                       workspace_, workspace_bytes_, stream),
        "matmul");
}

}  // namespace deltaserve::cuda
