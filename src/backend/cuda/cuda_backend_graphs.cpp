// CudaBackend's two streams, their events, and CUDA graph capture / replay.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_detail.h"

namespace deltaserve::backend {

using cuda_detail::check;

void CudaBackend::use_side_stream(bool side) { stream_ = side ? side_stream_ : main_stream_; }

cudaEvent_t CudaBackend::event(int e) {
  DS_CHECK(e >= 0, "event numbers start at 0");
  while (static_cast<int>(events_.size()) <= e) {
    cudaEvent_t ev = nullptr;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    events_.push_back(ev);
  }
  return events_[static_cast<size_t>(e)];
}

void CudaBackend::record_event(int e) { check(cudaEventRecord(event(e), stream_), "event record"); }

void CudaBackend::wait_event(int e) {
  check(cudaStreamWaitEvent(stream_, event(e), 0), "stream wait event");
}

void CudaBackend::begin_capture() {
  DS_CHECK(!capturing_, "already capturing");
  DS_CHECK(stream_ == main_stream_, "capture starts on the main stream");
  if (profile_) account();
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
  capturing_ = true;
}

int CudaBackend::end_capture() {
  DS_CHECK(capturing_, "not capturing");
  capturing_ = false;
  cudaGraph_t g = nullptr;
  check(cudaStreamEndCapture(stream_, &g), "end capture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  check(e, "graph instantiate");
  graphs_.push_back(exec);
  return static_cast<int>(graphs_.size()) - 1;
}

void CudaBackend::replay(int id) {
  DS_CHECK(graph_valid(id), "replay of an invalid graph");
  OpTimer timer(*this, "graph_replay");
  check(cudaGraphLaunch(graphs_[static_cast<size_t>(id)], stream_), "graph launch");
}

bool CudaBackend::graph_valid(int id) const {
  return id >= 0 && id < static_cast<int>(graphs_.size()) && graphs_[static_cast<size_t>(id)];
}

void CudaBackend::drop_graphs() {
  for (cudaGraphExec_t& g : graphs_)
    if (g) {
      cudaGraphExecDestroy(g);
      g = nullptr;
    }
}

}  // namespace deltaserve::backend
