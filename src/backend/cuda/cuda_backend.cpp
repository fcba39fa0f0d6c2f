#include "backend/cuda/cuda_backend.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "backend/cuda/ab_switch.h"
#include "backend/cuda/cuda_backend_detail.h"
#include "backend/cuda/gemm_pair.h"
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_prefill.cuh"
#include "backend/cuda/kernels/copy_rows.cuh"
#include "backend/cuda/kernels/gated_rms_norm.cuh"
#include "backend/cuda/kernels/gather_rows.cuh"
#include "backend/cuda/kernels/gdn.cuh"
#include "backend/cuda/kernels/gdn_chunk.cuh"
#include "backend/cuda/kernels/gdn_decode.cuh"
#include "backend/cuda/kernels/gemv.cuh"
#include "backend/cuda/kernels/rms_norm.cuh"
#include "backend/cuda/kernels/silu_mul.cuh"
#include "backend/cuda/kernels/skinny_gemm.cuh"
#include "backend/cuda/step_split.h"
#include "core/error.h"

namespace deltaserve::backend {

using cuda_detail::bf;
using cuda_detail::check;
using cuda_detail::f32;
using cuda_detail::fp8;

namespace {

// The GDN recurrent state tensor as the kernels take it (f32 or bf16).
cuda::GdnState gdn_state(const Tensor& state) {
  DS_CHECK(state.dtype == DType::kF32 || state.dtype == DType::kBF16, "GDN state f32 or bf16");
  return {state.data, state.dtype == DType::kBF16};
}

}  // namespace

CudaBackend::CudaBackend(int device, const cuda::SmPartition* sms) : device_(device) {
  const char* prof = std::getenv("DS_CUDA_PROFILE");
  profile_ = prof && (std::string(prof) == "1" || std::string(prof) == "shapes");
  shape_labels_ = prof && std::string(prof) == "shapes";
  skinny_gemm_ = cuda::ab_switch_on("DS_SKINNY_GEMM");
  one_gate_up_gemm_ = cuda::ab_switch_on("DS_GATE_UP_GEMM");
  fused_silu_mul_ = cuda::ab_switch_on("DS_FUSED_SILU_MUL");
  batch_pairs_ = cuda::ab_switch_on("DS_GEMM_PAIRS");
  norm_sums_partials_ = cuda::ab_switch_on("DS_NORM_SUMS_PARTIALS");
  if (const char* rows = std::getenv("DS_NORM_SUMS_PARTIALS_ROWS"))
    partials_rows_ = std::max<int64_t>(0, std::atoll(rows));
  if (const char* rows = std::getenv("DS_NORM_SUMS_PARTIALS_MIN_ROWS"))
    partials_min_rows_ = std::max<int64_t>(1, std::atoll(rows));
  gemm_tuning_ = cuda::ab_switch_on("DS_GEMM_TUNE");
  if (!cuda::ab_switch_on("DS_GEMM_TUNE_DECODE"))
    decode_tune_rows_ = std::numeric_limits<int64_t>::max();  // no decode bucket is tuned
  else if (const char* rows = std::getenv("DS_GEMM_TUNE_DECODE_ROWS"))
    decode_tune_rows_ = std::max<int64_t>(1, std::atoll(rows));
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess)
    throw DeviceError(std::string("no usable CUDA device: ") + cudaGetErrorString(e));
  if (device < 0 || device >= count)
    throw Error("CUDA device " + std::to_string(device) + " does not exist (" +
                std::to_string(count) + " visible)");
  check(cudaSetDevice(device), "cudaSetDevice");
  for (cudaStream_t* s : {&main_stream_, &side_stream_, &aux_stream_}) {
    if (sms)
      *s = sms->create_stream();
    else
      check(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  check(cudaEventCreateWithFlags(&aux_fork_, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&aux_join_, cudaEventDisableTiming), "cudaEventCreate");
  stream_ = main_stream_;
  gemm_ = std::make_unique<cuda::CublasLtLinear>();
  check(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device), "SM count");
  if (sms) num_sms_ = sms->sm_count();
  check(cudaMalloc(&attn_ws_, kAttnWorkspaceBytes), "cudaMalloc (attention workspace)");
  check(cudaMalloc(&skinny_ws_.partials, skinny_ws_bytes()), "cudaMalloc (GEMM workspace)");
  check(cudaMalloc(&skinny_ws_.counters, cuda::kSkinnyMaxTiles * sizeof(int)),
        "cudaMalloc (GEMM tile counters)");
  check(cudaMemset(skinny_ws_.counters, 0, cuda::kSkinnyMaxTiles * sizeof(int)),
        "cudaMemset (GEMM tile counters)");
}

CudaBackend::~CudaBackend() {
  if (profile_)
    std::fprintf(stderr, "CUDA per-op time (DS_CUDA_PROFILE):\n%s", profile_report(false).c_str());
  drop_graphs();
  gemm_.reset();
  if (meta_buf_) cudaFree(meta_buf_);
  if (attn_ws_) cudaFree(attn_ws_);
  if (skinny_ws_.partials) cudaFree(skinny_ws_.partials);
  if (skinny_ws_.counters) cudaFree(skinny_ws_.counters);
  if (gdn_ws_) cudaFree(gdn_ws_);
  if (sample_in_) cudaFree(sample_in_);
  if (sample_out_) cudaFree(sample_out_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (side_stream_) cudaStreamDestroy(side_stream_);
  if (aux_fork_) cudaEventDestroy(aux_fork_);
  if (aux_join_) cudaEventDestroy(aux_join_);
  if (aux_stream_) cudaStreamDestroy(aux_stream_);
  if (main_stream_) cudaStreamDestroy(main_stream_);
}

namespace {
// BatchMeta as int32 arrays: 2 per token, kMetaSeqArrays per sequence, then the page tables.
constexpr int kMetaSeqArrays = 7;
}  // namespace

void CudaBackend::reserve_batch(int64_t tokens, int64_t seqs, int64_t page_entries) {
  reserve_meta(static_cast<size_t>(2 * tokens + kMetaSeqArrays * seqs + page_entries));
}

void CudaBackend::reserve_meta(size_t entries) {
  if (entries <= meta_cap_) return;
  drop_graphs();  // they hold the old address
  staged_batch_ = 0;
  if (meta_buf_) {
    check(cudaStreamSynchronize(stream_), "reserve sync");
    cudaFree(meta_buf_);
  }
  meta_cap_ = entries;
  check(cudaMalloc(&meta_buf_, meta_cap_ * sizeof(int32_t)), "cudaMalloc (batch)");
}

Buffer CudaBackend::alloc(DType t, std::initializer_list<int64_t> dims) {
  Tensor v(nullptr, t, dims, Device::kCuda);
  const size_t bytes = v.nbytes() ? v.nbytes() : 16;
  check(cudaMalloc(&v.data, bytes), "cudaMalloc");
  check(cudaMemsetAsync(v.data, 0, bytes, stream_), "cudaMemset");
  *allocated_ += static_cast<int64_t>(bytes);
  return Buffer(v, [counter = allocated_, bytes](void* p) {
    cudaFree(p);
    *counter -= static_cast<int64_t>(bytes);
  });
}

void CudaBackend::upload(DType src_type, const void* src, size_t n, const Tensor& dst) {
  DS_CHECK(static_cast<size_t>(dst.numel()) == n, "upload size");
  DS_CHECK(dst.dtype == DType::kF32 || dst.dtype == DType::kBF16 || dst.dtype == DType::kFP8E4M3,
           "upload: F32, BF16 or F8_E4M3 destinations");
  // Straight copies where the types match; otherwise one parallel conversion pass into an
  // uninitialised staging buffer (weights of 27B pass through here: no serial passes).
  std::unique_ptr<float[]> f;
  std::unique_ptr<uint16_t[]> b;
  std::unique_ptr<uint8_t[]> b8;
  const void* host = src;
  if (src_type != dst.dtype) {
    const float* in = static_cast<const float*>(src);
    if (src_type != DType::kF32) {
      f.reset(new float[n]);
      convert_to_f32(src_type, src, f.get(), n);
      in = f.get();
    }
    if (dst.dtype == DType::kBF16) {
      b.reset(new uint16_t[n]);
      uint16_t* out = b.get();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) out[i] = f32_to_bf16(in[i]);
      host = out;
    } else if (dst.dtype == DType::kFP8E4M3) {
      b8.reset(new uint8_t[n]);
      uint8_t* out = b8.get();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) out[i] = f32_to_fp8e4m3(in[i]);
      host = out;
    } else {
      host = in;
    }
  }
  check(cudaMemcpyAsync(dst.data, host, dst.nbytes(), cudaMemcpyHostToDevice, stream_), "upload");
  check(cudaStreamSynchronize(stream_), "upload sync");  // the host staging dies with this call
}

