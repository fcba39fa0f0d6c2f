// The fixture of the weight-streaming GEMM's direct launches: the CUDA op tests' fixture with the
// GEMM's workspace (f32 partials, tile counters zeroed once) and a count of the counters left set.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "cuda_ops_fixture.h"

namespace deltaserve::backend {

class SkinnyGemm : public CudaOps {
 protected:
  void SetUp() override {
    CudaOps::SetUp();
    if (IsSkipped()) return;
    cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0);
    partials_ =
        gpu_->alloc(DType::kF32, {static_cast<int64_t>(cuda::skinny_workspace_floats(sms_))});
    counters_ = gpu_->alloc(DType::kI32, {cuda::kSkinnyMaxTiles});
    cudaMemsetAsync(counters_.tensor().data, 0, counters_.tensor().nbytes(), gpu_->stream());
  }
  cuda::SkinnyWorkspace ws() const {
    return {static_cast<float*>(partials_.tensor().data),
            static_cast<int*>(counters_.tensor().data)};
  }
  int nonzero_counters() {
    std::vector<int> c(cuda::kSkinnyMaxTiles);
    cudaStreamSynchronize(gpu_->stream());
    cudaMemcpy(c.data(), counters_.tensor().data, c.size() * sizeof(int), cudaMemcpyDeviceToHost);
    int nonzero = 0;
    for (int v : c) nonzero += v != 0 ? 1 : 0;
    return nonzero;
  }
  int sms_ = 0;
  Buffer partials_, counters_;
};

}  // namespace deltaserve::backend
