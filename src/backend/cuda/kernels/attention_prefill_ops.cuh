// The pieces of the prefill attention kernels (attention_prefill.cu, attention_prefill_ws.cu):
// a block's tile of query rows and its KV head, the cp.async copies of key / value / query rows
// into 128-byte-swizzled tiles, the two wgmma groups of an iteration (S = Q K^T from shared
// memory, or partly with Q's fragments in registers; O += P V with P in registers), the online
// softmax and the gated write-out. `tid` is a
// thread's index among the threads that copy (kCopyThreads of them) or among the two consumer
// warpgroups that hold the query rows (warpgroup w: rows 64 w .. 64 w + 63 of the tile).
#pragma once

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/smem_view.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda::attn_prefill {

using bf16 = __nv_bfloat16;
// Query rows a block (two warpgroups of 64), keys a tile.
constexpr int kRows = 128, kKeys = 64;

struct Tile {
  int begin, start, q0, rows, kvh, h, last_key, page_size;
  // ceil(2^32 / page_size) (0 for pages of one row): p / page_size = umulhi(p, magic) while
  // p * page_size < 2^32.
  uint32_t page_magic;
  const int32_t* pages;
};

// The block's tile: query head blockIdx.x, sequence blockIdx.y, query tile gridDim.z - 1 -
// blockIdx.z (the heaviest, latest queries, launched first). False where the sequence is shorter
// than min_len or has no rows in that tile.
__device__ inline bool block_tile(const BatchMeta& b, const AttnShape& s, int min_len, Tile& t) {
  const int h = blockIdx.x, seq = blockIdx.y, n = b.seq_len[seq];
  const int tile = gridDim.z - 1 - blockIdx.z;
  if (n < min_len || tile * kRows >= n) return false;
  t.begin = b.seq_begin[seq];
  t.start = b.seq_start[seq];
  t.q0 = tile * kRows;
  t.rows = min(kRows, n - t.q0);
  t.h = h;
  t.kvh = h / (s.nh / s.nkv);
  t.last_key = t.start + t.q0 + t.rows - 1;
  t.pages = b.pages + b.seq_page_off[seq];
  t.page_size = b.page_size;
  t.page_magic = 0xFFFFFFFFu / static_cast<uint32_t>(b.page_size) + 1;
  return true;
}

// This thread's share of copying a tile of R rows x HD into an SW128 tile: the 16-byte chunks
// g, g + kGroups, ... (kPer of them) of rows r0, r0 + kStep, ... Consecutive threads take
// consecutive chunks (coalesced); kStep is a multiple of 8, so a chunk lands at the same swizzled
// column in every row of the thread and the destinations are kStep rows apart; one row's address
// (and page lookup) serves kPer chunks.
template <int HD, int kCopyThreads>
struct RowCopy {
  static constexpr int kVec = HD / 8, kPer = kVec >= 16 ? 4 : 2, kGroups = kVec / kPer,
                       kStep = kCopyThreads / kGroups;
  static_assert(kStep % 8 == 0 && kStep <= kKeys);
  int g, r0;
  __device__ explicit RowCopy(int tid) : g(tid % kGroups), r0(tid / kGroups) {}
  // Byte offset of the thread's chunk k of row r0 in an SW128 tile of R rows.
  template <int R>
  __device__ uint32_t offset(int k) const {
    return wgmma::sw128_offset(R, r0, 8 * (g + k * kGroups));
  }
};

// Rows [k0, k0 + 64) of the KV head's cache (K or V) into the SW128 tile (rows past last_key
// zero); the caller commits the cp.async group.
template <int HD, int kCopyThreads>
__device__ void load_rows(unsigned char* tile, const bf16* cache, const Tile& t, int k0, int nkv,
                          int tid) {
  using RC = RowCopy<HD, kCopyThreads>;
  const RC rc(tid);
  const bf16* src = cache + t.kvh * HD + 8 * rc.g;
#pragma unroll
  for (int i = 0; i < kKeys / RC::kStep; ++i) {
    const int r = rc.r0 + i * RC::kStep;
    const uint32_t p = min(k0 + r, t.last_key), page = t.page_magic ? __umulhi(p, t.page_magic) : p;
    const bf16* row =
        src +
        (static_cast<size_t>(t.pages[page]) * t.page_size + (p - page * t.page_size)) * nkv * HD;
#pragma unroll
    for (int k = 0; k < RC::kPer; ++k)
      mma::cp_async16(tile + rc.template offset<kKeys>(k) + i * RC::kStep * wgmma::kRowBytes,
                      row + 8 * k * RC::kGroups, k0 + r <= t.last_key);
  }
}

// The block's query rows of head h into the SW128 Q tile (rows past t.rows zero).
template <int HD, int kCopyThreads>
__device__ void load_queries(unsigned char* tile, const bf16* q, const Tile& t, int nh, int tid) {
  using RC = RowCopy<HD, kCopyThreads>;
  const RC rc(tid);
#pragma unroll
  for (int i = 0; i < kRows / RC::kStep; ++i) {
    const int r = rc.r0 + i * RC::kStep;
    const bf16* row =
        q + (static_cast<size_t>(t.begin + t.q0 + min(r, t.rows - 1)) * nh + t.h) * HD + 8 * rc.g;
#pragma unroll
    for (int k = 0; k < RC::kPer; ++k)
      mma::cp_async16(tile + rc.template offset<kRows>(k) + i * RC::kStep * wgmma::kRowBytes,
                      row + 8 * k * RC::kGroups, r < t.rows);
  }
}

// Issues S (this warpgroup's 64 rows x 64 keys) = Q K^T as one wgmma group, Q and K K-major
// SW128 tiles; bf16 operands, or (kF16) f16. The first kRegSteps of its 16-column steps take Q's
// A fragments from registers instead (qa: this warp's 16 rows, load_query_frags), so that those
// MMAs read only K from shared memory.
template <int HD, bool kF16, int kRegSteps = 0>
__device__ void issue_scores(uint32_t qs, uint32_t ks, float (&s)[8][4], int wg,
                             const uint32_t (*qa)[4] = nullptr) {
  constexpr uint32_t kSbo = wgmma::kAtomBytes, kStep = 32;  // 16 bf16 along K
  const uint64_t qd = wgmma::desc(qs + wg * 64 * wgmma::kRowBytes, 16, kSbo),
                 kd = wgmma::desc(ks, 16, kSbo);
  float(&d)[32] = reinterpret_cast<float(&)[32]>(s);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const uint32_t col = kk / 4, in = (kk % 4) * kStep;  // the address field counts 16 bytes
    const uint64_t b = kd + ((col * kKeys * wgmma::kRowBytes + in) >> 4);
    if (kk < kRegSteps)
      wgmma::mma_64x64_rs<false, kF16>(d, qa[kk], b, kk > 0);
    else
      wgmma::mma_64x64_ss<kF16>(d, qd + ((col * kRows * wgmma::kRowBytes + in) >> 4), b, kk > 0);
  }
  wgmma::commit();
}

