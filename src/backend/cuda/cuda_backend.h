// CudaBackend: the Backend on one NVIDIA GPU (sm_90a). bf16 weights (f32 vectors: norms, A_log,
// dt_bias) and activations with f32 accumulation; every op is a stream-ordered launch.
// Decode-size projections run the weight-streaming GEMM (or the GEMV kernel), larger ones
// cuBLASLt; decode rows take split-KV attention and the fused GDN decode layer (gdn_mixer; in a
// mixed step the decode rows the scheduler put first), prefill sequences tensor-core attention and
// the chunked delta rule; sampling runs on the GPU; decode steps can be captured as CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cublaslt_linear.h"
#include "backend/cuda/kernels/batch_meta.cuh"
#include "backend/cuda/kernels/gdn.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "backend/cuda/pinned_buffer.h"
#include "backend/cuda/sm_partition.h"

namespace deltaserve::backend {

class CudaBackend final : public Backend {
 public:
  // Uses CUDA device `device`; throws deltaserve::Error when it does not exist. With the
  // environment variable DS_CUDA_PROFILE=1, every op is timed with CUDA events and a per-op table
  // (total ms, calls, share) is printed to stderr when the backend is destroyed. With `sms`, its
  // streams run on that share of the device's SMs only (a green context, which must outlive the
  // backend) and its grids are sized for the share.
  explicit CudaBackend(int device = 0, const cuda::SmPartition* sms = nullptr);
  ~CudaBackend() override;

  Device device() const override { return Device::kCuda; }
  DType act_dtype() const override { return DType::kBF16; }
  DType weight_dtype(int ndims) const override { return ndims >= 2 ? DType::kBF16 : DType::kF32; }
  Buffer alloc(DType t, std::initializer_list<int64_t> dims) override;
  void upload(DType src_type, const void* src, size_t n, const Tensor& dst) override;
  void download_f32(const Tensor& src, float* dst) override;
  void upload_i32(const int32_t* src, const Tensor& dst) override;
  void synchronize() override;
  bool memory_info(size_t& free_bytes, size_t& total_bytes) const override;
  int64_t allocated_bytes() const override { return allocated_->load(); }
  // The split-KV attention partials, the chunked delta rule's workspace for `max_tokens` and the
  // cuBLASLt workspace.
  int64_t workspace_bytes(int64_t max_tokens, const GdnDims& gdn) const override;
  // What the backend holds of its own workspace now (the plan's workspace is its ceiling).
  int64_t workspace_allocated() const {
    return static_cast<int64_t>(kAttnWorkspaceBytes + gemm_->workspace_bytes() + skinny_ws_bytes() +
                                gdn_ws_bytes_);
  }
  // Uploads the batch description (positions, sequences, page tables) unless it is the one on the
  // device already.
  void stage_batch(const StepBatch& batch) override;
  void reserve_batch(int64_t tokens, int64_t seqs, int64_t page_entries) override;
  // The current stream (the main one, or the side one after use_side_stream(true)).
  cudaStream_t stream() const { return stream_; }
  // Collectives and copies may run on the side stream; kernels that use the backend's
  // workspaces (GEMMs, attention, the delta rule) stay on the main one.
  void use_side_stream(bool side) override;
  void record_event(int e) override;
  void wait_event(int e) override;

  bool graphs_supported() const override { return true; }
  void begin_capture() override;
  int end_capture() override;
  void replay(int id) override;
  bool graph_valid(int id) const override;
  void drop_graphs() override;
  bool tunes_linears() const override { return gemm_tuning_; }
  int64_t min_tuned_decode_rows() const override { return decode_tune_rows_; }
  void set_linear_tuning(int64_t min_rows) override;
  // The per-op table (DS_CUDA_PROFILE=1) of what ran since the last reset; empty when off.
  std::string profile_report(bool reset);
  // Turns the per-op timing on or off from here on (DS_CUDA_PROFILE=1 turns it on at start).
  void set_profiling(bool on) {
    if (!on) account();
    profile_ = on;
  }

  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
  void add_rms_norm(const Tensor& residual, const Tensor& x, const Tensor& w, float eps,
                    const Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& y) override;
  void linear_multi(const Tensor& x, std::span<const Tensor* const> ws,
                    std::span<const Tensor* const> ys) override;
  void linear_add_rms_norm(const Tensor& x, const Tensor& w, const Tensor& residual,
                           const Tensor& norm_w, float eps, const Tensor& out,
                           const Tensor& scratch) override;
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  // On the weight-streaming GEMM's SiLU-mul form where the projections would take that GEMM (up
  // to kSkinnySiluMulMaxRows tokens), and from kGemmSiluMulMinRows tokens on the prefill GEMM with
  // the SiLU-mul in its epilogue: gate_up is not written. Otherwise, where they take cuBLASLt and
  // w_up's rows follow w_gate's in memory (the loader places them so): one GEMM into gate_up as
  // [T, 2 I], then SiLU-mul over its two column halves.
  void linear_silu_mul(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                       const Tensor& gate_up, const Tensor& act) override;
  void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) override;
  void gated_rms_norm(const Tensor& o, const Tensor& z, const Tensor& w, float eps) override;
  void copy_state_rows(std::span<const Tensor> tensors, std::span<const SlotMove> moves) override;

