// CudaBackend's projections: the route of a projection group (the weight-streaming GEMM, the GEMV
// kernel or cuBLASLt), and the forms that fold neighbouring ops into the GEMM — the residual add,
// the input's RMSNorm, the MLP's SiLU-mul.
#include <algorithm>
#include <optional>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_detail.h"
#include "backend/cuda/gemm_pair.h"
#include "backend/cuda/kernels/gemm_silu_mul.cuh"
#include "backend/cuda/kernels/gemv.cuh"
#include "backend/cuda/kernels/silu_mul.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "core/error.h"

namespace deltaserve::backend {

using cuda_detail::bf;
using cuda_detail::check;
using cuda_detail::f32;

void CudaBackend::set_linear_tuning(int64_t min_rows) {
  if (gemm_tuning_) gemm_->set_tuning(min_rows);
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
  std::optional<OpTimer> timer;
  if (route != LinearRoute::kCublasLt || !shape_labels_) timer.emplace(*this, "linear");
  if (route == LinearRoute::kSkinny) return skinny_linear(x, ws, ys, {});
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
  for (int i = 0; i < count; ++i) {
    const int64_t n = ws[i]->dim(0);
    std::optional<OpTimer> gemm_timer;
    const std::optional<GemmPair> pair = i + 1 < count && batch_pairs_
                                             ? gemm_pair(*ws[i], *ys[i], *ws[i + 1], *ys[i + 1])
                                             : std::nullopt;
    if (shape_labels_) gemm_timer.emplace(*this, linear_label(pair ? "linear x2" : "linear", n, K));
    if (!pair) {
      gemm_->run(bf(x), bf(*ws[i]), bf(*ys[i]), T, K, n, stream_);
      continue;
    }
    gemm_->run_batched(bf(x), pair->w, pair->y, T, K, n, 2, pair->w_stride, pair->y_stride,
                       stream_);
    ++i;
  }
}

void CudaBackend::skinny_linear(const Tensor& x, std::span<const Tensor* const> ws,
                                std::span<const Tensor* const> ys,
                                const cuda::SkinnyOptions& opt) {
  cuda::SkinnyGroup g[cuda::kSkinnyMaxGroups];
  const int count = static_cast<int>(ws.size());
  for (int i = 0; i < count; ++i) g[i] = {bf(*ws[i]), bf(*ys[i]), static_cast<int>(ws[i]->dim(0))};
  check(cuda::launch_skinny_gemm_bf16(bf(x), g, count, static_cast<int>(x.dim(0)),
                                      static_cast<int>(x.dim(1)), skinny_ws_, num_sms_, stream_,
                                      opt),
        "skinny GEMM launch");
}

bool CudaBackend::fuses_norm(const ProjInput& in) const {
  if (!in.norm || !fused_norms_) return false;
  DS_CHECK(in.x.dim(0) == in.h.dim(0) && in.x.dim(1) == in.h.dim(1) &&
               in.norm->numel() == in.x.dim(1),
           "a projection input's rows x and h [T, H], its norm [H]");
  return in.norm->dtype == DType::kF32 &&
         cuda::skinny_norm_supported(in.norm->data, static_cast<int>(in.x.dim(0)),
                                     static_cast<int>(in.x.dim(1)));
}

// The weight-streaming GEMM forms the norm itself where it takes the group and the norm fits
// (cuda::skinny_norm_supported); else the norm kernel into h, then the projections.
void CudaBackend::norm_linear_multi(const ProjInput& in, std::span<const Tensor* const> ws,
                                    std::span<const Tensor* const> ys) {
  if (!fuses_norm(in) || linear_route(in.x, ws, ys) != LinearRoute::kSkinny)
    return Backend::norm_linear_multi(in, ws, ys);
  OpTimer timer(*this, "linear");
  skinny_linear(in.x, ws, ys, {.norm_w = f32(*in.norm), .eps = in.eps});
}

void CudaBackend::norm_linear_silu_mul(const ProjInput& in, const Tensor& w_gate,
                                       const Tensor& w_up, const Tensor& gate_up,
                                       const Tensor& act) {
  if (!fuses_norm(in) || !silu_mul_in_skinny_gemm(in.x, w_gate, w_up, gate_up, act))
    return Backend::norm_linear_silu_mul(in, w_gate, w_up, gate_up, act);
  OpTimer timer(*this, "linear");
  check(cuda::launch_skinny_gemm_silu_mul_bf16(
            bf(in.x), bf(w_gate), bf(w_up), bf(act), static_cast<int>(in.x.dim(0)),
            static_cast<int>(in.x.dim(1)), static_cast<int>(w_gate.dim(0)), skinny_ws_, num_sms_,
            stream_, {.norm_w = f32(*in.norm), .eps = in.eps}),
        "skinny GEMM + SiLU-mul launch");
}

// Added inside the GEMM on every route: the weight-streaming GEMM's (where it takes the
// projection) or cuBLASLt's (beta = 1); both sum in f32 and round once. `scratch` unused.
void CudaBackend::linear_add(const Tensor& x, const Tensor& w, const Tensor& residual,
                             const Tensor& scratch) {
  (void)scratch;
  const Tensor* ws[1] = {&w};
  const Tensor* ys[1] = {&residual};
  if (linear_route(x, ws, ys) == LinearRoute::kSkinny) {
    OpTimer timer(*this, "linear");
    return skinny_linear(x, ws, ys, {.accumulate = true});
  }
  OpTimer timer(*this, linear_label("linear+add", w.dim(0), x.dim(1)));
  gemm_->run(bf(x), bf(w), bf(residual), x.dim(0), x.dim(1), w.dim(0), stream_, true);
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
    OpTimer timer(*this, linear_label("linear+add", w.dim(0), x.dim(1)));
    gemm_->run(bf(x), bf(w), bf(residual), x.dim(0), x.dim(1), w.dim(0), stream_, true);
  }
  rms_norm(residual, norm_w, eps, out);
}