void CudaBackend::download_f32(const Tensor& src, float* dst) {
  OpTimer timer(*this, "download_logits");
  std::vector<char> host(src.nbytes());
  check(cudaMemcpyAsync(host.data(), src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_),
        "download");
  check(cudaStreamSynchronize(stream_), "download sync");
  convert_to_f32(src.dtype, host.data(), dst, static_cast<size_t>(src.numel()));
  if (profile_ && pending_.size() > 4096) account();
}

void CudaBackend::upload_i32(const int32_t* src, const Tensor& dst) {
  OpTimer timer(*this, "upload_i32");
  check(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_),
        "upload_i32");
  check(cudaStreamSynchronize(stream_), "upload_i32 sync");
}

bool CudaBackend::memory_info(size_t& free_bytes, size_t& total_bytes) const {
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return true;
}

void CudaBackend::synchronize() {
  check(cudaStreamSynchronize(side_stream_), "synchronize");
  check(cudaStreamSynchronize(main_stream_), "synchronize");
}

void CudaBackend::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  OpTimer timer(*this, "embedding");
  cuda::launch_gather_rows_bf16(bf(table), ids.i32(), static_cast<int>(ids.numel()),
                                static_cast<int>(table.dim(1)), bf(out), stream_);
}

void CudaBackend::gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) {
  OpTimer timer(*this, "gather_rows");
  cuda::launch_gather_rows_bf16(bf(x), rows.i32(), static_cast<int>(rows.numel()),
                                static_cast<int>(x.dim(-1)), bf(out), stream_);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  OpTimer timer(*this, "rms_norm");
  const int64_t n = x.dim(-1);
  cuda::launch_rms_norm_bf16(bf(x), f32(w), eps, static_cast<int>(x.numel() / n),
                             static_cast<int>(n), bf(out), stream_);
}

