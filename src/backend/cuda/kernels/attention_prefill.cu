// Causal flash attention of prefill sequences over the paged KV (bf16 wgmma with f32 accumulation,
// sm_90a). Block (query head, sequence, 128-query tile), two warpgroups of 64 query rows; the
// heaviest tiles (latest queries) are launched first. The Q tile stays in shared memory; key and
// value tiles of 64 rows stream through two shared-memory slots each with cp.async (into the
// 128-byte swizzled layout wgmma reads). Iteration j of a warpgroup issues S_j = Q K_j^T (both
// operands from shared memory) and O += P_{j-1} V_{j-1} (P from registers, V read MN-major) as
// two asynchronous wgmma groups, runs the online softmax of S_j (exp2, f32) while the second one
// is in flight, then rescales O and keeps P_j as bf16 A fragments for the next iteration. The
// loads of K_{j+1} and V_j are in flight meanwhile. An fp8 e4m3 cache's tiles are copied into two
// more shared-memory buffers instead, one tile ahead: iteration j widens K_{j+1} and V_j to f16
// (one conversion a pair, exact) into their slots while its own MMAs are in flight (two more
// barriers an iteration); Q is converted to f16 in place once, P packed as f16, and the MMAs are
// f16 x f16 -> f32. On a bf16 cache launch_attention_prefill runs the warp-specialized form of this
// loop (attention_prefill_ws.cu) unless DS_ATTN_WS=0.
#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/attention_prefill.cuh"
#include "backend/cuda/kernels/attention_prefill_ops.cuh"
#include "backend/cuda/kernels/attention_prefill_ws.cuh"
#include "backend/cuda/kernels/kv_fp8.cuh"

namespace deltaserve::cuda {
namespace {

using namespace attn_prefill;  // NOLINT: the kernel pieces
constexpr int kWarps = kRows / 16, kThreads = 32 * kWarps;

template <int HD, bool kFp8>
struct PrefillLayout {
  // SW128 tiles: Q (kRows x HD), then two K slots and two V slots (kKeys x HD each); fp8: then the
  // copied e4m3 K and V tiles (kKeys x HD bytes each, row-major).
  static constexpr uint32_t q_bytes = kRows * HD * 2, kv_bytes = kKeys * HD * 2,
                            copy_bytes = kFp8 ? kKeys * HD : 0;
  static constexpr size_t bytes =
      q_bytes + 4 * kv_bytes + 2 * copy_bytes + wgmma::kAtomBytes;  // + alignment
};

// Rows [k0, k0 + 64) of the KV head's fp8 cache (K or V) into a row-major copy tile of kKeys x HD
// bytes (rows past last_key zero), 16 bytes at a time: a thread takes kPer pieces of a row (one
// page lookup), strided so that consecutive threads take consecutive pieces; the caller commits
// the cp.async group.
template <int HD>
__device__ void copy_fp8_rows(unsigned char* copy, const uint8_t* cache, const Tile& t, int k0,
                              int nkv) {
  constexpr int kPieces = HD / 16, kPer = kPieces >= 8 ? 2 : 1, kGroups = kPieces / kPer,
                kStep = kThreads / kGroups;  // rows a pass
  static_assert(kStep <= kKeys && kKeys % kStep == 0);
  const int c = threadIdx.x % kGroups, r0 = threadIdx.x / kGroups;
#pragma unroll
  for (int r = r0; r < kKeys; r += kStep) {
    const uint32_t p = min(k0 + r, t.last_key), page = t.page_magic ? __umulhi(p, t.page_magic) : p;
    const uint8_t* row =
        cache + t.kvh * HD +
        (static_cast<size_t>(t.pages[page]) * t.page_size + (p - page * t.page_size)) * nkv * HD;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int at = 16 * (c + k * kGroups);
      mma::cp_async16(copy + r * HD + at, row + at, k0 + r <= t.last_key);
    }
  }
}

// A copied fp8 tile widened into an SW128 f16 tile of kKeys rows, 8 values a thread at a time: a
// thread keeps its 8-byte piece c of rows r0, r0 + kStep, ... (kStep a multiple of 8: the same
// swizzled column in each), so its addresses are one base plus constants.
template <int HD>
__device__ void widen_rows(unsigned char* tile, const unsigned char* copy) {
  constexpr int kPieces = HD / 8, kStep = kThreads / kPieces;  // pieces a row, rows a pass
  static_assert(kStep % 8 == 0 && kKeys % kStep == 0);
  const int c = threadIdx.x % kPieces, r0 = threadIdx.x / kPieces;
  unsigned char* dst = tile + wgmma::sw128_offset(kKeys, r0, 8 * c);
  const unsigned char* src = copy + r0 * HD + 8 * c;
#pragma unroll
  for (int k = 0; k < kKeys / kStep; ++k)
    *reinterpret_cast<uint4*>(dst + k * kStep * wgmma::kRowBytes) =
        kv_fp8::widen8_f16(*reinterpret_cast<const uint2*>(src + k * kStep * HD));
}

// The loaded Q tile's bf16 values as f16, in place (the fp8 cache's f16 MMAs).
template <int HD>
__device__ void queries_to_f16(unsigned char* tile) {
  uint4* v = reinterpret_cast<uint4*>(tile);
#pragma unroll 4
  for (int i = threadIdx.x; i < kRows * HD / 8; i += kThreads) {
    uint4 x = v[i];
    x.x = mma::bf16x2_to_f16x2(x.x);
    x.y = mma::bf16x2_to_f16x2(x.y);
    x.z = mma::bf16x2_to_f16x2(x.z);
    x.w = mma::bf16x2_to_f16x2(x.w);
    v[i] = x;
  }
}

// How the K / V tiles reach the slots: bf16 cp.async straight into a slot; fp8 cp.async into the
// copy tiles (after the slots), widened to f16 into the slot an iteration before it is read.
template <int HD, typename KvT>
struct KvPipe {
  static constexpr bool kFp8 = sizeof(KvT) == 1;
  static constexpr uint32_t kSlot = PrefillLayout<HD, kFp8>::kv_bytes;
  unsigned char *ks, *vs, *kcopy, *vcopy;  // K slots, V slots, fp8: the K and V copy tiles

