// ModelRuntime: what the commands run a model with: one CPU model (TP 1) or a TpExecutor of CPU
// ranks (TP > 1), validated before any weight loads.
#pragma once

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/executor.h"
#include "model/loader.h"

namespace deltaserve::app {

struct ModelRuntime {
  std::unique_ptr<backend::CpuBackend> be;    // TP 1 only
  std::unique_ptr<model::Qwen35Model> model;  // TP 1 only
  std::unique_ptr<engine::Executor> exec;
};

inline ModelRuntime make_runtime(const std::string& dir, model::LoadFormat fmt, int tp,
                                 bool verbose) {
  ModelRuntime rt;
  if (tp < 1) throw Error("--tensor-parallel-size must be >= 1");
  if (tp == 1) {
    rt.be = std::make_unique<backend::CpuBackend>();
    rt.model = model::load_model(dir, fmt, *rt.be, verbose);
    rt.exec = std::make_unique<engine::LocalExecutor>(*rt.model);
    return rt;
  }
  model::validate_tp(model::load_config(dir), tp);  // fail closed before loading
  rt.exec = std::make_unique<engine::TpExecutor>(
      tp, [](int) { return std::make_unique<backend::CpuBackend>(); },
      [&](int rank, backend::Backend& be, dist::Communicator* comm) {
        return model::load_model(dir, fmt, be, verbose, {tp, rank}, comm);
      });
  return rt;
}

}  // namespace deltaserve::app