// This warp's A fragments of the Q tile (rows 64 wg + 16 (warp % 4) .., the first kRegSteps
// 16-column steps) from the SW128 tile at q (kRows rows).
template <int kRegSteps>
__device__ void load_query_frags(uint32_t (&qa)[kRegSteps][4], const unsigned char* q, int wg,
                                 int warp) {
  const Sw128Rows<kRows> view{reinterpret_cast<const bf16*>(q)};
#pragma unroll
  for (int kk = 0; kk < kRegSteps; ++kk) mma::load_a_at(qa[kk], view, wg * 64 + 16 * warp, 16 * kk);
}

// The online softmax over one key tile for the thread's rows g and g + 8: masks keys after each
// row's position, updates the running max m and (per-thread partial) sum l, turns s into
// unnormalised probabilities and returns the factor the rows' O must be scaled by.
__device__ inline void online_softmax(float (&s)[8][4], float (&m)[2], float (&l)[2],
                                      float (&corr)[2], int k0, int qpos0, bool masked,
                                      float scale_log2) {
  const int lane = threadIdx.x % 32, c = lane % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int qpos = qpos0 + 8 * hf;
    float mx = m[hf];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = s[n][2 * hf + e];
        if (masked && k0 + 8 * n + 2 * c + e > qpos) v = -INFINITY;
        mx = fmaxf(mx, v);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Every row sees key 0 in the first tile, so mx is finite from then on.
    const float base = mx * scale_log2;
    corr[hf] = exp2f((m[hf] - mx) * scale_log2);
    m[hf] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = s[n][2 * hf + e];
        v = exp2f(fmaf(v, scale_log2, -base));
        sum += v;
      }
    l[hf] = l[hf] * corr[hf] + sum;
  }
}

