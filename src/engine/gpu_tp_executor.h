// Tensor parallelism over GPUs: rank r's worker owns a CudaBackend on GPU r and an NCCL
// communicator on that backend's stream (every rank's model all-reduces through it, TP 1 too).
// Header-only: for builds with CUDA and NCCL (link ds_engine, ds_backend_cuda, ds_dist_nccl).
#pragma once

#include <chrono>
#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "dist/nccl_communicator.h"
#include "engine/executor.h"

namespace deltaserve::engine {

inline std::unique_ptr<TpExecutor> make_gpu_tp_executor(int size,
                                                        TpExecutor::ModelFactory make_model,
                                                        std::chrono::milliseconds step_timeout) {
  const ncclUniqueId id = dist::nccl_unique_id();
  return std::make_unique<TpExecutor>(
      size, [](int rank) { return std::make_unique<backend::CudaBackend>(rank); },
      std::move(make_model), step_timeout,
      [id, size](int rank, backend::Backend& be) -> std::unique_ptr<dist::Communicator> {
        return std::make_unique<dist::NcclCommunicator>(
            id, size, rank, rank, static_cast<backend::CudaBackend&>(be).stream());
      });
}

}  // namespace deltaserve::engine