void CudaBackend::add_rms_norm(const Tensor& residual, const Tensor& x, const Tensor& w, float eps,
                               const Tensor& out) {
  OpTimer timer(*this, "add_rms_norm");
  const int64_t n = x.dim(-1);
  cuda::launch_add_rms_norm_bf16(bf(residual), bf(x), f32(w), eps, static_cast<int>(x.numel() / n),
                                 static_cast<int>(n), bf(out), stream_);
}

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

void CudaBackend::silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  OpTimer timer(*this, "silu_mul");
  cuda::launch_silu_mul_bf16(bf(gate), bf(up), gate.numel(), bf(out), stream_);
}

void CudaBackend::gated_rms_norm(const Tensor& o, const Tensor& z, const Tensor& w, float eps) {
  OpTimer timer(*this, "gated_rms_norm");
  const int64_t dv = o.dim(-1);
  cuda::launch_gated_rms_norm_bf16(bf(o), bf(z), f32(w), eps, static_cast<int>(o.numel() / dv),
                                   static_cast<int>(dv), stream_);
}

void CudaBackend::stage_batch(const StepBatch& batch) {
  if (batch.id() == staged_batch_ && batch.id() != 0) return;
  DS_CHECK(!capturing_, "a batch must be staged before a graph capture");
  OpTimer timer(*this, "stage_batch");
  const int T = batch.num_tokens(), S = batch.num_seqs();
  std::vector<int32_t>& h = meta_host_;
  h.assign(static_cast<size_t>(2 * T + kMetaSeqArrays * S), 0);
  int32_t *pos = h.data(), *seq = pos + T, *begin = seq + T, *len = begin + S, *start = len + S,
          *slot = start + S, *poff = slot + S, *snap_slot = poff + S, *snap_at = snap_slot + S;
  std::copy(batch.positions().begin(), batch.positions().end(), pos);
  int max_len = 0;
  for (int s = 0; s < S; ++s) {
    const StepSeq& q = batch.seq(static_cast<size_t>(s));
    max_len = std::max(max_len, q.num_tokens);
    begin[s] = q.token_begin;
    len[s] = q.num_tokens;
    start[s] = q.start_pos;
    slot[s] = q.slot;
    poff[s] = batch.page_offsets()[static_cast<size_t>(s)];
    snap_slot[s] = q.mid_snapshot;
    snap_at[s] = q.mid_snapshot >= 0 ? q.mid_snapshot_at : 0;
    for (int i = 0; i < q.num_tokens; ++i) seq[q.token_begin + i] = s;
  }
  h.insert(h.end(), batch.page_ids().begin(), batch.page_ids().end());
  if (h.size() > meta_cap_) reserve_meta(std::max(h.size(), 2 * meta_cap_));
  check(cudaMemcpyAsync(meta_buf_, h.data(), h.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                        stream_),
        "stage_batch");
  const int32_t* d = meta_buf_;
  meta_ = {.token_pos = d,
           .token_seq = d + T,
           .seq_begin = d + 2 * T,
           .seq_len = d + 2 * T + S,
           .seq_start = d + 2 * T + 2 * S,
           .seq_slot = d + 2 * T + 3 * S,
           .seq_page_off = d + 2 * T + 4 * S,
           .pages = d + 2 * T + kMetaSeqArrays * S,
           .seq_snap_slot = d + 2 * T + 5 * S,
           .seq_snap_at = d + 2 * T + 6 * S,
           .num_tokens = T,
           .num_seqs = S,
           .page_size = batch.page_size(),
           .max_seq_len = max_len};
  staged_batch_ = batch.id();
}

