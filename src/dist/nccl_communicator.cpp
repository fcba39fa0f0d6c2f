#include "dist/nccl_communicator.h"

#include <cstdlib>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace deltaserve::dist {

namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw DeviceError(std::string("NCCL ") + what + ": " + ncclGetErrorString(r));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw DeviceError(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    default:
      DS_CHECK(false, "NCCL collectives take F32, BF16 or F16 tensors");
  }
  return ncclFloat32;
}

}  // namespace

ncclUniqueId nccl_unique_id() {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  // Connect every algorithm and protocol at init, so that enqueueing a collective never waits for
  // a peer (lazy connection set-up would block a rank whose peer already failed, holding mu_).
  setenv("NCCL_RUNTIME_CONNECT", "0", 1);
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return id;
}

NcclCommunicator::NcclCommunicator(const ncclUniqueId& id, int size, int rank, int device,
                                   std::function<cudaStream_t()> stream)
    : stream_(std::move(stream)), rank_(rank), size_(size), device_(device) {
  // NCCL_NVLS_ENABLE=0 was set by nccl_unique_id() on the calling thread before the workers
  // started (setenv here would race with other ranks' NCCL reading the environment).
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device < 0 || device >= count)
    throw Error("CUDA device " + std::to_string(device) + " does not exist (" +
                std::to_string(count) + " visible)");
  check(cudaSetDevice(device), "cudaSetDevice");
  check(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
  check(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
}

NcclCommunicator::~NcclCommunicator() {
  if (abort_thread_.joinable()) abort_thread_.join();
  if (scratch_) cudaFree(scratch_);
  if (comm_) ncclCommDestroy(comm_);
}

void NcclCommunicator::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!comm_) return;
  // ncclCommAbort raises the abort flag first (in-flight kernels quit and the waiting rank's stream
  // drains), then waits until every CUDA graph that captured this communicator is destroyed
  // (NCCL >= 2.26): run it on a thread of its own, joined by the destructor, so the caller never
  // blocks on graphs that its own teardown destroys later.
  abort_thread_ = std::thread([c = comm_, dev = device_] {
    cudaSetDevice(dev);
    ncclCommAbort(c);
  });
  comm_ = nullptr;  // later collectives throw
}

void NcclCommunicator::live() const {
  if (!comm_) throw DeviceError("NCCL communicator was aborted");
}

void NcclCommunicator::all_reduce_sum(const Tensor& t) {
  const std::lock_guard<std::mutex> lock(mu_);
  live();
  check(ncclAllReduce(t.data, t.data, static_cast<size_t>(t.numel()), nccl_type(t.dtype), ncclSum,
                      comm_, stream_()),
        "all_reduce");
}

void NcclCommunicator::reduce_scatter_sum(const Tensor& in, const Tensor& out) {
  const std::lock_guard<std::mutex> lock(mu_);
  live();
  DS_CHECK(in.numel() == out.numel() * size_, "reduce_scatter: out must be 1/size of in");
  check(ncclReduceScatter(in.data, out.data, static_cast<size_t>(out.numel()), nccl_type(in.dtype),
                          ncclSum, comm_, stream_()),
        "reduce_scatter");
}

void NcclCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  const std::lock_guard<std::mutex> lock(mu_);
  live();
  DS_CHECK(out.numel() == in.numel() * size_, "all_gather: out must be size x in");
  check(ncclAllGather(in.data, out.data, static_cast<size_t>(in.numel()), nccl_type(in.dtype),
                      comm_, stream_()),
        "all_gather");
}

void NcclCommunicator::broadcast(const Tensor& t, int root) {
  const std::lock_guard<std::mutex> lock(mu_);
  live();
  check(ncclBroadcast(t.data, t.data, static_cast<size_t>(t.numel()), nccl_type(t.dtype), root,
                      comm_, stream_()),
        "broadcast");
}

void NcclCommunicator::barrier() {
  std::unique_lock<std::mutex> lock(mu_);
  live();
  check(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_()), "barrier");
  lock.unlock();  // abort() from another thread releases a wait on a failed peer
  check(cudaStreamSynchronize(stream_()), "cudaStreamSynchronize");
}

}  // namespace deltaserve::dist
