// CPU full attention: q/k norm + partial RoPE + paged KV write, and causal paged GQA attention.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deltaserve::backend {

namespace cpu {

void rope_cos_sin(int32_t pos, int rotary_dim, double theta, float* cos_out, float* sin_out) {
  // HF: inv_freq = 1 / theta ** (arange(0, rd, 2) / rd) in f32; angle = inv_freq * pos in f32.
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    const float inv = 1.0f / std::pow(static_cast<float>(theta), expo);
    const float ang = inv * static_cast<float>(pos);
    cos_out[i] = cos_out[i + half] = std::cos(ang);
    sin_out[i] = sin_out[i + half] = std::sin(ang);
  }
}

}  // namespace cpu

namespace {

// x [hd]: zero-centred RMSNorm, then NeoX rotate-half RoPE on dims [0, rd).
void norm_rope(float* x, const float* w, float eps, int hd, int rd, const float* c,
               const float* s) {
  float ss = 0;
  for (int i = 0; i < hd; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(hd) + eps);
  for (int i = 0; i < hd; ++i) x[i] = x[i] * r * (1.0f + w[i]);
  const int half = rd / 2;
  for (int i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c[i] - x2 * s[i];
    x[i + half] = x2 * c[i + half] + x1 * s[i + half];
  }
}

// Row `at` (element offset) of a KV cache in f32 (the activations') or fp8 e4m3
// (--kv-cache-dtype fp8: rounded to nearest, saturated at +-448, scale 1).
void store_kv_row(const Tensor& cache, int64_t at, const float* x, int hd) {
  if (cache.dtype == DType::kFP8E4M3) {
    uint8_t* dst = cache.ptr<uint8_t>() + at;
    for (int i = 0; i < hd; ++i) dst[i] = f32_to_fp8e4m3(x[i]);
    return;
  }
  float* dst = cache.f32() + at;
  for (int i = 0; i < hd; ++i) dst[i] = x[i];
}

// The row's values as f32: in place, or widened into `tmp` [hd] from fp8.
const float* load_kv_row(const Tensor& cache, int64_t at, int hd, float* tmp) {
  if (cache.dtype != DType::kFP8E4M3) return cache.f32() + at;
  const uint8_t* src = cache.ptr<uint8_t>() + at;
  for (int i = 0; i < hd; ++i) tmp[i] = fp8e4m3_to_f32(src[i]);
  return tmp;
}

}  // namespace

void CpuBackend::attn_prep_and_cache(const StepBatch& batch, const Tensor& qg, const Tensor& k,
                                     const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                                     const AttnDims& d, const Tensor& q, const Tensor& gate,
                                     const Tensor& k_cache, const Tensor& v_cache) {
  const int64_t T = batch.num_tokens();
  const int hd = d.hd, rd = d.rotary_dim, ps = batch.page_size();
  const std::vector<int32_t>& seq_of = token_seq(batch);
#pragma omp parallel for
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> c(static_cast<size_t>(rd)), s(static_cast<size_t>(rd));
    const int32_t pos = batch.positions()[static_cast<size_t>(t)];
    cpu::rope_cos_sin(pos, rd, d.rope_theta, c.data(), s.data());
    for (int h = 0; h < d.nh; ++h) {
      const float* src = qg.f32() + (t * d.nh + h) * 2 * hd;
      float* qd = q.f32() + (t * d.nh + h) * hd;
      for (int i = 0; i < hd; ++i) qd[i] = src[i];
      if (!gate.empty()) std::copy(src + hd, src + 2 * hd, gate.f32() + (t * d.nh + h) * hd);
      norm_rope(qd, q_norm.f32(), d.eps, hd, rd, c.data(), s.data());
    }
    const auto pages = batch.pages(static_cast<size_t>(seq_of[static_cast<size_t>(t)]));
    const int64_t page = pages[static_cast<size_t>(pos / ps)];
    const int64_t row = page * ps + pos % ps;
    for (int h = 0; h < d.nkv; ++h) {
      float* kd = k.f32() + (t * d.nkv + h) * hd;
      norm_rope(kd, k_norm.f32(), d.eps, hd, rd, c.data(), s.data());
      store_kv_row(k_cache, (row * d.nkv + h) * hd, kd, hd);
      store_kv_row(v_cache, (row * d.nkv + h) * hd, v.f32() + (t * d.nkv + h) * hd, hd);
    }
  }
}

void CpuBackend::paged_attention(const StepBatch& batch, const Tensor& q, const Tensor& gate,
                                 const Tensor& k_cache, const Tensor& v_cache, const AttnDims& d,
                                 const Tensor& out) {
  const int64_t T = batch.num_tokens();
  const int hd = d.hd, ps = batch.page_size(), group = d.nh / d.nkv;
  const std::vector<int32_t>& seq_of = token_seq(batch);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const GateRows gr = gate_rows(gate, T, d);
#pragma omp parallel for collapse(2) schedule(dynamic, 4)
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < d.nh; ++h) {
      const auto pages = batch.pages(static_cast<size_t>(seq_of[static_cast<size_t>(t)]));
      const int32_t n = batch.positions()[static_cast<size_t>(t)] + 1;  // causal: [0, pos]
      const int kvh = h / group;
      const float* qv = q.f32() + (t * d.nh + h) * hd;
      std::vector<float> sc(static_cast<size_t>(n));
      std::vector<float> acc(static_cast<size_t>(hd), 0.0f), tmp(static_cast<size_t>(hd));
      float mx = -INFINITY;
      for (int32_t p = 0; p < n; ++p) {
        const int64_t row = pages[static_cast<size_t>(p / ps)] * ps + p % ps;
        const float* kv = load_kv_row(k_cache, (row * d.nkv + kvh) * hd, hd, tmp.data());
        float dot = 0;
        for (int i = 0; i < hd; ++i) dot += qv[i] * kv[i];
        sc[p] = dot * scale;
        mx = std::max(mx, sc[p]);
      }
      float sum = 0;
      for (int32_t p = 0; p < n; ++p) {
        sc[p] = std::exp(sc[p] - mx);
        sum += sc[p];
      }
      for (int32_t p = 0; p < n; ++p) {
        const int64_t row = pages[static_cast<size_t>(p / ps)] * ps + p % ps;
        const float* vv = load_kv_row(v_cache, (row * d.nkv + kvh) * hd, hd, tmp.data());
        const float wgt = sc[p] / sum;
        for (int i = 0; i < hd; ++i) acc[i] += wgt * vv[i];
      }
      const float* g = gate.f32() + (t * d.nh + h) * gr.stride + gr.offset;
      float* o = out.f32() + (t * d.nh + h) * hd;
      for (int i = 0; i < hd; ++i) o[i] = acc[i] / (1.0f + std::exp(-g[i]));
    }
  }
}

}  // namespace deltaserve::backend
