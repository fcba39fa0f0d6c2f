// CudaBackend: the Backend on one NVIDIA GPU (sm_90a). bf16 weights (f32 vectors: norms, A_log,
// dt_bias) and activations with f32 accumulation; every op is a stream-ordered launch.
// NOTE: in progress (the CUDA backend issue): embedding, the norms, cuBLASLt projections, SiLU-mul,
// row gather and the gated norm are here; attention, the GDN conv and the delta rule are not yet,
// and calling them throws deltaserve::Error.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "backend/backend.h"
#include "backend/cuda/cublaslt_linear.h"

namespace deltaserve::backend {

class CudaBackend final : public Backend {
 public:
  // Uses CUDA device `device`; throws deltaserve::Error when it does not exist.
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;

  Device device() const override { return Device::kCuda; }
  DType act_dtype() const override { return DType::kBF16; }
  DType weight_dtype(int ndims) const override { return ndims >= 2 ? DType::kBF16 : DType::kF32; }
  Buffer alloc(DType t, std::initializer_list<int64_t> dims) override;
  void upload(DType src_type, const void* src, size_t n, const Tensor& dst) override;
  void download_f32(const Tensor& src, float* dst) override;
  void upload_i32(const int32_t* src, const Tensor& dst) override;
  void synchronize() override;
  void set_batch(const BatchDesc& batch) override { batch_ = batch; }
  cudaStream_t stream() const { return stream_; }

  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
  void add_rms_norm(const Tensor& residual, const Tensor& x, const Tensor& w, float eps,
                    const Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& y) override;
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) override;
  void gated_rms_norm(const Tensor& o, const Tensor& z, const Tensor& w, float eps) override;

  void attn_prep_and_cache(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const AttnDims&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&) override;
  void paged_attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttnDims&,
                       const Tensor&) override;
  void gdn_conv(const Tensor&, const Tensor&, const Tensor&, int32_t, const Tensor&) override;
  void gated_delta_rule(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, const GdnDims&, const Tensor&) override;

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::CublasLtLinear> gemm_;
  BatchDesc batch_;
};

}  // namespace deltaserve::backend
