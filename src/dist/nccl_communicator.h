// NcclCommunicator: the Communicator of GPU ranks, over NCCL. Created inside the worker thread
// that owns the device; every collective is enqueued on that worker's backend's current stream
// (the main one, or the side one of TPSP's microchunk pipeline), never synchronised here except
// by barrier(). NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as on our machines.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "dist/communicator.h"

namespace deltaserve::dist {

// A fresh NCCL unique id: made once, shared by every rank of a group (in one process here).
ncclUniqueId nccl_unique_id();

class NcclCommunicator final : public Communicator {
 public:
  // Rank `rank` of `size` on CUDA device `device`, each collective on the stream `stream()` returns
  // when it is enqueued. Throws
  // deltaserve::Error (naming the NCCL or CUDA error) when the device does not exist or NCCL cannot
  // initialise.
  NcclCommunicator(const ncclUniqueId& id, int size, int rank, int device,
                   std::function<cudaStream_t()> stream);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Tensors are device memory of F32, BF16 or F16.
  void all_reduce_sum(const Tensor& t) override;
  void reduce_scatter_sum(const Tensor& in, const Tensor& out) override;
  void all_gather(const Tensor& in, const Tensor& out) override;
  void broadcast(const Tensor& t, int root) override;
  // Enqueues a 1-element all-reduce and waits for the stream (a host-side rendezvous).
  void barrier() override;
  // Aborts the communicator so that no rank stays blocked in a collective (fail-stop). Callable
  // from any thread, never blocks on the peers: collectives enqueue under the same lock, and later
  // ones throw. The destructor waits for NCCL's teardown, which needs every CUDA graph that
  // captured a collective of this communicator destroyed first.
  void abort() override;

 private:
  void live() const;  // throws once aborted; call with mu_ held
  std::mutex mu_;     // a collective's enqueue vs abort() from another thread
  ncclComm_t comm_ = nullptr;
  std::function<cudaStream_t()> stream_;
  int rank_, size_, device_;
  float* scratch_ = nullptr;  // [1] for barrier()
  std::thread abort_thread_;  // runs ncclCommAbort (see abort())
};

}  // namespace deltaserve::dist