int64_t CudaBackend::workspace_bytes(int64_t max_tokens, const GdnDims& d) const {
  const cuda::GdnShape shape{d.nk, d.nv, d.dk, d.dv};
  return static_cast<int64_t>(
      kAttnWorkspaceBytes + gemm_->workspace_bytes() + skinny_ws_bytes() +
      cuda::gdn_chunk_workspace_floats(static_cast<int>(max_tokens), shape) * sizeof(float));
}

void CudaBackend::copy_state_rows(std::span<const Tensor> tensors,
                                  std::span<const SlotMove> moves) {
  OpTimer timer(*this, "copy_state");
  std::vector<const Tensor*> live;
  for (const Tensor& t : tensors)
    if (!t.empty()) live.push_back(&t);
  for (size_t t0 = 0; t0 < live.size(); t0 += cuda::kCopyMaxTensors)
    for (size_t m0 = 0; m0 < moves.size(); m0 += cuda::kCopyMaxMoves) {
      cuda::RowCopies c;
      for (size_t t = t0; t < std::min(live.size(), t0 + cuda::kCopyMaxTensors); ++t) {
        const Tensor& x = *live[t];
        c.base[c.tensors] = static_cast<char*>(x.data);
        c.row_bytes[c.tensors++] = static_cast<int64_t>(x.nbytes()) / x.dim(0);
        for (size_t m = m0; m < std::min(moves.size(), m0 + cuda::kCopyMaxMoves); ++m)
          DS_CHECK(moves[m].src >= 0 && moves[m].dst >= 0 && moves[m].src < x.dim(0) &&
                       moves[m].dst < x.dim(0),
                   "state slot out of range");
      }
      for (size_t m = m0; m < std::min(moves.size(), m0 + cuda::kCopyMaxMoves); ++m) {
        c.src[c.moves] = moves[m].src;
        c.dst[c.moves++] = moves[m].dst;
      }
      cuda::launch_copy_rows(c, stream_);
    }
  check(cudaGetLastError(), "copy_state");
}

void CudaBackend::attn_prep_and_cache(const StepBatch& batch, const Tensor& qg, const Tensor& k,
                                      const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                                      const AttnDims& d, const Tensor& q, const Tensor& gate,
                                      const Tensor& k_cache, const Tensor& v_cache) {
  OpTimer timer(*this, "attn_prep_and_cache");
  const cuda::AttnShape s{d.nh,  d.nkv, d.hd, d.rotary_dim, static_cast<float>(d.rope_theta),
                          d.eps, d.hd};
  __nv_bfloat16* gate_out = gate.empty() ? nullptr : bf(gate);
  if (k_cache.dtype == DType::kFP8E4M3) {
    if (!cuda::launch_attn_prep(meta(batch), bf(qg), bf(k), bf(v), f32(q_norm), f32(k_norm), s,
                                bf(q), gate_out, fp8(k_cache), fp8(v_cache), stream_))
      throw Error(
          "--kv-cache-dtype fp8 needs head_dim 64, 128 or 256 with rotary_dim / 2 a "
          "multiple of head_dim / 32 (the vector cache write); this model has head_dim " +
          std::to_string(d.hd) + ", rotary_dim " + std::to_string(d.rotary_dim));
    return;
  }
  cuda::launch_attn_prep(meta(batch), bf(qg), bf(k), bf(v), f32(q_norm), f32(k_norm), s, bf(q),
                         gate_out, bf(k_cache), bf(v_cache), stream_);
}

