#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace deltaserve::backend {

Buffer CpuBackend::alloc(DType t, std::initializer_list<int64_t> dims) {
  Buffer host = host_buffer(t, dims);
  const Tensor view = host.tensor();
  const int64_t bytes = static_cast<int64_t>(view.nbytes());
  *allocated_ += bytes;
  // Re-wrap: the memory is freed by the host buffer's deleter, the count drops with it.
  auto owner = std::make_shared<Buffer>(std::move(host));
  return Buffer(view, [owner, counter = allocated_, bytes](void*) mutable {
    owner.reset();
    *counter -= bytes;
  });
}

void CpuBackend::upload(DType src_type, const void* src, size_t n, const Tensor& dst) {
  DS_CHECK(dst.dtype == DType::kF32 && static_cast<size_t>(dst.numel()) == n, "upload shape");
  convert_to_f32(src_type, src, dst.f32(), n);
}

void CpuBackend::download_f32(const Tensor& src, float* dst) {
  convert_to_f32(src.dtype, src.data, dst, static_cast<size_t>(src.numel()));
}

void CpuBackend::upload_i32(const int32_t* src, const Tensor& dst) {
  std::memcpy(dst.i32(), src, dst.nbytes());
}

const std::vector<int32_t>& CpuBackend::token_seq(const StepBatch& batch) {
  if (token_seq_batch_ == batch.id() && batch.id() != 0) return token_seq_;
  token_seq_.assign(static_cast<size_t>(batch.num_tokens()), -1);
  for (size_t s = 0; s < batch.seqs().size(); ++s) {
    const StepSeq& q = batch.seq(s);
    for (int32_t i = 0; i < q.num_tokens; ++i) {
      DS_CHECK(token_seq_[static_cast<size_t>(q.token_begin + i)] == -1, "sequences overlap");
      token_seq_[static_cast<size_t>(q.token_begin + i)] = static_cast<int32_t>(s);
    }
  }
  token_seq_batch_ = batch.id();
  return token_seq_;
}

void CpuBackend::copy_state_rows(std::span<const Tensor> tensors, std::span<const SlotMove> moves) {
  for (const SlotMove& m : moves)
    for (const Tensor& t : tensors) {
      if (t.empty()) continue;
      DS_CHECK(m.src >= 0 && m.dst >= 0 && m.src < t.dim(0) && m.dst < t.dim(0),
               "state slot out of range");
      const size_t row = t.nbytes() / static_cast<size_t>(t.dim(0));
      std::memcpy(static_cast<char*>(t.data) + row * static_cast<size_t>(m.dst),
                  static_cast<const char*>(t.data) + row * static_cast<size_t>(m.src), row);
    }
}

void CpuBackend::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const int64_t T = ids.numel(), H = table.dim(1), V = table.dim(0);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = ids.i32()[t];
    DS_CHECK(id >= -1 && id < V, "token id out of range");
    if (id < 0)  // an id another rank's vocabulary slice holds
      std::fill_n(out.f32() + t * H, H, 0.0f);
    else
      std::memcpy(out.f32() + t * H, table.f32() + id * H, sizeof(float) * static_cast<size_t>(H));
  }
}

namespace {

void rms_row(const float* x, const float* w, float eps, int64_t n, float* out) {
  float ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r * (1.0f + w[i]);
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  const int64_t n = x.dim(-1), rows = x.numel() / n;
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) rms_row(x.f32() + r * n, w.f32(), eps, n, out.f32() + r * n);
}

void CpuBackend::add_rms_norm(const Tensor& residual, const Tensor& x, const Tensor& w, float eps,
                              const Tensor& out) {
  const int64_t n = x.dim(-1), rows = x.numel() / n;
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    float* res = residual.f32() + r * n;
    const float* xr = x.f32() + r * n;
    for (int64_t i = 0; i < n; ++i) res[i] += xr[i];
    rms_row(res, w.f32(), eps, n, out.f32() + r * n);
  }
}

void CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  const int64_t T = x.dim(0), in = x.dim(1), outd = w.dim(0);
  DS_CHECK(w.dim(1) == in && y.dim(0) == T && y.dim(1) == outd,
           "linear shapes x" + x.shape_str() + " w" + w.shape_str() + " y" + y.shape_str());
  // Always blocks of kLinearRows rows (the tail zero-padded): OpenBLAS picks its kernels by
  // shape, so a row's result would otherwise depend on how many rows came with it. With a fixed
  // block it does not, and a prefill split anywhere (chunks, prefix-cache resumes, batching)
  // computes exactly the same projections.
  constexpr int64_t kLinearRows = 8;
  auto gemm = [&](const float* a, float* c) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(kLinearRows),
                static_cast<int>(outd), static_cast<int>(in), 1.0f, a, static_cast<int>(in),
                w.f32(), static_cast<int>(in), 0.0f, c, static_cast<int>(outd));
  };
  const int64_t full = T / kLinearRows * kLinearRows;
  for (int64_t r = 0; r < full; r += kLinearRows) gemm(x.f32() + r * in, y.f32() + r * outd);
  if (full == T) return;
  std::vector<float> a(static_cast<size_t>(kLinearRows * in), 0.0f),
      c(static_cast<size_t>(kLinearRows * outd));
  std::memcpy(a.data(), x.f32() + full * in, sizeof(float) * static_cast<size_t>((T - full) * in));
  gemm(a.data(), c.data());
  std::memcpy(y.f32() + full * outd, c.data(),
              sizeof(float) * static_cast<size_t>((T - full) * outd));
}

void CpuBackend::silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t n = gate.numel();
  const float *g = gate.f32(), *u = up.f32();
  float* o = out.f32();
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) o[i] = silu(g[i]) * u[i];
}

void CpuBackend::gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) {
  const int64_t H = x.dim(-1);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    const int32_t r = rows.i32()[i];
    DS_CHECK(r >= 0 && r < x.dim(0), "gather row out of range");
    std::memcpy(out.f32() + i * H, x.f32() + r * H, sizeof(float) * static_cast<size_t>(H));
  }
}

void CpuBackend::gated_rms_norm(const Tensor& o, const Tensor& z, const Tensor& w, float eps) {
  const int64_t dv = o.dim(-1), rows = o.numel() / dv;
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    float* x = o.f32() + r * dv;
    const float* zr = z.f32() + r * dv;
    float ss = 0;
    for (int64_t i = 0; i < dv; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dv) + eps);
    for (int64_t i = 0; i < dv; ++i) x[i] = x[i] * inv * w.f32()[i] * silu(zr[i]);
  }
}

std::vector<Sampled> CpuBackend::sample(const Tensor& logits, int32_t vocab,
                                        const std::vector<SampleSpec>& specs) {
  DS_CHECK(logits.dtype == DType::kF32 && logits.ndim == 2 &&
               logits.dim(0) == static_cast<int64_t>(specs.size()) && vocab <= logits.dim(1),
           "sample: logits [R, V] f32 with one spec per row");
  const int64_t V = logits.dim(1);
  std::vector<Sampled> out(specs.size());
#pragma omp parallel for schedule(dynamic)
  for (int64_t r = 0; r < static_cast<int64_t>(specs.size()); ++r)
    out[static_cast<size_t>(r)] =
        sample_row(std::span<const float>(logits.f32() + r * V, static_cast<size_t>(V)), vocab,
                   specs[static_cast<size_t>(r)]);
  return out;
}

}  // namespace deltaserve::backend
