// CudaBackend's projections: the route of each (the weight-streaming GEMM, the GEMV kernel or
// cuBLASLt), the residual add inside cuBLASLt's GEMM, start-up tuning, and the projection order
// by which the weight-streaming GEMM pulls the next projection's weights into L2.
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_detail.h"
#include "backend/cuda/kernels/gemv.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "core/error.h"

namespace deltaserve::backend {

using cuda_detail::bf;
using cuda_detail::check;

void CudaBackend::set_linear_tuning(bool on) {
  if (gemm_tuning_) gemm_->set_tuning(on ? kMinTunedRows : 0);
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  const Tensor* ws[1] = {&w};
  const Tensor* ys[1] = {&y};
  linear_multi(x, ws, ys);
}

// The weight-streaming GEMM where it pays (cuda::skinny_gemm_pays). Where it does not apply (or
// with DS_SKINNY_GEMM=0, for A/B benchmarks) the GEMV kernel for T <= 8; else cuBLASLt, a GEMM
// each.
CudaBackend::LinearRoute CudaBackend::linear_route(const Tensor& x,
                                                   std::span<const Tensor* const> ws,
                                                   std::span<const Tensor* const> ys) const {
  DS_CHECK(ws.size() == ys.size() && !ws.empty(), "linear_multi: one output per weight");
  const int64_t T = x.dim(0), K = x.dim(1);
  const int t = static_cast<int>(T), k = static_cast<int>(K), count = static_cast<int>(ws.size());
  bool skinny = skinny_gemm_ && T <= cuda::kSkinnyMaxRows && count <= cuda::kSkinnyMaxGroups;
  bool gemv = T <= cuda::kGemvMaxRows && count <= cuda::kGemvMaxGroups;
  int64_t tiles = 0, narrowest = cuda::kSkinnyMaxTiles;
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor &w = *ws[i], &y = *ys[i];
    DS_CHECK(w.dim(1) == K && y.dim(0) == T && y.dim(1) == w.dim(0), "linear shapes");
    const int64_t wt = (w.dim(0) + cuda::kSkinnyTileRows - 1) / cuda::kSkinnyTileRows;
    tiles += wt;
    narrowest = std::min(narrowest, wt);
    skinny = skinny && cuda::skinny_supported(x.data, w.data, y.data, t, k);
    gemv = gemv && cuda::gemv_supported(x.data, w.data, t, k);
  }
  skinny = skinny && tiles <= cuda::kSkinnyMaxTiles && cuda::skinny_gemm_pays(t, tiles, narrowest);
  return skinny ? LinearRoute::kSkinny : gemv ? LinearRoute::kGemv : LinearRoute::kCublasLt;
}

void CudaBackend::linear_multi(const Tensor& x, std::span<const Tensor* const> ws,
                               std::span<const Tensor* const> ys) {
  const LinearRoute route = linear_route(x, ws, ys);
  const int64_t T = x.dim(0), K = x.dim(1);
  const int t = static_cast<int>(T), k = static_cast<int>(K), count = static_cast<int>(ws.size());
  OpTimer timer(*this, "linear");
  if (route == LinearRoute::kSkinny) {
    cuda::SkinnyGroup g[cuda::kSkinnyMaxGroups];
    for (int i = 0; i < count; ++i)
      g[i] = {bf(*ws[i]), bf(*ys[i]), static_cast<int>(ws[i]->dim(0))};
    return check(cuda::launch_skinny_gemm_bf16(bf(x), g, count, t, k, skinny_ws_, num_sms_, stream_,
                                               next_projection(*ws[0])),
                 "skinny GEMM launch");
  }
  if (route == LinearRoute::kGemv) {
    cuda::GemvGroups g{};
    for (int i = 0; i < count; ++i) {
      g.w[i] = bf(*ws[i]);
      g.y[i] = bf(*ys[i]);
      g.n[i] = static_cast<int>(ws[i]->dim(0));
    }
    g.count = count;
    return cuda::launch_gemv_multi_bf16(bf(x), g, t, k, stream_);
  }
  for (int i = 0; i < count; ++i)
    gemm_->run(bf(x), bf(*ws[i]), bf(*ys[i]), T, K, ws[i]->dim(0), stream_);
}

// On cuBLASLt the projection is added to the residual by the GEMM (beta = 1: summed in f32, rounded
// once), then the norm alone; the other routes as the default.
void CudaBackend::linear_add_rms_norm(const Tensor& x, const Tensor& w, const Tensor& residual,
                                      const Tensor& norm_w, float eps, const Tensor& out,
                                      const Tensor& scratch) {
  const Tensor* ws[1] = {&w};
  const Tensor* ys[1] = {&residual};
  if (linear_route(x, ws, ys) != LinearRoute::kCublasLt)
    return Backend::linear_add_rms_norm(x, w, residual, norm_w, eps, out, scratch);
  {
    OpTimer timer(*this, "linear");
    gemm_->run(bf(x), bf(w), bf(residual), x.dim(0), x.dim(1), w.dim(0), stream_, true);
  }
  rms_norm(residual, norm_w, eps, out);
}

// Each entry's successor as the weight-streaming GEMM pulls it: only groups it could stream
// itself (aligned, K a multiple of 8, at most kSkinnyMaxGroups), else none.
void CudaBackend::set_projection_order(std::span<const std::vector<const Tensor*>> order) {
  next_projection_.clear();
  if (skinny_prefetch_units_ == 0) return;
  for (size_t i = 0; i < order.size(); ++i) {
    const std::vector<const Tensor*>& cur = order[i];
    const std::vector<const Tensor*>& nx = order[(i + 1) % order.size()];
    if (cur.empty() || nx.empty() || nx.size() > cuda::kSkinnyMaxGroups) continue;
    cuda::SkinnyNext n;
    n.K = static_cast<int>(nx[0]->dim(1));
    n.units_per_block = skinny_prefetch_units_;
    n.evict_first = skinny_evict_first_;
    bool ok = true;
    for (const Tensor* w : nx) {
      ok = ok && w->dtype == DType::kBF16 && w->dim(1) == n.K &&
           cuda::skinny_supported(w->data, w->data, w->data, 1, n.K);
      if (ok) n.groups[n.count++] = {bf(*w), nullptr, static_cast<int>(w->dim(0))};
    }
    if (ok) next_projection_[cur[0]->data] = n;
  }
}

const cuda::SkinnyNext* CudaBackend::next_projection(const Tensor& w) const {
  const auto it = next_projection_.find(w.data);
  return it == next_projection_.end() ? nullptr : &it->second;
}

}  // namespace deltaserve::backend
