// CpuBackend: the reference backend. f32 weights and activations, f32 accumulation, OpenBLAS
// GEMMs, OpenMP threads over tokens and heads. Readable first; it is the oracle for CUDA.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace deltaserve::backend {

class CpuBackend : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  DType act_dtype() const override { return DType::kF32; }
  DType weight_dtype(int) const override { return DType::kF32; }
  Buffer alloc(DType t, std::initializer_list<int64_t> dims) override;
  void upload(DType src_type, const void* src, size_t n, const Tensor& dst) override;
  void download_f32(const Tensor& src, float* dst) override;
  void upload_i32(const int32_t* src, const Tensor& dst) override;
  void synchronize() override {}
  int64_t allocated_bytes() const override { return allocated_->load(); }

  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
  void add_rms_norm(const Tensor& residual, const Tensor& x, const Tensor& w, float eps,
                    const Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& y) override;
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) override;

  void attn_prep_and_cache(const StepBatch& batch, const Tensor& qg, const Tensor& k,
                           const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                           const AttnDims& d, const Tensor& q, const Tensor& gate,
                           const Tensor& k_cache, const Tensor& v_cache) override;
  void paged_attention(const StepBatch& batch, const Tensor& q, const Tensor& gate,
                       const Tensor& k_cache, const Tensor& v_cache, const AttnDims& d,
                       const Tensor& out) override;

  void gdn_conv(const StepBatch& batch, const Tensor& u, const Tensor& w, const Tensor& conv_state,
                int32_t K, const Tensor& y) override;
  void gated_delta_rule(const StepBatch& batch, const Tensor& y, const Tensor& a, const Tensor& b,
                        const Tensor& A_log, const Tensor& dt_bias, const Tensor& state,
                        const GdnDims& d, const Tensor& out) override;
  void gated_rms_norm(const Tensor& o, const Tensor& z, const Tensor& w, float eps) override;
  void copy_state_rows(std::span<const Tensor> tensors, std::span<const SlotMove> moves) override;
  std::vector<Sampled> sample(const Tensor& logits, int32_t vocab,
                              const std::vector<SampleSpec>& specs) override;

 private:
  // [T] index into batch.seqs() of each row (cached for the last batch seen).
  const std::vector<int32_t>& token_seq(const StepBatch& batch);

  std::shared_ptr<std::atomic<int64_t>> allocated_ = std::make_shared<std::atomic<int64_t>>(0);
  uint64_t token_seq_batch_ = 0;
  std::vector<int32_t> token_seq_;
};

namespace cpu {

// The gated delta rule for one value head over T tokens, from state S [dk, dv] (updated in
// place). q, k [T, dk] already L2-normalised (q scaled); v [T, dv]; g (log decay) and beta [T];
// o [T, dv]. Chunkwise WY form with chunk size `chunk` (spec section 3.5).
void delta_rule_chunked(int T, int dk, int dv, const float* q, const float* k, const float* v,
                        const float* g, const float* beta, float* S, float* o, int chunk = 64);
// The same, one token at a time (the decode recurrence).
void delta_rule_recurrent(int T, int dk, int dv, const float* q, const float* k, const float* v,
                          const float* g, const float* beta, float* S, float* o);

// cos/sin of partial NeoX RoPE for one position, computed in f32 exactly as HF does.
void rope_cos_sin(int32_t pos, int rotary_dim, double theta, float* cos_out, float* sin_out);

}  // namespace cpu
}  // namespace deltaserve::backend
