// ModelRuntime: what the commands run a model with: one model on the CPU or one CUDA GPU (TP 1), or
// a TpExecutor of CPU ranks (TP > 1), validated before any weight loads.
#pragma once

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/executor.h"
#include "model/hub_cache.h"
#include "model/loader.h"
#ifdef DS_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#endif
#ifdef DS_HAVE_NCCL
#include "app/gpu_ranks.h"
#endif

namespace deltaserve::app {

struct ModelRuntime {
  std::unique_ptr<backend::Backend> be;       // TP 1 only
  std::unique_ptr<model::Qwen35Model> model;  // TP 1 only
  std::unique_ptr<engine::Executor> exec;
  DType act_dtype = DType::kF32;  // of activations and the KV cache
};

// `device`: "cpu" or "cuda". On CUDA, TP 1 is one model on GPU 0; TP N runs rank r on GPU r with
// an NCCL communicator (the ordinals must exist).
// `model`: a checkpoint directory, a Hugging Face repository id in the local cache
// (model::resolve_model_dir), or empty (the embedded default model).
inline ModelRuntime make_runtime(const std::string& model, model::LoadFormat fmt, int tp,
                                 bool verbose, const std::string& device = "cpu",
                                 dist::TpspConfig tpsp = {}) {
  const std::string dir = model::resolve_model_dir(model);
  ModelRuntime rt;
  if (tp < 1) throw Error("--tensor-parallel-size must be >= 1");
  if (device == "cuda") {
#ifdef DS_HAVE_CUDA
    if (tp > 1) {
#ifdef DS_HAVE_NCCL
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
      if (tp > count)
        throw Error("--device cuda --tensor-parallel-size " + std::to_string(tp) + " needs " +
                    std::to_string(tp) + " CUDA devices (ranks on GPUs 0.." +
                    std::to_string(tp - 1) + "); " + std::to_string(count) + " visible");
      model::validate_tp(model::load_config(dir), tp);  // fail closed before loading
      rt.act_dtype = DType::kBF16;
      rt.exec = make_gpu_tp_executor(
          tp,
          [&](int rank, backend::Backend& be, dist::Communicator* comm) {
            auto m = model::load_model(dir, fmt, be, verbose && rank == 0, {tp, rank}, comm);
            m->set_tpsp(tpsp);
            return m;
          },
          std::chrono::minutes(30));
      return rt;
#else
      throw Error("--device cuda --tensor-parallel-size > 1: this build has no NCCL");
#endif
    }
    rt.be = std::make_unique<backend::CudaBackend>(0);
#else
    throw Error("--device cuda: this build has no CUDA backend (nvcc was not found at build time)");
#endif
  } else if (device != "cpu") {
    throw Error("--device must be cpu or cuda, got '" + device + "'");
  }
  if (tp == 1) {
    if (!rt.be) rt.be = std::make_unique<backend::CpuBackend>();
    rt.act_dtype = rt.be->act_dtype();
    rt.model = model::load_model(dir, fmt, *rt.be, verbose);
    rt.exec = std::make_unique<engine::LocalExecutor>(*rt.model);
    return rt;
  }
  model::validate_tp(model::load_config(dir), tp);  // fail closed before loading
  rt.exec = std::make_unique<engine::TpExecutor>(
      tp, [](int) { return std::make_unique<backend::CpuBackend>(); },
      [&](int rank, backend::Backend& be, dist::Communicator* comm) {
        auto m = model::load_model(dir, fmt, be, verbose, {tp, rank}, comm);
        m->set_tpsp(tpsp);
        return m;
      });
  return rt;
}

}  // namespace deltaserve::app
