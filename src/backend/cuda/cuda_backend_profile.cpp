// CudaBackend's per-op profile (DS_CUDA_PROFILE=1): the CUDA events of timed ops summed by op name,
// and with DS_CUDA_PROFILE=shapes the projections (otherwise "linear") named by their kind and
// output / input widths (linear_label), so that a step's GEMMs can be told apart.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_detail.h"

namespace deltaserve::backend {

void CudaBackend::account() {
  for (const Timed& t : pending_) {
    cudaEventSynchronize(t.stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, t.start, t.stop);
    auto it = std::find_if(totals_.begin(), totals_.end(),
                           [&](const auto& e) { return std::strcmp(e.first, t.op) == 0; });
    if (it == totals_.end()) it = totals_.insert(totals_.end(), {t.op, {0.0, 0}});
    it->second.first += ms;
    ++it->second.second;
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.stop);
  }
  pending_.clear();
}

std::string CudaBackend::profile_report(bool reset) {
  if (!profile_) return {};
  account();
  double all = 0;
  for (const auto& [op, t] : totals_) all += t.first;
  auto rows = totals_;
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "  %-34s %12s %10s %7s\n", "op", "total ms", "calls", "share");
  out += line;
  for (const auto& [op, t] : rows) {
    std::snprintf(line, sizeof line, "  %-34s %12.3f %10lld %6.1f%%\n", op, t.first,
                  static_cast<long long>(t.second), all > 0 ? 100.0 * t.first / all : 0.0);
    out += line;
  }
  if (reset) totals_.clear();
  return out;
}

const char* CudaBackend::linear_label(const char* kind, int64_t n, int64_t k) {
  if (!shape_labels_) return "linear";
  char name[96];
  std::snprintf(name, sizeof name, "%s n=%lld k=%lld", kind, static_cast<long long>(n),
                static_cast<long long>(k));
  return labels_.insert(name).first->c_str();  // a set's nodes stay put: the pointer stays valid
}

}  // namespace deltaserve::backend
