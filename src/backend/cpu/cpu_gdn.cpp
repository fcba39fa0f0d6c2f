// CPU Gated DeltaNet: causal depthwise conv with conv state, and the gated delta rule
// (chunkwise WY form for prefill, token recurrence for decode) with slot-indexed state, f32 or
// bf16 between steps (each step computes in f32).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deltaserve::backend {

namespace cpu {

void delta_rule_recurrent(int T, int dk, int dv, const float* q, const float* k, const float* v,
                          const float* g, const float* beta, float* S, float* o) {
  std::vector<float> m(static_cast<size_t>(dv));
  for (int t = 0; t < T; ++t) {
    const float* kt = k + t * dk;
    const float alpha = std::exp(g[t]);
    std::fill(m.begin(), m.end(), 0.0f);
    for (int i = 0; i < dk; ++i) {
      float* row = S + i * dv;
      for (int j = 0; j < dv; ++j) {
        row[j] *= alpha;
        m[j] += row[j] * kt[i];
      }
    }
    for (int j = 0; j < dv; ++j) m[j] = beta[t] * (v[t * dv + j] - m[j]);  // delta
    float* ot = o + t * dv;
    std::fill(ot, ot + dv, 0.0f);
    for (int i = 0; i < dk; ++i) {
      float* row = S + i * dv;
      const float qi = q[t * dk + i];
      for (int j = 0; j < dv; ++j) {
        row[j] += kt[i] * m[j];
        ot[j] += row[j] * qi;
      }
    }
  }
}

void delta_rule_chunked(int T, int dk, int dv, const float* q, const float* k, const float* v,
                        const float* g, const float* beta, float* S, float* o, int chunk) {
  std::vector<float> gam(static_cast<size_t>(chunk)), L(static_cast<size_t>(chunk * chunk));
  std::vector<float> U(static_cast<size_t>(chunk * dv)), W(static_cast<size_t>(chunk * dk));
  for (int c0 = 0; c0 < T; c0 += chunk) {
    const int c = std::min(chunk, T - c0);
    if (c == 1) {  // a one-token chunk: the recurrence, so any split of a sequence at a chunk
                   // boundary (a prefix-cache resume) computes exactly what one call would
      delta_rule_recurrent(1, dk, dv, q + c0 * dk, k + c0 * dk, v + c0 * dv, g + c0, beta + c0, S,
                           o + c0 * dv);
      continue;
    }
    const float *Q = q + c0 * dk, *K = k + c0 * dk, *V = v + c0 * dv, *B = beta + c0;
    float acc = 0;
    for (int i = 0; i < c; ++i) gam[i] = acc += g[c0 + i];
    // L_ij = beta_i (k_i . k_j) exp(gam_i - gam_j), j < i; U = (I + L)^-1 diag(beta) V and
    // W = (I + L)^-1 diag(beta e^gam) K by forward substitution.
    for (int i = 0; i < c; ++i) {
      for (int j = 0; j < i; ++j) {
        float dot = 0;
        for (int x = 0; x < dk; ++x) dot += K[i * dk + x] * K[j * dk + x];
        L[i * chunk + j] = B[i] * dot * std::exp(gam[i] - gam[j]);
      }
      float* u = &U[static_cast<size_t>(i * dv)];
      float* w = &W[static_cast<size_t>(i * dk)];
      const float eg = std::exp(gam[i]);
      for (int x = 0; x < dv; ++x) u[x] = B[i] * V[i * dv + x];
      for (int x = 0; x < dk; ++x) w[x] = B[i] * eg * K[i * dk + x];
      for (int j = 0; j < i; ++j) {
        const float l = L[i * chunk + j];
        const float* uj = &U[static_cast<size_t>(j * dv)];
        const float* wj = &W[static_cast<size_t>(j * dk)];
        for (int x = 0; x < dv; ++x) u[x] -= l * uj[x];
        for (int x = 0; x < dk; ++x) w[x] -= l * wj[x];
      }
    }
    // V' = U - W S (stored in U).
    for (int i = 0; i < c; ++i) {
      float* u = &U[static_cast<size_t>(i * dv)];
      for (int x = 0; x < dk; ++x) {
        const float wx = W[static_cast<size_t>(i * dk + x)];
        const float* srow = S + x * dv;
        for (int y = 0; y < dv; ++y) u[y] -= wx * srow[y];
      }
    }
    // O_i = e^gam_i q_i S + sum_{j<=i} (q_i . k_j) exp(gam_i - gam_j) V'_j.
    for (int i = 0; i < c; ++i) {
      float* ot = o + (c0 + i) * dv;
      std::fill(ot, ot + dv, 0.0f);
      const float eg = std::exp(gam[i]);
      for (int x = 0; x < dk; ++x) {
        const float qx = Q[i * dk + x] * eg;
        const float* srow = S + x * dv;
        for (int y = 0; y < dv; ++y) ot[y] += qx * srow[y];
      }
      for (int j = 0; j <= i; ++j) {
        float dot = 0;
        for (int x = 0; x < dk; ++x) dot += Q[i * dk + x] * K[j * dk + x];
        const float p = dot * std::exp(gam[i] - gam[j]);
        const float* uj = &U[static_cast<size_t>(j * dv)];
        for (int y = 0; y < dv; ++y) ot[y] += p * uj[y];
      }
    }
    // S = e^gam_c S + sum_j e^(gam_c - gam_j) k_j V'_j^T.
    const float ec = std::exp(gam[c - 1]);
    for (int x = 0; x < dk; ++x) {
      float* srow = S + x * dv;
      for (int y = 0; y < dv; ++y) srow[y] *= ec;
    }
    for (int j = 0; j < c; ++j) {
      const float e = std::exp(gam[c - 1] - gam[j]);
      const float* uj = &U[static_cast<size_t>(j * dv)];
      for (int x = 0; x < dk; ++x) {
        const float kx = K[j * dk + x] * e;
        float* srow = S + x * dv;
        for (int y = 0; y < dv; ++y) srow[y] += kx * uj[y];
      }
    }
  }
}

}  // namespace cpu

