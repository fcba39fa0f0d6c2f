// Backend: the coarse, batched ops the Qwen3.5 forward is written against (DESIGN.md decision 1).
// Every op works on a flattened batch of tokens ("varlen"); the ops that need the step's sequences
// (positions, pages, state slots) take its StepBatch explicitly.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backend/sampling.h"
#include "core/error.h"
#include "core/step_batch.h"
#include "core/tensor.h"

namespace deltaserve::backend {

// A state slot copied to another (Backend::copy_state_rows).
struct SlotMove {
  int32_t src = 0, dst = 0;
};

// Shapes of the Gated DeltaNet heads.
struct GdnDims {
  int32_t nk, nv, dk, dv, conv_kernel;
};

// The tensors of one GDN layer's mixer step (Backend::gdn_mixer): the step's u [T, C] (conv
// inputs), y [T, C] (scratch: the conv's outputs), a, b [T, nv], z [T, nv * dv] and o [T, nv, dv]
// (the output); the weights conv_w [C, K], A_log, dt_bias [nv], norm_w [dv]; the layer's caches
// conv_state [slots, C, K - 1] and state [slots, nv, dk, dv].
struct GdnMixerTensors {
  Tensor u, y, a, b, z, o;
  Tensor conv_w, A_log, dt_bias, norm_w;
  Tensor conv_state, state;
};

// Shapes and RoPE parameters of full attention.
struct AttnDims {
  int32_t nh, nkv, hd, rotary_dim;
  double rope_theta;
  float eps;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // The dtype of activations, KV cache and conv state here (CPU: F32; CUDA: BF16). The GDN
  // recurrent state is F32 or BF16 (--mamba-ssm-cache-dtype) on either.
  virtual DType act_dtype() const = 0;
  // The dtype a weight of `ndims` dims is kept in (CUDA: BF16 matrices, F32 vectors).
  virtual DType weight_dtype(int ndims) const = 0;
  // Zero-filled memory on this backend's device.
  virtual Buffer alloc(DType t, std::initializer_list<int64_t> dims) = 0;
  // Copies `n` elements of a host float array of type `src_type` into `dst` (converting to dst's
  // dtype). Precondition: dst.numel() == n.
  virtual void upload(DType src_type, const void* src, size_t n, const Tensor& dst) = 0;
  // Copies `src` (any float dtype) to host f32 `dst` of src.numel() elements.
  virtual void download_f32(const Tensor& src, float* dst) = 0;
  virtual void upload_i32(const int32_t* src, const Tensor& dst) = 0;
  virtual void synchronize() = 0;
  // Free and total device memory in bytes; false where the backend has no such limit (CPU).
  virtual bool memory_info(size_t& free_bytes, size_t& total_bytes) const {
    (void)free_bytes;
    (void)total_bytes;
    return false;
  }

  // Bytes allocated through alloc() and held now (the memory plan's check).
  virtual int64_t allocated_bytes() const = 0;
  // Workspace the backend allocates for itself for steps of up to `max_tokens` tokens (e.g. the
  // chunked delta rule's and split-KV attention's), on top of the buffers the model allocates.
  virtual int64_t workspace_bytes(int64_t max_tokens, const GdnDims& gdn) const {
    (void)max_tokens;
    (void)gdn;
    return 0;
  }

  // Makes `batch` the one whose description the device holds (the CUDA backend uploads it once per
  // batch id; later ops of the same batch reuse it). Ops call it themselves; the model calls it
  // before a graph capture or replay, where no upload may happen inside.
  virtual void stage_batch(const StepBatch& batch) { (void)batch; }
  // Keeps room for batch descriptions of up to `tokens` tokens, `seqs` sequences and `page_entries`
  // page-table entries, so that staging keeps its device addresses, which captured graphs depend
  // on. A larger batch later still works but invalidates every graph.
  virtual void reserve_batch(int64_t tokens, int64_t seqs, int64_t page_entries) {
    (void)tokens, (void)seqs, (void)page_entries;
  }

  // Graphs (CUDA graphs on the CUDA backend; none on the CPU). Ops enqueued between begin_capture
  // and end_capture are recorded instead of run; replay(id) runs them again with the same buffers
  // and shapes (the contents of batch descriptions and inputs may change). graph_valid(id) turns
  // false when a buffer a graph depends on was reallocated.
  virtual bool graphs_supported() const { return false; }
  virtual void begin_capture() { throw Error("this backend has no graphs"); }
  virtual int end_capture() { throw Error("this backend has no graphs"); }
  virtual void replay(int id) {
    (void)id;
    throw Error("this backend has no graphs");
  }
  virtual bool graph_valid(int id) const {
    (void)id;
    return false;
  }
  virtual void drop_graphs() {}

