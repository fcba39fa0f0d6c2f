// CudaBackend's projections fused with their neighbours: a residual projection with the residual
// add and RMSNorm after it (linear_add_rms_norm), and the MLP's gate and up projections with the
// SiLU-mul (linear_silu_mul).
#include <cstddef>

#include "backend/cuda/cublaslt_linear.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_detail.h"
#include "backend/cuda/kernels/gemm_silu_mul.cuh"
#include "backend/cuda/kernels/rms_norm.cuh"
#include "backend/cuda/kernels/silu_mul.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"

namespace deltaserve::backend {

using cuda_detail::bf;
using cuda_detail::check;
using cuda_detail::f32;

// From partials_min_rows_ rows (9 by default) on the weight-streaming GEMM (and up to
// partials_rows_ rows, 32 by default, on any route) the split tiles' partials are summed by the
// add + norm kernel where its form applies
// (add_norm_of_partials); on cuBLASLt the projection is added to the residual by the GEMM (beta =
// 1: summed in f32, rounded once), then the norm alone; else as the default.
void CudaBackend::linear_add_rms_norm(const Tensor& x, const Tensor& w, const Tensor& residual,
                                      const Tensor& norm_w, float eps, const Tensor& out,
                                      const Tensor& scratch) {
  const Tensor* ws[1] = {&w};
  const Tensor* ys[1] = {&residual};
  const LinearRoute route = linear_route(x, ws, ys);
  const bool partials = norm_sums_partials_ && skinny_gemm_ && x.dim(0) >= partials_min_rows_ &&
                        (route == LinearRoute::kSkinny || x.dim(0) <= partials_rows_);
  if (partials && add_norm_of_partials(x, w, residual, norm_w, eps, out, scratch)) return;
  if (route != LinearRoute::kCublasLt)
    return Backend::linear_add_rms_norm(x, w, residual, norm_w, eps, out, scratch);
  {
    OpTimer timer(*this, linear_label("linear+add", w.dim(0), x.dim(1)));
    gemm_->run(bf(x), bf(w), bf(residual), x.dim(0), x.dim(1), w.dim(0), stream_, true);
  }
  rms_norm(residual, norm_w, eps, out);
}

bool CudaBackend::add_norm_of_partials(const Tensor& x, const Tensor& w, const Tensor& residual,
                                       const Tensor& norm_w, float eps, const Tensor& out,
                                       const Tensor& scratch) {
  const int T = static_cast<int>(x.dim(0)), K = static_cast<int>(x.dim(1));
  const int n = static_cast<int>(w.dim(0));
  DS_CHECK(scratch.dim(0) == T && scratch.dim(1) == n && residual.numel() == scratch.numel() &&
               out.numel() == scratch.numel(),
           "linear_add_rms_norm: residual, out and scratch [T, H]");
  cuda::SkinnyPartials where{skinny_ws_.partials, bf(scratch), n, 0, 0, 0};
  if (!cuda::skinny_supported(x.data, w.data, scratch.data, T, K) ||
      !cuda::add_rms_norm_partials_supported(bf(residual), where, f32(norm_w), T, bf(out)))
    return false;
  {
    OpTimer timer(*this, "linear");
    const cuda::SkinnyGroup group{bf(w), bf(scratch), n};
    check(cuda::launch_skinny_gemm_partials_bf16(bf(x), group, T, K, skinny_ws_, num_sms_, stream_,
                                                 &where),
          "skinny GEMM (partials only) launch");
  }
  OpTimer timer(*this, "add_rms_norm");
  check(cuda::launch_add_rms_norm_partials_bf16(bf(residual), where, f32(norm_w), eps, T, bf(out),
                                                stream_),
        "add + RMSNorm of GEMM partials launch");
  return true;
}

void CudaBackend::linear_silu_mul(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                  const Tensor& gate_up, const Tensor& act) {
  const int64_t T = x.dim(0), K = x.dim(1), I = w_gate.dim(0);
  DS_CHECK(
      w_up.dim(0) == I && act.dim(0) == T && act.dim(1) == I && gate_up.numel() == 2 * act.numel(),
      "linear_silu_mul: gate / up weights [I, H], gate_up [T, 2 I], act [T, I]");
  const auto [gate, up] = gate_up_halves(gate_up, T, I);
  const Tensor* ws[] = {&w_gate, &w_up};
  const Tensor* ys[] = {&gate, &up};
  // linear_route checks x, the weights and the two halves; the fused form writes act instead.
  const LinearRoute route = linear_route(x, ws, ys);
  if (route == LinearRoute::kSkinny && fused_silu_mul_ && T <= cuda::kSkinnySiluMulMaxRows &&
      cuda::skinny_supported(x.data, w_up.data, act.data, static_cast<int>(T),
                             static_cast<int>(K))) {
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
