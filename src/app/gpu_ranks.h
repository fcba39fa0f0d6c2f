// Tensor parallelism over GPUs, composed here (not in the engine, which knows no concrete
// backend): rank r's worker owns a CudaBackend on GPU r and an NCCL communicator on that backend's
// current stream (every rank's model all-reduces through it, TP 1 too).
// Header-only: for builds with CUDA and NCCL (link ds_engine, ds_backend_cuda, ds_dist_nccl).
#pragma once

#include <chrono>
#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "dist/nccl_communicator.h"
#include "engine/executor.h"

namespace deltaserve::app {

inline std::unique_ptr<engine::TpExecutor> make_gpu_tp_executor(
    int size, engine::TpExecutor::ModelFactory make_model, std::chrono::milliseconds step_timeout) {
  const ncclUniqueId id = dist::nccl_unique_id();
  return std::make_unique<engine::TpExecutor>(
      size, [](int rank) { return std::make_unique<backend::CudaBackend>(rank); },
      std::move(make_model), step_timeout,
      [id, size](int rank, backend::Backend& be) -> std::unique_ptr<dist::Communicator> {
        // The rank's backend outlives its communicator (the executor's worker destroys them in
        // that order); collectives follow the backend's current stream.
        auto* cuda = &static_cast<backend::CudaBackend&>(be);
        return std::make_unique<dist::NcclCommunicator>(id, size, rank, rank,
                                                        [cuda] { return cuda->stream(); });
      });
}

}  // namespace deltaserve::app
