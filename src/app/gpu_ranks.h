// Tensor parallelism over GPUs, composed here (not in the engine, which knows no concrete
// backend): rank r's worker owns a CudaBackend on GPU r and an NCCL communicator on that backend's
// stream (every rank's model all-reduces through it, TP 1 too).
// Header-only: for builds with CUDA and NCCL (link ds_engine, ds_backend_cuda, ds_dist_nccl).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "dist/nccl_communicator.h"
#include "engine/executor.h"

namespace deltaserve::app {

inline std::unique_ptr<engine::TpExecutor> make_gpu_tp_executor(
    int size, engine::TpExecutor::ModelFactory make_model, std::chrono::milliseconds step_timeout) {
  const ncclUniqueId id = dist::nccl_unique_id();
  // Each rank's stream, recorded when its backend is made (on that rank's worker thread).
  struct Streams {
    std::mutex mu;
    std::vector<cudaStream_t> of_rank;
  };
  auto streams = std::make_shared<Streams>();
  streams->of_rank.resize(static_cast<size_t>(size), nullptr);
  return std::make_unique<engine::TpExecutor>(
      size,
      [streams](int rank) {
        auto be = std::make_unique<backend::CudaBackend>(rank);
        std::lock_guard<std::mutex> lock(streams->mu);
        streams->of_rank[static_cast<size_t>(rank)] = be->stream();
        return be;
      },
      std::move(make_model), step_timeout,
      [id, size, streams](int rank, backend::Backend&) -> std::unique_ptr<dist::Communicator> {
        cudaStream_t stream = nullptr;
        {
          std::lock_guard<std::mutex> lock(streams->mu);
          stream = streams->of_rank[static_cast<size_t>(rank)];
        }
        return std::make_unique<dist::NcclCommunicator>(id, size, rank, rank, stream);
      });
}

}  // namespace deltaserve::app