void CudaBackend::paged_attention(const StepBatch& batch, const Tensor& q, const Tensor& gate,
                                  const Tensor& k_cache, const Tensor& v_cache, const AttnDims& d,
                                  const Tensor& out) {
  OpTimer timer(*this, "paged_attention");
  DS_CHECK(d.hd % 32 == 0 && d.hd <= 256,
           "paged attention supports head_dim a multiple of 32 up to 256");
  DS_CHECK(d.nh % d.nkv == 0 && d.nh / d.nkv <= 8,
           "paged attention supports up to 8 query heads per KV head");
  const GateRows gr = gate_rows(gate, batch.num_tokens(), d);
  const cuda::AttnShape s{d.nh,
                          d.nkv,
                          d.hd,
                          d.rotary_dim,
                          static_cast<float>(d.rope_theta),
                          d.eps,
                          static_cast<int>(gr.stride)};
  const __nv_bfloat16* g = bf(gate) + gr.offset;
  const cuda::BatchMeta& m = meta(batch);
  // The split-KV kernel's rows: through the last sequence the prefill kernel does not take.
  const int32_t split_rows = cuda::attention_prefill_supported(s)
                                 ? rows_through_short_seqs(batch, cuda::kAttnPrefillMinLen)
                                 : m.num_tokens;
  const int splits = cuda::attention_splits(split_rows, s, num_sms_, kAttnWorkspaceBytes);
  const int32_t prefill_from = leading_short_seqs(batch, cuda::kAttnPrefillMinLen);
  if (k_cache.dtype == DType::kFP8E4M3)
    cuda::launch_paged_attention(m, split_rows, prefill_from, bf(q), g, fp8(k_cache), fp8(v_cache),
                                 s, splits, attn_ws_, bf(out), stream_);
  else
    cuda::launch_paged_attention(m, split_rows, prefill_from, bf(q), g, bf(k_cache), bf(v_cache), s,
                                 splits, attn_ws_, bf(out), stream_);
}

void CudaBackend::gdn_conv(const StepBatch& batch, const Tensor& u, const Tensor& w,
                           const Tensor& conv_state, int32_t K, const Tensor& y) {
  OpTimer timer(*this, "gdn_conv");
  DS_CHECK(K >= 1 && K <= 8, "conv kernel size up to 8");
  cuda::launch_gdn_conv(meta(batch), bf(u), bf(w), bf(conv_state), static_cast<int>(u.dim(1)), K,
                        bf(y), stream_);
}

float* CudaBackend::gdn_chunk_workspace(const cuda::BatchMeta& m, const cuda::GdnShape& shape) {
  const size_t need = cuda::gdn_chunk_workspace_floats(m.num_tokens, shape) * sizeof(float);
  if (need > gdn_ws_bytes_) {
    if (gdn_ws_) cudaFree(gdn_ws_);
    gdn_ws_ = nullptr;
    gdn_ws_bytes_ = 0;
    check(cudaMalloc(&gdn_ws_, need), "cudaMalloc (GDN chunk workspace)");
    gdn_ws_bytes_ = need;
  }
  return gdn_ws_;
}

void CudaBackend::gated_delta_rule(const StepBatch& batch, const Tensor& y, const Tensor& a,
                                   const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                                   const Tensor& state, const GdnDims& d, const Tensor& out) {
  OpTimer timer(*this, "gated_delta_rule");
  DS_CHECK(d.dk <= 256 && d.dv <= 256, "GDN head dims up to 256");
  const cuda::GdnShape shape{d.nk, d.nv, d.dk, d.dv};
  const cuda::BatchMeta& m = meta(batch);
  const bool chunked = m.num_tokens > m.num_seqs && !capturing_;  // a prefill
  float* ws = chunked ? gdn_chunk_workspace(m, shape) : nullptr;
  cuda::launch_gated_delta_rule(m, bf(y), bf(a), bf(b), f32(A_log), f32(dt_bias), gdn_state(state),
                                shape, ws, num_sms_, bf(out), stream_);
}