  // While min_rows > 0, the first GEMM of each new shape of at least min_rows tokens times the
  // library's candidate algorithms on its own operands and keeps the fastest for that shape (its
  // output, and with an accumulating GEMM the tensor it adds into, are garbage then): for a
  // padding step at start-up, never for a step whose results count or inside graph capture. 0
  // turns it off. kMinTunedRows for prefill steps, kMinTunedDecodeRows for the decode graphs'
  // batch sizes where cuBLASLt takes some projections (measured on the H200, 4B, graphed ms with
  // 16 / 128: B = 32 4.64 / 4.68, B = 64 6.02 / 6.06). No-op where there is nothing to tune (the
  // CPU).
  static constexpr int64_t kMinTunedRows = 1024, kMinTunedDecodeRows = 16;
  virtual bool tunes_linears() const { return false; }
  // The fewest rows of a decode graph bucket whose GEMMs are tuned (kMinTunedDecodeRows unless
  // the backend is told otherwise).
  virtual int64_t min_tuned_decode_rows() const { return kMinTunedDecodeRows; }
  virtual void set_linear_tuning(int64_t min_rows) { (void)min_rows; }

  // Two streams (TPSP's microchunk pipeline, model/microchunk_pipeline.h): ops and the collectives
  // of the rank's communicator run on the current stream — the main one, or the side one between
  // use_side_stream(true) and use_side_stream(false). record_event(e) marks the current stream's
  // position in event e (numbered from 0, made on first use); wait_event(e) holds the current
  // stream's later work until the last mark of e is reached. synchronize() waits for both
  // streams. No-ops on backends whose ops run in order on the calling thread (the CPU).
  virtual void use_side_stream(bool side) { (void)side; }
  virtual void record_event(int e) { (void)e; }
  virtual void wait_event(int e) { (void)e; }