// O's rows times their softmax correction; skipped when no row of the warp has a new max (most
// key tiles once the running max has settled).
template <int HD>
__device__ void rescale(float (&o)[HD / 8][4], const float (&corr)[2]) {
  if (!__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) return;
#pragma unroll
  for (int d = 0; d < HD / 8; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[d][e] *= corr[e / 2];
}

// P (the probabilities of a 64-key tile) as bf16 (kF16: f16) A fragments, 16 keys each.
template <bool kF16>
__device__ void pack_probs(const float (&s)[8][4], uint32_t (&p)[kKeys / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      p[kk][i] =
          mma::pack_16<kF16>(s[2 * kk + i / 2][2 * (i % 2)], s[2 * kk + i / 2][2 * (i % 2) + 1]);
}

// Issues O (this warpgroup's 64 rows x HD) += P V as one wgmma group, V (keys x HD) an MN-major
// SW128 tile; bf16 operands, or (kF16) f16.
template <int HD, bool kF16>
__device__ void issue_pv(const uint32_t (&p)[kKeys / 16][4], uint32_t vs, float (&o)[HD / 8][4]) {
  constexpr uint32_t kLbo = kKeys * wgmma::kRowBytes, kSbo = wgmma::kAtomBytes;
  const uint64_t vd = wgmma::desc(vs, kLbo, kSbo);
  float(&d)[HD / 2] = reinterpret_cast<float(&)[HD / 2]>(o);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint64_t b = vd + ((kk * 16 * wgmma::kRowBytes) >> 4);
    if constexpr (HD == 64) wgmma::mma_64x64_rs<true, kF16>(d, p[kk], b);
    if constexpr (HD == 128) wgmma::mma_64x128_rs<kF16>(d, p[kk], b);
    if constexpr (HD == 256) wgmma::mma_64x256_rs<kF16>(d, p[kk], b);
  }
  wgmma::commit();
}

// out = O / l * sigmoid(gate) for the thread's rows that exist.
template <int HD>
__device__ void write_out(const float (&o)[HD / 8][4], float (&l)[2], const Tile& t, int nh,
                          const bf16* gate, int gate_stride, bf16* out, int tid) {
  const int lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float sum = l[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = 16 * warp + g + 8 * hf;
    if (r >= t.rows) continue;
    const float inv = 1.0f / sum;
    const size_t row = static_cast<size_t>(t.begin + t.q0 + r) * nh + t.h;
    const size_t base = row * HD + 2 * c, gate_base = row * gate_stride + 2 * c;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      const size_t idx = base + 8 * d;
      const float2 gv =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(gate + gate_base + 8 * d));
      *reinterpret_cast<__nv_bfloat162*>(out + idx) =
          __floats2bfloat162_rn(o[d][2 * hf] * inv / (1.0f + __expf(-gv.x)),
                                o[d][2 * hf + 1] * inv / (1.0f + __expf(-gv.y)));
    }
  }
}

}  // namespace deltaserve::cuda::attn_prefill