  void attn_prep_and_cache(const StepBatch& batch, const Tensor& qg, const Tensor& k,
                           const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                           const AttnDims& d, const Tensor& q, const Tensor& gate,
                           const Tensor& k_cache, const Tensor& v_cache) override;
  void paged_attention(const StepBatch& batch, const Tensor& q, const Tensor& gate,
                       const Tensor& k_cache, const Tensor& v_cache, const AttnDims& d,
                       const Tensor& out) override;
  void gdn_conv(const StepBatch& batch, const Tensor& u, const Tensor& w, const Tensor& conv_state,
                int32_t K, const Tensor& y) override;
  std::vector<Sampled> sample(const Tensor& logits, int32_t vocab,
                              const std::vector<SampleSpec>& specs) override;
  void gated_delta_rule(const StepBatch& batch, const Tensor& y, const Tensor& a, const Tensor& b,
                        const Tensor& A_log, const Tensor& dt_bias, const Tensor& state,
                        const GdnDims& d, const Tensor& out) override;
  // Steps of one token per sequence at the supported shapes: the fused decode kernel
  // (kernels/gdn_decode.cuh); prefill steps at the chunked form's shapes: the conv inside the
  // chunked delta rule (kernels/gdn_chunk.cuh), then the gated norm; others the three ops.
  void gdn_mixer(const StepBatch& batch, const GdnMixerTensors& t, const GdnDims& d,
                 float eps) override;

 private:
  enum class LinearRoute { kSkinny, kGemv, kCublasLt };
  // Where linear_multi sends these projections (checking their shapes).
  LinearRoute linear_route(const Tensor& x, std::span<const Tensor* const> ws,
                           std::span<const Tensor* const> ys) const;