void CpuBackend::gdn_conv(const StepBatch& batch, const Tensor& u, const Tensor& w,
                          const Tensor& conv_state, int32_t K, const Tensor& y) {
  const int64_t C = u.dim(1);
  const int km1 = K - 1;
  for (const StepSeq& seq : batch.seqs()) {
    float* st = conv_state.f32() + static_cast<int64_t>(seq.slot) * C * km1;
#pragma omp parallel for
    for (int64_t ch = 0; ch < C; ++ch) {
      // window = [state (K-1, oldest first) | this chunk's inputs]
      std::vector<float> win(static_cast<size_t>(km1 + seq.num_tokens));
      for (int i = 0; i < km1; ++i) win[i] = seq.fresh() ? 0.0f : st[ch * km1 + i];
      for (int t = 0; t < seq.num_tokens; ++t)
        win[km1 + t] = u.f32()[(seq.token_begin + t) * C + ch];
      const float* wc = w.f32() + ch * K;
      for (int t = 0; t < seq.num_tokens; ++t) {
        float acc = 0;
        for (int i = 0; i < K; ++i) acc += wc[i] * win[t + i];
        y.f32()[(seq.token_begin + t) * C + ch] = acc / (1.0f + std::exp(-acc));
      }
      if (seq.mid_snapshot >= 0) {  // the inputs before the in-step snapshot point
        float* snap = conv_state.f32() + (static_cast<int64_t>(seq.mid_snapshot) * C + ch) * km1;
        for (int i = 0; i < km1; ++i) snap[i] = win[seq.mid_snapshot_at + i];
      }
      for (int i = 0; i < km1; ++i) st[ch * km1 + i] = win[seq.num_tokens + i];
    }
  }
}

namespace {

void l2norm(float* x, int n, float scale) {
  float ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = scale / std::sqrt(ss + 1e-6f);
  for (int i = 0; i < n; ++i) x[i] *= r;
}

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// The recurrent state [dk, dv] of (slot, head h) as f32 for a step's math: a pointer into `state`
// when it is f32, else `work` converted from its bf16 values (store_state rounds them back).
float* load_state(const Tensor& state, int64_t slot, int h, const GdnDims& d,
                  std::vector<float>& work) {
  const int64_t n = int64_t{d.dk} * d.dv, at = (slot * d.nv + h) * n;
  if (state.dtype == DType::kF32) return state.f32() + at;
  const uint16_t* src = static_cast<const uint16_t*>(state.data) + at;
  work.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) work[static_cast<size_t>(i)] = bf16_to_f32(src[i]);
  return work.data();
}

