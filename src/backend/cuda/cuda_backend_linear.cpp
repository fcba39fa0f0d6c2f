// CudaBackend's projections: the route each takes (weight-streaming GEMM, GEMV or cuBLASLt), the
// grouped and paired projections, the MLP's fused forms (SiLU-mul in the GEMM; both of a decode
// step's MLP projections in one launch) and the residual add in cuBLASLt's epilogue.
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
  if (route == LinearRoute::kSkinny) {
    cuda::SkinnyGroup g[cuda::kSkinnyMaxGroups];
    for (int i = 0; i < count; ++i)
      g[i] = {bf(*ws[i]), bf(*ys[i]), static_cast<int>(ws[i]->dim(0))};
    return check(
        cuda::launch_skinny_gemm_bf16(bf(x), g, count, t, k, skinny_ws_, num_sms_, stream_),
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

bool CudaBackend::skinny_silu_mul_route(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                        const Tensor& gate_up, const Tensor& act) const {
  const int64_t T = x.dim(0), K = x.dim(1), I = w_gate.dim(0);
  DS_CHECK(
      w_up.dim(0) == I && act.dim(0) == T && act.dim(1) == I && gate_up.numel() == 2 * act.numel(),
      "linear_silu_mul: gate / up weights [I, H], gate_up [T, 2 I], act [T, I]");
  const auto [gate, up] = gate_up_halves(gate_up, T, I);
  const Tensor* ws[] = {&w_gate, &w_up};
  const Tensor* ys[] = {&gate, &up};
  // linear_route checks x, the weights and the two halves; the fused form writes act instead.
  return linear_route(x, ws, ys) == LinearRoute::kSkinny && fused_silu_mul_ &&
         T <= cuda::kSkinnySiluMulMaxRows &&
         cuda::skinny_supported(x.data, w_up.data, act.data, static_cast<int>(T),
                                static_cast<int>(K));
}

void CudaBackend::linear_silu_mul(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                  const Tensor& gate_up, const Tensor& act) {
  const int64_t T = x.dim(0), K = x.dim(1), I = w_gate.dim(0);
  if (skinny_silu_mul_route(x, w_gate, w_up, gate_up, act)) {
    OpTimer timer(*this, "linear");
    return check(cuda::launch_skinny_gemm_silu_mul_bf16(
                     bf(x), bf(w_gate), bf(w_up), bf(act), static_cast<int>(T), static_cast<int>(K),
                     static_cast<int>(I), skinny_ws_, num_sms_, stream_),
                 "skinny GEMM + SiLU-mul launch");
  }
  const auto [gate, up] = gate_up_halves(gate_up, T, I);
  const Tensor* ws[] = {&w_gate, &w_up};
  const Tensor* ys[] = {&gate, &up};
  const LinearRoute route = linear_route(x, ws, ys);
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

void CudaBackend::mlp_add_rms_norm(const MlpTensors& m, const Tensor& residual,
                                   const Tensor& norm_w, float eps, const Tensor& out,
                                   const Tensor& scratch) {
  const int64_t T = m.x.dim(0), H = m.x.dim(1), I = m.w_gate.dim(0);
  DS_CHECK(
      m.w_down.dim(0) == H && m.w_down.dim(1) == I && scratch.dim(0) == T && scratch.dim(1) == H,
      "mlp_add_rms_norm: down weight [H, I], scratch [T, H]");
  if (!fused_mlp_ || !skinny_silu_mul_route(m.x, m.w_gate, m.w_up, m.gate_up, m.act) ||
      !cuda::skinny_mlp_supported(m.x.data, m.w_gate.data, m.w_up.data, m.w_down.data, m.act.data,
                                  scratch.data, static_cast<int>(T), static_cast<int>(H),
                                  static_cast<int>(I)))
    return Backend::mlp_add_rms_norm(m, residual, norm_w, eps, out, scratch);
  {
    OpTimer timer(*this, "linear");
    check(cuda::launch_skinny_mlp_bf16(bf(m.x), bf(m.w_gate), bf(m.w_up), bf(m.w_down), bf(m.act),
                                       bf(scratch), static_cast<int>(T), static_cast<int>(H),
                                       static_cast<int>(I), skinny_ws_, num_sms_, stream_),
          "skinny MLP launch");
  }
  add_rms_norm(residual, scratch, norm_w, eps, out);
}

void CudaBackend::silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  OpTimer timer(*this, "silu_mul");
  cuda::launch_silu_mul_bf16(bf(gate), bf(up), gate.numel(), bf(out), stream_);
}

}  // namespace deltaserve::backend