void CudaBackend::gdn_mixer(const StepBatch& batch, const GdnMixerTensors& t, const GdnDims& d,
                            float eps) {
  const bool decode = batch.num_tokens() == batch.num_seqs();
  const bool fused_decode = cuda::gdn_decode_supported(d.nk, d.nv, d.dk, d.dv, d.conv_kernel);
  if (decode && fused_decode) return gdn_decode_rows(meta(batch), t, d, eps);
  const cuda::GdnShape shape{d.nk, d.nv, d.dk, d.dv};
  const cuda::GdnQkvSource in{nullptr, bf(t.u), bf(t.conv_w), bf(t.conv_state)};
  if (decode || capturing_ || !cuda::gdn_chunked_conv_supported(shape, d.conv_kernel, in))
    return Backend::gdn_mixer(batch, t, d, eps);
  // A prefill or mixed step: its leading decode rows on the fused decode kernel, the other
  // sequences on the chunked delta rule — with the conv inside the prep (y is not written), or,
  // where the step has the sequences for the fused chunk kernel (which does not convolve), the
  // conv kernel into y first — and the gated norm after it.
  const int32_t D = fused_decode ? leading_single_token_seqs(batch) : 0;
  const cuda::BatchMeta& m = meta(batch);
  if (D > 0) gdn_decode_rows(cuda::single_token_seqs(m, D), t, d, eps);
  const cuda::BatchMeta rest = cuda::seqs_from(m, D);
  const bool from_y = cuda::gdn_chunked_fuses_after_conv(rest, shape, num_sms_);
  OpTimer timer(*this, from_y ? "gdn_chunked_fused" : "gdn_chunked_conv");
  const int C = static_cast<int>(t.u.dim(1));
  DS_CHECK(C == 2 * d.nk * d.dk + d.nv * d.dv, "GDN conv inputs [T, 2 nk dk + nv dv]");
  DS_CHECK(t.z.numel() == t.o.numel() && t.norm_w.numel() == d.dv,
           "GDN norm inputs: z [T, nv dv], weight [dv]");
  const cuda::GatedNorm norm{bf(t.z), f32(t.norm_w), eps, D};
  if (from_y) {
    DS_CHECK(t.y.numel() == t.u.numel(), "GDN conv outputs y [T, C]");
    cuda::launch_gdn_conv_from(m, D, bf(t.u), bf(t.conv_w), bf(t.conv_state), C, d.conv_kernel,
                               bf(t.y), stream_);
  }
  const cuda::GdnQkvSource src =
      from_y ? cuda::GdnQkvSource{bf(t.y), nullptr, nullptr, nullptr} : in;
  // Conv inside the prep: its conv-state update beside the state pass (cuda::ConvStateUpdate).
  const cuda::ConvStateUpdate conv{bf(t.u),     bf(t.conv_state), C,        d.conv_kernel,
                                   aux_stream_, aux_fork_,        aux_join_};
  check(cuda::launch_gdn_chunked(rest, src, bf(t.a), bf(t.b), f32(t.A_log), f32(t.dt_bias),
                                 gdn_state(t.state), shape, norm, gdn_chunk_workspace(m, shape),
                                 num_sms_, bf(t.o), stream_, from_y ? nullptr : &conv),
        "GDN conv-state fork / join");
}

void CudaBackend::gdn_decode_rows(const cuda::BatchMeta& m, const GdnMixerTensors& t,
                                  const GdnDims& d, float eps) {
  OpTimer timer(*this, "gdn_decode_fused");
  const cuda::GdnDecodeArgs args{
      bf(t.u),      bf(t.conv_w),   bf(t.conv_state), bf(t.a),       bf(t.b),
      f32(t.A_log), f32(t.dt_bias), bf(t.z),          f32(t.norm_w), eps,
      d.nk,         d.nv,           bf(t.o)};
  cuda::launch_gdn_decode(m, args, gdn_state(t.state), num_sms_, stream_);
}

}  // namespace deltaserve::backend