// S [dk, dv] into (slot, head h) of `state` (rounded to bf16 when the state is bf16).
void store_state(const Tensor& state, int64_t slot, int h, const GdnDims& d, const float* S) {
  const int64_t n = int64_t{d.dk} * d.dv, at = (slot * d.nv + h) * n;
  if (state.dtype == DType::kF32) {
    if (state.f32() + at != S) std::copy(S, S + n, state.f32() + at);
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(state.data) + at;
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(S[i]);
}

}  // namespace

void CpuBackend::gated_delta_rule(const StepBatch& batch, const Tensor& y, const Tensor& a,
                                  const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                                  const Tensor& state, const GdnDims& d, const Tensor& out) {
  const int64_t C = y.dim(1), key_dim = int64_t{d.nk} * d.dk;
  const int rep = d.nv / d.nk;
  const int64_t nseq = batch.num_seqs();
  const float qscale = 1.0f / std::sqrt(static_cast<float>(d.dk));
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t s = 0; s < nseq; ++s) {
    for (int h = 0; h < d.nv; ++h) {
      const StepSeq& seq = batch.seq(static_cast<size_t>(s));
      const int T = seq.num_tokens, kh = h / rep;
      std::vector<float> q(static_cast<size_t>(T * d.dk)), k(q.size()),
          v(static_cast<size_t>(T * d.dv));
      std::vector<float> g(static_cast<size_t>(T)), beta(g.size());
      for (int t = 0; t < T; ++t) {
        const float* row = y.f32() + (seq.token_begin + t) * C;
        std::memcpy(&q[t * d.dk], row + kh * d.dk, sizeof(float) * d.dk);
        std::memcpy(&k[t * d.dk], row + key_dim + kh * d.dk, sizeof(float) * d.dk);
        std::memcpy(&v[t * d.dv], row + 2 * key_dim + h * d.dv, sizeof(float) * d.dv);
        l2norm(&q[t * d.dk], d.dk, qscale);
        l2norm(&k[t * d.dk], d.dk, 1.0f);
        const int64_t gi = (seq.token_begin + t) * d.nv + h;
        beta[t] = 1.0f / (1.0f + std::exp(-b.f32()[gi]));
        g[t] = -std::exp(A_log.f32()[h]) * softplus(a.f32()[gi] + dt_bias.f32()[h]);
      }
      std::vector<float> work;
      float* S = load_state(state, seq.slot, h, d, work);
      if (seq.fresh()) std::fill(S, S + d.dk * d.dv, 0.0f);
      std::vector<float> o(static_cast<size_t>(T * d.dv));
      if (T == 1) {
        cpu::delta_rule_recurrent(T, d.dk, d.dv, q.data(), k.data(), v.data(), g.data(),
                                  beta.data(), S, o.data());
      } else {
        // An in-step snapshot (at a multiple of the chunk, so the split changes nothing): the
        // tokens before it, the state copied out, then the rest.
        const int at = seq.mid_snapshot >= 0 ? seq.mid_snapshot_at : 0;
        if (at > 0) {
          cpu::delta_rule_chunked(at, d.dk, d.dv, q.data(), k.data(), v.data(), g.data(),
                                  beta.data(), S, o.data());
          store_state(state, seq.mid_snapshot, h, d, S);
        }
        cpu::delta_rule_chunked(T - at, d.dk, d.dv, q.data() + at * d.dk, k.data() + at * d.dk,
                                v.data() + at * d.dv, g.data() + at, beta.data() + at, S,
                                o.data() + at * d.dv);
      }
      store_state(state, seq.slot, h, d, S);
      for (int t = 0; t < T; ++t)
        std::memcpy(out.f32() + ((seq.token_begin + t) * d.nv + h) * d.dv, &o[t * d.dv],
                    sizeof(float) * d.dv);
    }
  }
}

}  // namespace deltaserve::backend