  // Starts the copies of K_{j+1} and V_j (j = -1: K_0 alone).
  __device__ void start(int j, int tiles, const KvT* kc, const KvT* vc, const Tile& t,
                        int nkv) const {
    if (j + 1 < tiles) {
      if constexpr (kFp8)
        copy_fp8_rows<HD>(kcopy, kc, t, (j + 1) * kKeys, nkv);
      else
        load_rows<HD, kThreads>(ks + ((j + 1) % 2) * kSlot, kc, t, (j + 1) * kKeys, nkv,
                                threadIdx.x);
    }
    if (j >= 0 && j < tiles) {
      if constexpr (kFp8)
        copy_fp8_rows<HD>(vcopy, vc, t, j * kKeys, nkv);
      else
        load_rows<HD, kThreads>(vs + (j % 2) * kSlot, vc, t, j * kKeys, nkv, threadIdx.x);
    }
  }
  // fp8, once start(j - 1)'s copies have landed: K_j and V_{j-1} widened into their slots.
  __device__ void widen(int j, int tiles) const {
    if (j < tiles) widen_rows<HD>(ks + (j % 2) * kSlot, kcopy);
    if (j >= 1) widen_rows<HD>(vs + ((j - 1) % 2) * kSlot, vcopy);
  }
};

// KvT: the cache's element (bf16, or uint8_t for fp8 e4m3).
template <int HD, typename KvT>
__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_kernel(BatchMeta b, const bf16* __restrict__ q, const bf16* __restrict__ gate,
                        const KvT* __restrict__ kc, const KvT* __restrict__ vc, AttnShape s,
                        int min_len, bf16* __restrict__ out) {
  constexpr bool kFp8 = sizeof(KvT) == 1;
  using Lay = PrefillLayout<HD, kFp8>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* qs = wgmma::atom_aligned<unsigned char>(smem_raw);
  unsigned char* ks = qs + Lay::q_bytes;           // K slot i at ks + i kv_bytes
  unsigned char* vs = ks + 2 * Lay::kv_bytes;      // V slot i at vs + i kv_bytes
  unsigned char* copies = vs + 2 * Lay::kv_bytes;  // fp8: the K, then the V copy tile
  const KvPipe<HD, KvT> pipe{ks, vs, copies, copies + Lay::copy_bytes};
  Tile t;
  if (!block_tile(b, s, min_len, t)) return;
  const int tiles = t.last_key / kKeys + 1;
  load_queries<HD, kThreads>(qs, q, t, s.nh, threadIdx.x);
  pipe.start(-1, tiles, kc, vc, t, s.nkv);
  mma::cp_async_commit();  // Q and K_0
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int qpos0 = t.start + t.q0 + 16 * warp + lane / 4;  // position of the thread's row g
  const int first_masked = t.start + t.q0;                  // tiles ending before it need no mask
  const float scale_log2 = rsqrtf(static_cast<float>(HD)) * kLog2e;
  float o[HD / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t p[kKeys / 16][4];  // P_{j-1}
  // The top of iteration j: K_j and V_{j-1} in their slots for every thread. bf16: waits for the
  // copies, then starts those of K_{j+1} and V_j (into the slots iteration j - 1 freed). fp8: the
  // slots were widened during iteration j - 1 (mid).
  auto top = [&](int j) {
    if constexpr (!kFp8) mma::cp_async_wait<0>();
    wgmma::fence_shared_for_async();
    __syncthreads();
    if constexpr (!kFp8) {
      pipe.start(j, tiles, kc, vc, t, s.nkv);
      mma::cp_async_commit();
    }
  };
  // fp8, while iteration j's MMAs are in flight: waits for the copies of K_{j+1} and V_j, widens
  // them into their slots (which iteration j - 1's finished MMAs read), then starts the copies of
  // K_{j+2} and V_{j+1}. j = -1 (before the loop): Q to f16 and K_0 widened.
  auto mid = [&](int j) {
    if constexpr (kFp8) {
      mma::cp_async_wait<0>();
      __syncthreads();
      if (j < 0) queries_to_f16<HD>(qs);
      pipe.widen(j + 1, tiles);
      __syncthreads();
      pipe.start(j + 1, tiles, kc, vc, t, s.nkv);
      mma::cp_async_commit();
    }
  };
  // The wgmma issues stay out of branches (ptxas serialises wgmma in divergent paths): the first
  // and last iterations are peeled.
  float sc[8][4], corr[2];
  mid(-1);  // fp8: K_0 widened, the copies of K_1 and V_0 started
  top(0);
  wgmma::fence();
  issue_scores<HD, kFp8>(mma::smem_u32(qs), mma::smem_u32(ks), sc, threadIdx.x / 128);
  mid(0);
  wgmma::wait<0>();
  online_softmax(sc, m, l, corr, 0, qpos0, kKeys - 1 > first_masked, scale_log2);
  pack_probs<kFp8>(sc, p);  // O is still zero: no rescale
  for (int j = 1; j < tiles; ++j) {
    top(j);
    wgmma::fence();
    issue_scores<HD, kFp8>(mma::smem_u32(qs), mma::smem_u32(ks + (j % 2) * Lay::kv_bytes), sc,
                           threadIdx.x / 128);
    issue_pv<HD, kFp8>(p, mma::smem_u32(vs + ((j - 1) % 2) * Lay::kv_bytes), o);
    mid(j);
    wgmma::wait<1>();  // S_j done, P_{j-1} V_{j-1} in flight during the softmax
    const int k0 = j * kKeys;
    online_softmax(sc, m, l, corr, k0, qpos0, k0 + kKeys - 1 > first_masked, scale_log2);
    wgmma::wait<0>();
    rescale<HD>(o, corr);
    pack_probs<kFp8>(sc, p);
  }
  top(tiles);
  wgmma::fence();
  issue_pv<HD, kFp8>(p, mma::smem_u32(vs + ((tiles - 1) % 2) * Lay::kv_bytes), o);
  wgmma::wait<0>();
  write_out<HD>(o, l, t, s.nh, gate, s.gate_stride, out, threadIdx.x);
}

template <int HD, typename KvT>
void launch(const BatchMeta& b, const bf16* q, const bf16* gate, const KvT* kc, const KvT* vc,
            const AttnShape& s, int min_len, bf16* out, cudaStream_t stream) {
  constexpr size_t smem = PrefillLayout<HD, sizeof(KvT) == 1>::bytes;
  cudaFuncSetAttribute(attn_prefill_kernel<HD, KvT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  const int tiles = (b.max_seq_len + kRows - 1) / kRows;
  attn_prefill_kernel<HD, KvT><<<dim3(s.nh, b.num_seqs, tiles), kThreads, smem, stream>>>(
      b, q, gate, kc, vc, s, min_len, out);
}

template <typename KvT>
void launch_any(const BatchMeta& b, const bf16* q, const bf16* gate, const KvT* k_cache,
                const KvT* v_cache, const AttnShape& s, int min_len, bf16* out,
                cudaStream_t stream) {
  if (s.hd == 64) launch<64>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
  if (s.hd == 128) launch<128>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
  if (s.hd == 256) launch<256>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
}

}  // namespace

bool attention_prefill_supported(const AttnShape& s) {
  return s.hd == 64 || s.hd == 128 || s.hd == 256;
}

// A bf16 cache: the warp-specialized kernel (attention_prefill_ws.cu) unless DS_ATTN_WS=0.
void launch_attention_prefill(const BatchMeta& b, const bf16* q, const bf16* gate,
                              const bf16* k_cache, const bf16* v_cache, const AttnShape& s,
                              int min_len, bf16* out, cudaStream_t stream) {
  static const bool warp_specialized = ab_switch_on("DS_ATTN_WS");
  if (warp_specialized)
    return launch_attention_prefill_ws(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
  launch_any(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
}

void launch_attention_prefill(const BatchMeta& b, const bf16* q, const bf16* gate,
                              const uint8_t* k_cache, const uint8_t* v_cache, const AttnShape& s,
                              int min_len, bf16* out, cudaStream_t stream) {
  launch_any(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
}

}  // namespace deltaserve::cuda