bool CudaBackend::silu_mul_in_skinny_gemm(const Tensor& x, const Tensor& w_gate,
                                          const Tensor& w_up, const Tensor& gate_up,
                                          const Tensor& act) const {
  const int64_t T = x.dim(0), I = w_gate.dim(0);
  DS_CHECK(
      w_up.dim(0) == I && act.dim(0) == T && act.dim(1) == I && gate_up.numel() == 2 * act.numel(),
      "linear_silu_mul: gate / up weights [I, H], gate_up [T, 2 I], act [T, I]");
  const auto [gate, up] = gate_up_halves(gate_up, T, I);
  const Tensor* ws[] = {&w_gate, &w_up};
  const Tensor* ys[] = {&gate, &up};
  // linear_route checks x, the weights and the two halves; the fused form writes act instead.
  return fused_silu_mul_ && T <= cuda::kSkinnySiluMulMaxRows &&
         linear_route(x, ws, ys) == LinearRoute::kSkinny &&
         cuda::skinny_supported(x.data, w_up.data, act.data, static_cast<int>(T),
                                static_cast<int>(x.dim(1)));
}

void CudaBackend::linear_silu_mul(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                  const Tensor& gate_up, const Tensor& act) {
  const int64_t T = x.dim(0), K = x.dim(1), I = w_gate.dim(0);
  const bool in_skinny = silu_mul_in_skinny_gemm(x, w_gate, w_up, gate_up, act);  // checks shapes
  const auto [gate, up] = gate_up_halves(gate_up, T, I);
  const Tensor* ws[] = {&w_gate, &w_up};
  const Tensor* ys[] = {&gate, &up};
  const LinearRoute route = linear_route(x, ws, ys);
  if (in_skinny) {
    OpTimer timer(*this, "linear");
    return check(cuda::launch_skinny_gemm_silu_mul_bf16(
                     bf(x), bf(w_gate), bf(w_up), bf(act), static_cast<int>(T), static_cast<int>(K),
                     static_cast<int>(I), skinny_ws_, num_sms_, stream_),
                 "skinny GEMM + SiLU-mul launch");
  }
  if (route == LinearRoute::kCublasLt && fused_silu_mul_ && T >= cuda::kGemmSiluMulMinRows &&
      cuda::gemm_silu_mul_supported(x.data, w_gate.data, w_up.data, act.data, T, K, I)) {
    OpTimer timer(*this, linear_label("linear_silu_mul", 2 * I, K));
    return check(cuda::launch_gemm_silu_mul_bf16(bf(x), bf(w_gate), bf(w_up), bf(act),
                                                 static_cast<int>(T), static_cast<int>(K),
                                                 static_cast<int>(I), num_sms_, stream_),
                 "GEMM + SiLU-mul launch");
  }
  const bool adjacent = static_cast<const std::byte*>(w_up.data) ==
                        static_cast<const std::byte*>(w_gate.data) + w_gate.nbytes();
  if (route != LinearRoute::kCublasLt || !adjacent || !one_gate_up_gemm_)
    return Backend::linear_silu_mul(x, w_gate, w_up, gate_up, act);
  {
    OpTimer timer(*this, "linear");
    gemm_->run(bf(x), bf(w_gate), bf(gate_up), T, K, 2 * I, stream_);
  }
  OpTimer timer(*this, "silu_mul");
  cuda::launch_silu_mul_halves_bf16(bf(gate_up), T, I, bf(act), stream_);
}

}  // namespace deltaserve::backend