  // out[t] = table[ids[t]], or zeros where ids[t] = -1 (an id of another rank's vocabulary slice).
  // ids [T] i32, table [V, H], out [T, H].
  virtual void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  // out = x * rsqrt(mean(x^2) + eps) * (1 + w), row-wise over the last dim of x. w [last dim].
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) = 0;
  // residual += x; out = rms_norm(residual). residual, x, out [T, H].
  virtual void add_rms_norm(const Tensor& residual, const Tensor& x, const Tensor& w, float eps,
                            const Tensor& out) = 0;
  // y = x . w^T. x [T, in], w [out, in], y [T, out].
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor& y) = 0;
  // Several projections of one input: ys[i] = x . ws[i]^T. Backends may run them as one launch.
  virtual void linear_multi(const Tensor& x, std::span<const Tensor* const> ws,
                            std::span<const Tensor* const> ys) {
    for (size_t i = 0; i < ws.size(); ++i) linear(x, *ws[i], *ys[i]);
  }
  // residual += x . w^T, then out = rms_norm(residual) by norm_w: a row-parallel projection whose
  // output is already the whole sum (one rank), added to the residual stream and normalised.
  // x [T, in], w [H, in], residual, out and scratch [T, H]. By default the projection goes to
  // `scratch`, then add_rms_norm; a backend may add it to the residual inside the GEMM, or use
  // `scratch` otherwise (its contents afterwards unspecified).
  virtual void linear_add_rms_norm(const Tensor& x, const Tensor& w, const Tensor& residual,
                                   const Tensor& norm_w, float eps, const Tensor& out,
                                   const Tensor& scratch) {
    linear(x, w, scratch);
    add_rms_norm(residual, scratch, norm_w, eps, out);
  }
  // out = silu(gate) * up, all [T, I].
  virtual void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // linear_silu_mul's gate_up scratch [T, 2 I] as two [T, I] tensors (its first and second half).
  static std::pair<Tensor, Tensor> gate_up_halves(const Tensor& gate_up, int64_t T, int64_t I) {
    const Tensor halves = gate_up.view({2 * T, I});
    return {halves.rows(0, T), halves.rows(T, 2 * T)};
  }
  // The MLP's input side: act = silu(x . w_gate^T) * (x . w_up^T). x [T, H], w_gate / w_up [I, H],
  // gate_up [T, 2 I] (scratch a backend may leave unwritten) and act [T, I]. By default the two
  // projections into gate_up's two halves (as [T, I] each), then silu_mul; a backend may form act
  // in the GEMM, or (w_up's rows right after w_gate's) run both projections as one.
  virtual void linear_silu_mul(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                               const Tensor& gate_up, const Tensor& act) {
    const auto [gate, up] = gate_up_halves(gate_up, x.dim(0), w_gate.dim(0));
    const Tensor* ws[] = {&w_gate, &w_up};
    const Tensor* ys[] = {&gate, &up};
    linear_multi(x, ws, ys);
    silu_mul(gate, up, act);
  }
  // out[i] = x[rows[i]]. rows [R] i32, x [T, H], out [R, H].
  virtual void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) = 0;

  // Full attention, before the cache: splits qg [T, nh, 2*hd] (per-head [q | gate]) into q
  // [T, nh, hd] and gate [T, nh, hd] (an empty gate: not written); applies the zero-centred q/k
  // norms and partial NeoX RoPE at each token's absolute position to q and, in place, to k [T, nkv,
  // hd]; then writes k and v [T, nkv, hd] into the paged caches k_cache/v_cache [pages, page_size,
  // nkv, hd].
  virtual void attn_prep_and_cache(const StepBatch& batch, const Tensor& qg, const Tensor& k,
                                   const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                                   const AttnDims& d, const Tensor& q, const Tensor& gate,
                                   const Tensor& k_cache, const Tensor& v_cache) = 0;
  // Causal GQA attention of q [T, nh, hd] over each sequence's cached keys/values, times
  // sigmoid(gate); out [T, nh, hd]. gate: [T, nh, hd], or qg [T, nh, 2*hd] itself (each head's
  // second half is its gate).
  virtual void paged_attention(const StepBatch& batch, const Tensor& q, const Tensor& gate,
                               const Tensor& k_cache, const Tensor& v_cache, const AttnDims& d,
                               const Tensor& out) = 0;
  // Where paged_attention finds the gate of (t, h): at element (t nh + h) stride + offset of
  // `gate` (hd and 0 for a gate tensor, 2 hd and hd for qg).
  struct GateRows {
    int64_t stride, offset;
  };
  static GateRows gate_rows(const Tensor& gate, int64_t T, const AttnDims& d) {
    const int64_t heads = T * d.nh;
    DS_CHECK(gate.numel() == heads * d.hd || gate.numel() == 2 * heads * d.hd,
             "attention gate: [T, nh, hd] or qg [T, nh, 2 hd], got " + gate.shape_str());
    return gate.numel() == heads * d.hd ? GateRows{d.hd, 0} : GateRows{2 * d.hd, d.hd};
  }

  // GDN causal depthwise conv + SiLU: u [T, C] pre-conv inputs, w [C, K], conv_state
  // [slots, C, K-1] (the last K-1 inputs, oldest first; read unless the sequence is fresh, then
  // updated). y [T, C].
  virtual void gdn_conv(const StepBatch& batch, const Tensor& u, const Tensor& w,
                        const Tensor& conv_state, int32_t K, const Tensor& y) = 0;
  // Gated delta rule over y [T, conv_dim] = [q | k | v] (head-major), with a, b [T, nv] raw gate
  // projections, A_log, dt_bias [nv]; state [slots, nv, dk, dv] f32 or bf16 (read unless the
  // sequence is fresh, then updated; a step computes in f32 and rounds the bf16 state it leaves).
  // Applies L2 norms (q scaled by dk^-1/2), beta = sigmoid(b), g = -exp(A_log) * softplus(a +
  // dt_bias). Chunkwise (64) for prefill, recurrent for one token. out [T, nv, dv].
  virtual void gated_delta_rule(const StepBatch& batch, const Tensor& y, const Tensor& a,
                                const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                                const Tensor& state, const GdnDims& d, const Tensor& out) = 0;
  // One token per row of logits [R, V'] (only ids < vocab), with specs[r] for row r (R specs).
  virtual std::vector<Sampled> sample(const Tensor& logits, int32_t vocab,
                                      const std::vector<SampleSpec>& specs) = 0;

  // For each move, row `src` to row `dst` of every tensor — the GDN conv [slots, C, K-1] and
  // recurrent [slots, nv, dk, dv] states of every layer — as one operation (prefix-cache
  // snapshots). No move's dst may be another move's src or dst.
  virtual void copy_state_rows(std::span<const Tensor> tensors,
                               std::span<const SlotMove> moves) = 0;

  // In place on o [T, nv, dv]: o = o * rsqrt(mean(o^2) + eps) * w * silu(z); z [T, nv*dv], w [dv]
  // (plain weight, no +1).
  virtual void gated_rms_norm(const Tensor& o, const Tensor& z, const Tensor& w, float eps) = 0;

  // A GDN layer between its input projections and out_proj: gdn_conv (u -> y), gated_delta_rule
  // (y -> o) and gated_rms_norm (o by z), as those three ops do; a backend may fuse them (the CUDA
  // one does for steps of one token per sequence, without writing y).
  virtual void gdn_mixer(const StepBatch& batch, const GdnMixerTensors& t, const GdnDims& d,
                         float eps) {
    gdn_conv(batch, t.u, t.conv_w, t.conv_state, d.conv_kernel, t.y);
    gated_delta_rule(batch, t.y, t.a, t.b, t.A_log, t.dt_bias, t.state, d, t.o);
    gated_rms_norm(t.o, t.z, t.norm_w, eps);
  }
};

}  // namespace deltaserve::backend
