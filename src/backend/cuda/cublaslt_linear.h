// Linear layers through cuBLASLt: y = x . w^T (or y += x . w^T) for row-major bf16 x [T, in],
// w [out, in], y [T, out], f32 accumulation; also a batch of such projections of the same x, with
// the same widths, in one launch. The algorithm for each shape is chosen once and cached:
// cuBLASLt's first heuristic, or the fastest of its first few timed by tune().
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

namespace deltaserve::cuda {

class CublasLtLinear {
 public:
  // Throws deltaserve::Error when cuBLASLt cannot be initialised.
  explicit CublasLtLinear(size_t workspace_bytes = 32 << 20);
  size_t workspace_bytes() const { return workspace_bytes_; }
  ~CublasLtLinear();
  CublasLtLinear(const CublasLtLinear&) = delete;
  CublasLtLinear& operator=(const CublasLtLinear&) = delete;

  // Enqueues the GEMM on `stream`, y = x . w^T, or with `accumulate` y += x . w^T (summed in f32,
  // rounded once); never allocates device memory or syncs (but see set_tuning). Throws
  // deltaserve::Error when no algorithm supports the shape.
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int64_t T, int64_t in,
           int64_t out, cudaStream_t stream, bool accumulate = false);

  // Enqueues `batch` GEMMs of one x in one launch: y_i = x . w_i^T with w_i = w + i w_stride and
  // y_i = y + i y_stride (strides in elements, > 0: the projections' weights and outputs may lie
  // anywhere). Otherwise as run().
  void run_batched(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int64_t T,
                   int64_t in, int64_t out, int batch, int64_t w_stride, int64_t y_stride,
                   cudaStream_t stream);

  struct Tuning {
    int candidates, chosen;       // algorithms timed; the index of the one kept
    float heuristic_ms, best_ms;  // the first heuristic's time a call, the kept one's
  };
  // Times cuBLASLt's first `candidates` heuristic algorithms for the shape on x / w (y
  // overwritten) and keeps the fastest for it. Synchronizes `stream`: for a warm-up or a
  // benchmark, never inside graph capture. Throws deltaserve::Error on a CUDA failure.
  Tuning tune(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int64_t T,
              int64_t in, int64_t out, cudaStream_t stream, int candidates = 8,
              bool accumulate = false);
  // While min_rows > 0, run() tunes (as tune(), on its own operands: y is garbage after it) each
  // shape of at least min_rows tokens not tuned yet (also one that ran on the first heuristic
  // before), unless its stream is being captured (then the plan it has); 0 turns it off.
  void set_tuning(int64_t min_rows) { tune_min_rows_ = min_rows; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool tuned = false;  // algo is tune()'s choice, not the first heuristic
  };
  // A GEMM's shape: a batch of `batch` (1: a plain GEMM), its weights and outputs `w_stride` /
  // `y_stride` elements apart.
  struct Shape {
    int64_t T, in, out;
    int batch = 1;
    int64_t w_stride = 0, y_stride = 0;
    auto key() const { return std::make_tuple(T, in, out, batch, w_stride, y_stride); }
  };
  Plan& plan(const Shape& s);  // made and cached on first use
  std::vector<cublasLtMatmulAlgo_t> heuristics(const Plan& p, int count);
  Tuning tune(const Shape& s, const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
              cudaStream_t stream, int candidates, bool accumulate);
  void enqueue(const Shape& s, const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
               cudaStream_t stream, bool accumulate);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int64_t, int64_t>, Plan> plans_;
  int64_t tune_min_rows_ = 0;
};

}  // namespace deltaserve::cuda