  int device_;
  cudaStream_t main_stream_ = nullptr, side_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the current one of the two
  // A stream of the backend's own for work beside a kernel of the main one (gdn_mixer's
  // conv-state update), with its fork / join events.
  cudaStream_t aux_stream_ = nullptr;
  cudaEvent_t aux_fork_ = nullptr, aux_join_ = nullptr;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t event(int e);  // made on first use
  std::unique_ptr<cuda::CublasLtLinear> gemm_;
  // Per-op timing (DS_CUDA_PROFILE=1): events of ops not yet accounted, and totals by op.
  struct Timed {
    const char* op;
    cudaEvent_t start, stop;
  };
  class OpTimer;
  void account();
  // "linear", or with DS_CUDA_PROFILE=shapes "kind n=N k=K" (kept in labels_ while timers run).
  const char* linear_label(const char* kind, int64_t n, int64_t k);
  bool profile_ = false;
  bool shape_labels_ = false;
  std::set<std::string> labels_;
  bool skinny_gemm_ = true;  // the weight-streaming GEMM for T <= 64 (DS_SKINNY_GEMM)
  // The MLP's adjacent gate and up weights as one cuBLASLt GEMM (DS_GATE_UP_GEMM=0: two, A/B).
  bool one_gate_up_gemm_ = true;
  // linear_silu_mul's fused forms: the weight-streaming GEMM's and the prefill GEMM's
  // (DS_FUSED_SILU_MUL=0 for A/B: the unfused ops)
  bool fused_silu_mul_ = true;
  // Two projections of one width in a group (the GDN b / a, attention k / v) as one batched
  // cuBLASLt GEMM (DS_GEMM_PAIRS=0: a GEMM each, A/B).
  bool batch_pairs_ = true;
  // A residual projection on the weight-streaming GEMM leaves its split tiles' partials for the
  // add + norm kernel to sum (DS_NORM_SUMS_PARTIALS=0: the GEMM sums them, A/B).
  bool norm_sums_partials_ = true;
  // Residual projections of up to this many rows take that form also where linear_route picks
  // cuBLASLt (the 20-tile projections at B = 9-32): with the other queued experiments, graphed
  // B = 16 3.605 / 3.580 ms against 3.770 / 3.735 with all off (h200_2026-12-05.md); 32 rather
  // than 16 rows: B = 32 4.342 / 4.344 against 4.411 / 4.383, B = 16 and 64 unchanged, 64 rows
  // no better at B = 64 (5.759 / 5.769 against 5.758 / 5.738; h200_2026-12-05b.md).
  // DS_NORM_SUMS_PARTIALS_ROWS=N sets it (0: only where linear_route picks the streaming GEMM).
  int64_t partials_rows_ = 32;
  // ... and only from this many rows on: below it the GEMM sums its split tiles and the add +
  // norm reads one bf16 row (why that is faster there is inferred from a kernel trace, not
  // measured: the norm's partial loads seemed to wait behind the next GEMM's weight copies). On an
  // H100 (graphed ms, two rounds in each of two leases; from 9 rows / from 1): ctx 1k B = 1
  // 3.572, 3.556 / 3.609, 3.612; B = 2 3.668, 3.670 / 3.699, 3.698; B = 8 3.996, 4.008 / 4.039,
  // 4.043; ctx 8k B = 1 3.655, 3.656 / 3.699, 3.686; B = 4 4.075, 4.078 / 4.119, 4.092
  // (decode_h100_2026-12-05.md). DS_NORM_SUMS_PARTIALS_MIN_ROWS=N sets it (A/B).
  int64_t partials_min_rows_ = 9;
  // linear_add_rms_norm in that form: false, launching nothing, where it does not apply.
  bool add_norm_of_partials(const Tensor& x, const Tensor& w, const Tensor& residual,
                            const Tensor& norm_w, float eps, const Tensor& out,
                            const Tensor& scratch);
  bool gemm_tuning_ = true;  // set_linear_tuning takes effect (DS_GEMM_TUNE=0: it does not)
  // The fewest rows of a tuned decode bucket: DS_GEMM_TUNE_DECODE_ROWS=N (A/B), or none
  // (DS_GEMM_TUNE_DECODE=0).
  int64_t decode_tune_rows_ = kMinTunedDecodeRows;
  std::vector<Timed> pending_;
  std::vector<std::pair<const char*, std::pair<double, int64_t>>> totals_;

  bool capturing_ = false;
  int num_sms_ = 0;
  // Split-KV attention partials: fixed size, so captured graphs keep their address.
  static constexpr size_t kAttnWorkspaceBytes = size_t{64} << 20;
  float* attn_ws_ = nullptr;
  // The weight-streaming GEMM's partial sums and tile counters (fixed: graphs keep the address).
  cuda::SkinnyWorkspace skinny_ws_{};
  size_t skinny_ws_bytes() const {
    return cuda::skinny_workspace_floats(num_sms_) * sizeof(float) +
           cuda::kSkinnyMaxTiles * sizeof(int);
  }
  // Chunked delta-rule workspace for prefill steps (grow-only; never used by decode graphs).
  float* gdn_ws_ = nullptr;
  size_t gdn_ws_bytes_ = 0;
  float* gdn_chunk_workspace(const cuda::BatchMeta& m, const cuda::GdnShape& shape);
  // The fused GDN decode layer over m's sequences (one token each).
  void gdn_decode_rows(const cuda::BatchMeta& m, const GdnMixerTensors& t, const GdnDims& d,
                       float eps);
  std::vector<cudaGraphExec_t> graphs_;  // null: dropped

  // Sampling: per-row parameters and penalty entries in, tokens and logprobs out (grow-only).
  void* sample_in_ = nullptr;
  size_t sample_in_cap_ = 0;
  void* sample_out_ = nullptr;
  size_t sample_out_cap_ = 0;
  cuda::PinnedBuffer sample_host_in_, sample_host_out_;

  // The staged batch's device description.
  const cuda::BatchMeta& meta(const StepBatch& batch) {
    stage_batch(batch);
    return meta_;
  }
  std::shared_ptr<std::atomic<int64_t>> allocated_ = std::make_shared<std::atomic<int64_t>>(0);
  uint64_t staged_batch_ = 0;  // id of the batch meta_ describes
  cuda::BatchMeta meta_{};
  int32_t* meta_buf_ = nullptr;       // device, grow-only
  size_t meta_cap_ = 0;               // int32 elements
  void reserve_meta(size_t entries);  // room for this many int32 elements
  std::vector<int32_t> meta_host_;
};

}  // namespace deltaserve::backend
