#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_prefill.cuh"
#include "backend/cuda/kernels/attention_wave_splits.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kv_fp8.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kTile = 16;       // keys a warp folds in at once
constexpr int kStages = 3;      // tiles of a warp in shared memory (two loading while one is used)
constexpr int kMaxSplits = 32;  // key-range splits of a decode row (attention_splits)
constexpr int kLongSplitRows = 4, kLongSplitKeys = 256;  // launch_split
constexpr int kWideSplitRows = 16, kWideSplitKeys = 512;

// A warp's key / value tiles (KvT the cache's element: bf16, or uint8_t for fp8 e4m3). bf16:
// kStages stages of {K, V} x 16 rows of kHd elements, each row padded by 16 bytes so the eight
// rows an ldmatrix reads fall on distinct banks. fp8: the stages hold the cache's e4m3 rows (kHd +
// 16 bytes each) and both K's and V's MMA fragments are converted straight from them — 26 KB a
// warp at kHd 256, so that two blocks (three tiles a warp) fit an SM. kHd is the head size rounded
// up to 64 / 128 / 256; the columns past the real head size are zero. Measured on the H200 (4B,
// context 8k, B = 256): 1.08 ms a layer (4.0 TB/s of fp8 bytes) against 1.23 in the same lease
// with two stages and V widened into an f16 tile (ba669b7); earlier, 1.87 with three stages and
// the widened tile (one block an SM), 2.32 with K widened too; bf16 2.08 (4.1 TB/s).
template <int kHd, typename KvT>
struct DecodeTiles {
  static constexpr bool kFp8 = sizeof(KvT) == 1;
  static constexpr int kRow = kHd + 8;                     // bf16 elements of a padded row
  static constexpr int kCopyRow = kFp8 ? kHd + 16 : kRow;  // KvT elements of a copied row
  static constexpr int kCopyMat = kTile * kCopyRow;
  static constexpr size_t kCopyStageBytes = 2 * kCopyMat * sizeof(KvT);
  static constexpr size_t kWarpBytes = kStages * kCopyStageBytes;
  static constexpr size_t kBytes = kWarps * kWarpBytes;
  static_assert(kCopyStageBytes % 16 == 0 && kWarpBytes % 16 == 0);
};

// A block's page-table entries: those of its key range copied into shared memory at its start
// (one L2 round trip for the block), when they fit in kPageWindow, else the sequence's table in
// global memory. Before, each 16-key tile's copies waited for a dependent load of its page entry:
// in ncu at B = 16, context 8k, 29% of the kernel's stall samples sat on that load's use.
// DS_ATTN_PAGE_WINDOW=0: every tile's entry from global memory (A/B). Measured with the
// wave-filling splits alone (h200_2026-12-05.md): graphed B = 16 3.672 / 3.697 ms against 3.770 /
// 3.735 with both off.
constexpr int kPageWindow = 1024;
struct PageLookup {
  const int* entries;  // entries[page / page_size - first]
  int first;
};

// Copies keys [k0, k0 + 16) of the range ending at p1 (a key past it repeats key p1 - 1; its
// score is masked) from the caches into a copy stage. Lane r < 16 looks up key k0 + r's cache row.
template <int kHd, typename KvT>
__device__ void load_kv_tile(KvT* stage, const BatchMeta& b, const PageLookup& pages,
                             const AttnShape& s, int kvh, int k0, int p1,
                             const KvT* __restrict__ kc, const KvT* __restrict__ vc) {
  using L = DecodeTiles<kHd, KvT>;
  constexpr int kPer = 16 / sizeof(KvT);                        // elements of a 16-byte piece
  constexpr int kChunks = kHd / kPer, kRowsPer = 32 / kChunks;  // pieces a row, rows a pass
  const int lane = threadIdx.x % 32;
  const int p = min(k0 + lane % kTile, p1 - 1);
  const int page = pages.entries[p / b.page_size - pages.first];
  const int row = (page * b.page_size + p % b.page_size) * s.nkv + kvh;
  const int c = lane % kChunks;
  const bool valid = c * kPer < s.hd;
#pragma unroll
  for (int r0 = 0; r0 < kTile; r0 += kRowsPer) {
    const int r = r0 + lane / kChunks;
    const size_t at =
        static_cast<size_t>(__shfl_sync(0xffffffffu, row, r)) * s.hd + (valid ? c * kPer : 0);
    mma::cp_async16(stage + r * L::kCopyRow + c * kPer, kc + at, valid);
    mma::cp_async16(stage + L::kCopyMat + r * L::kCopyRow + c * kPer, vc + at, valid);
  }
}

// K's B fragments for keys 0..7 (kb[0..1]) and 8..15 (kb[2..3]) at columns 16 ks..: ldmatrix from
// a bf16 tile, or straight from an fp8 copy stage (a fragment's pairs are adjacent bytes of a K
// row), each pair converted to f16.
template <int kHd>
__device__ void load_k_frag(uint32_t (&kb)[4], const __nv_bfloat16* kt, int ks) {
  mma::load_b_trans(kb, kt + 16 * ks, DecodeTiles<kHd, __nv_bfloat16>::kRow);
}
template <int kHd>
__device__ void load_k_frag(uint32_t (&kb)[4], const uint8_t* kt, int ks) {
  constexpr int kRow = DecodeTiles<kHd, uint8_t>::kCopyRow;
  const int lane = threadIdx.x % 32;
  const uint8_t* r = kt + (lane / 4) * kRow + 16 * ks + 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    kb[i] = kv_fp8::widen2_f16(
        *reinterpret_cast<const uint16_t*>(r + (i / 2) * 8 * kRow + (i % 2) * 8));
}

// fp8: V's B fragments for the n-blocks 4 m + q (q = 0..3) straight from the copy stage:
// vb[q][0] keys 0..7, vb[q][1] keys 8..15. The columns are permuted (v_column) so that a lane's
// four n-blocks of a group are four adjacent bytes of a row: one 32-bit load a row (rows 2c,
// 2c + 1, 2c + 8, 2c + 9; on distinct banks, as the row stride is 68 words), byte pairs of two
// rows by prmt, each pair converted to f16.
template <int kHd>
__device__ void load_v_frags(uint32_t (&vb)[4][2], const uint8_t* vt, int m) {
  constexpr int kRow = DecodeTiles<kHd, uint8_t>::kCopyRow;
  const int lane = threadIdx.x % 32, c = lane % 4;
  const uint8_t* at = vt + 2 * c * kRow + 32 * m + 4 * (lane / 4);
#pragma unroll
  for (int k = 0; k < 2; ++k) {  // keys 2c, 2c + 1 (k = 0) or 2c + 8, 2c + 9 (k = 1)
    const uint32_t lo = *reinterpret_cast<const uint32_t*>(at + 8 * k * kRow),
                   hi = *reinterpret_cast<const uint32_t*>(at + (8 * k + 1) * kRow);
    const uint32_t q01 = __byte_perm(lo, hi, 0x5140), q23 = __byte_perm(lo, hi, 0x7362);
    vb[0][k] = kv_fp8::widen2_f16(static_cast<uint16_t>(q01));
    vb[1][k] = kv_fp8::widen2_f16(static_cast<uint16_t>(q01 >> 16));
    vb[2][k] = kv_fp8::widen2_f16(static_cast<uint16_t>(q23));
    vb[3][k] = kv_fp8::widen2_f16(static_cast<uint16_t>(q23 >> 16));
  }
}

// The head column of element e (0, 1) of a lane's accumulator for n-block j: 8 j + 2 (lane % 4)
// + e, or (kFp8Order, load_v_frags' fp8 form) that n index's permuted column.
template <bool kFp8Order>
__device__ inline int v_column(int j, int e) {
  const int n = 2 * (threadIdx.x % 4) + e;
  return kFp8Order ? 32 * (j / 4) + 4 * n + j % 4 : 8 * j + n;
}

// One warp's online softmax over its tiles for the rows g = lane / 4 < G (query heads): the
// running max m (log2 units), this lane's share of the sum l, and o (head g; o[j][e] is column
// v_column<kF16>(j, e)). kF16: an fp8 cache's fragments are converted to f16 and Q is f16, so the
// MMAs and P are f16.
template <int kHd, bool kF16>
struct DecodeRows {
  float m = -INFINITY, l = 0.0f;
  float o[kHd / 8][2] = {};

  // o's n-block j rescaled by corr, then += P V over its B fragment (b0, b1).
  __device__ void fold_values(int j, float corr, uint32_t pa0, uint32_t pa2, uint32_t b0,
                              uint32_t b1) {
    o[j][0] *= corr;
    o[j][1] *= corr;
    mma::mma_rows8<kF16>(o[j], pa0, pa2, b0, b1);
  }

  // Folds in one tile of `valid` keys (K at kt, V at vt: a stage's bf16 tiles, or its fp8 rows);
  // qa holds Q's A fragments (rows 0..7).
  template <typename KvT>
  __device__ void fold(const KvT* kt, const KvT* vt, const uint32_t (&qa)[kHd / 16][2], int valid,
                       float scale_log2) {
    float sc[2][2][2] = {};  // [chain][keys 0..7 / 8..15][two columns]
#pragma unroll
    for (int ks = 0; ks < kHd / 16; ++ks) {
      uint32_t kb[4];
      load_k_frag<kHd>(kb, kt, ks);
      mma::mma_rows8<kF16>(sc[ks % 2][0], qa[ks][0], qa[ks][1], kb[0], kb[1]);
      mma::mma_rows8<kF16>(sc[ks % 2][1], qa[ks][0], qa[ks][1], kb[2], kb[3]);
    }
    const int c = threadIdx.x % 4;
    float x[2][2], mx = m;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        x[h][e] = 8 * h + 2 * c + e < valid ? (sc[0][h][e] + sc[1][h][e]) * scale_log2 : -INFINITY;
        mx = fmaxf(mx, x[h][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float corr = exp2f(m - mx);
    m = mx;
    float p[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) p[h][e] = exp2f(x[h][e] - mx);
    l = l * corr + (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);
    const uint32_t pa0 = mma::pack_16<kF16>(p[0][0], p[0][1]),
                   pa2 = mma::pack_16<kF16>(p[1][0], p[1][1]);
    if constexpr (kF16) {
#pragma unroll
      for (int m = 0; m < kHd / 32; ++m) {
        uint32_t vb[4][2];
        load_v_frags<kHd>(vb, vt, m);
#pragma unroll
        for (int q = 0; q < 4; ++q) fold_values(4 * m + q, corr, pa0, pa2, vb[q][0], vb[q][1]);
      }
    } else {
#pragma unroll
      for (int n = 0; n < kHd / 16; ++n) {
        uint32_t vb[4];
        mma::load_b(vb, vt + 16 * n, DecodeTiles<kHd, __nv_bfloat16>::kRow);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          fold_values(2 * n + h, corr, pa0, pa2, vb[2 * h], vb[2 * h + 1]);
      }
    }
  }
};

// Q's A fragments for query heads kvh * G + g (rows g = lane / 4 < G, zero elsewhere and past hd),
// bf16 or (kF16) f16.
template <int kHd, bool kF16>
__device__ void load_q_rows(uint32_t (&qa)[kHd / 16][2], const __nv_bfloat16* __restrict__ q, int t,
                            int kvh, const AttnShape& s) {
  const int G = s.nh / s.nkv, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
  const __nv_bfloat16* row = q + (static_cast<size_t>(t) * s.nh + kvh * G + g) * s.hd;
#pragma unroll
  for (int ks = 0; ks < kHd / 16; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int d = 16 * ks + 8 * h + 2 * c;
      qa[ks][h] = g < G && d < s.hd ? *reinterpret_cast<const uint32_t*>(row + d) : 0u;
      if constexpr (kF16) qa[ks][h] = mma::bf16x2_to_f16x2(qa[ks][h]);
    }
}

// Block (token t, KV head, split): the G = nh / nkv query heads sharing the KV head walk the keys
// [p0, p1) of the token's causal range [0, pos] on tensor cores, the heads as the rows of
// 16 x 8 x 16 MMAs (S = Q K^T, then O += P V; each key and value row read once for all G heads).
// Warp w takes the 16-key tiles w, w + kWarps, ... (its own cp.async pipeline of kStages tiles)
// with its own online softmax; the warps merge at the end. With one split the block writes
// sigmoid(gate) * softmax(.) v; else the unnormalised partial (m, l, acc[hd]) goes to
// ws [T, nh, splits, hd + 2] for attn_combine_kernel. An fp8 cache's K and V fragments are
// converted to f16 straight from the copy stage (f16 MMAs, Q and P in f16; V's columns permuted,
// v_column).
template <int kHd, typename KvT>
__global__ void __launch_bounds__(32 * kWarps)
    attn_split_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ q,
                      const __nv_bfloat16* __restrict__ gate, const KvT* __restrict__ kc,
                      const KvT* __restrict__ vc, AttnShape s, int splits, int min_len,
                      int min_chunk, bool page_window, bool late_successor, float* __restrict__ ws,
                      __nv_bfloat16* __restrict__ out) {
  using L = DecodeTiles<kHd, KvT>;
  constexpr bool kF16 = L::kFp8;
  // A programmatic dependent may start streaming its weights (late_successor: once this block's
  // keys and values have all arrived).
  if (!late_successor) pdl::allow_successor();
  pdl::wait_for_predecessor();
  extern __shared__ __align__(16) unsigned char tiles[];
  __shared__ float sm[kWarps][8], sl[kWarps][8];
  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int G = s.nh / s.nkv, hd = s.hd;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4;
  const int seq = b.token_seq[t], n = b.token_pos[t] + 1;
  if (b.seq_len[seq] >= min_len) return;  // the tensor-core prefill kernel's
  const int chunk = max(min_chunk, (n + splits * kTile - 1) / (splits * kTile) * kTile);
  const int p0 = min(n, split * chunk), p1 = min(n, p0 + chunk);
  const int* table = b.pages + b.seq_page_off[seq];
  __shared__ int window[kPageWindow];
  const int pg0 = p0 / b.page_size, npg = p1 > p0 ? (p1 - 1) / b.page_size - pg0 + 1 : 0;
  const bool windowed = page_window && npg <= kPageWindow;
  if (windowed)
    for (int j = static_cast<int>(threadIdx.x); j < npg; j += 32 * kWarps)
      window[j] = table[pg0 + j];
  __syncthreads();
  const PageLookup pages = windowed ? PageLookup{window, pg0} : PageLookup{table, 0};
  unsigned char* mine_bytes = tiles + warp * L::kWarpBytes;
  KvT* mine = reinterpret_cast<KvT*>(mine_bytes);  // the copy stages
  const int first = p0 + warp * kTile, stride = kWarps * kTile;
  const int count = first < p1 ? (p1 - first + stride - 1) / stride : 0;
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < count)
      load_kv_tile<kHd>(mine + i * 2 * L::kCopyMat, b, pages, s, kvh, first + i * stride, p1, kc,
                        vc);
    mma::cp_async_commit();
  }
  uint32_t qa[kHd / 16][2];
  load_q_rows<kHd, kF16>(qa, q, t, kvh, s);
  const float scale_log2 = rsqrtf(static_cast<float>(hd)) * kLog2e;
  DecodeRows<kHd, kF16> rows;
  for (int i = 0; i < count; ++i) {
    const int next = i + kStages - 1;
    if (next < count)
      load_kv_tile<kHd>(mine + next % kStages * 2 * L::kCopyMat, b, pages, s, kvh,
                        first + next * stride, p1, kc, vc);
    mma::cp_async_commit();
    mma::cp_async_wait<kStages - 1>();
    __syncwarp();
    const KvT* copied = mine + i % kStages * 2 * L::kCopyMat;
    rows.fold(copied, copied + L::kCopyMat, qa, p1 - (first + i * stride), scale_log2);
    __syncwarp();
  }
  mma::cp_async_wait<0>();
  __syncwarp();
  if (late_successor) pdl::allow_successor();
  // Each warp's rows to shared memory (over its own tiles), then the merge across warps.
  rows.l += __shfl_xor_sync(0xffffffffu, rows.l, 1);
  rows.l += __shfl_xor_sync(0xffffffffu, rows.l, 2);
  float* sacc = reinterpret_cast<float*>(mine_bytes);  // [G][hd]
  if (g < G) {
#pragma unroll
    for (int j = 0; j < kHd / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = v_column<kF16>(j, e);
        if (d < hd) sacc[g * hd + d] = rows.o[j][e];
      }
    if (lane % 4 == 0) {
      sm[warp][g] = rows.m;
      sl[warp][g] = rows.l;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < G * hd; e += 32 * kWarps) {
    const int gg = e / hd, d = e % hd, h = kvh * G + gg;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w][gg]);
    float Lsum = 0.0f, o = 0.0f;
    if (M > -INFINITY)
      for (int w = 0; w < kWarps; ++w)
        if (sm[w][gg] > -INFINITY) {
          const float c = exp2f(sm[w][gg] - M);
          Lsum += sl[w][gg] * c;
          o += reinterpret_cast<const float*>(tiles + w * L::kWarpBytes)[gg * hd + d] * c;
        }
    const size_t idx = (static_cast<size_t>(t) * s.nh + h) * hd + d;
    if (splits == 1) {
      const float g =
          __bfloat162float(gate[(static_cast<size_t>(t) * s.nh + h) * s.gate_stride + d]);
      out[idx] = __float2bfloat16(o / Lsum / (1.0f + __expf(-g)));
    } else {
      float* part = ws + ((static_cast<size_t>(t) * s.nh + h) * splits + split) * (hd + 2);
      part[2 + d] = o;
      if (d == 0) {
        part[0] = M;
        part[1] = Lsum;
      }
    }
  }
}

// Block (t, head): merges the splits' partials and applies the gate. The splits' maxima and sums
// come first, one thread a split, so that every load of a thread's column is independent of the
// others (a split's scale is 0 where it saw no key: its partial is not read). kBatched (from
// kCombineBatchMinSplits splits): a thread issues all its column's loads before adding them, one
// L2 round trip instead of one per eight splits. Measured on the H200 (4B, context 1k, graphed ms,
// two rounds, batched / eight at a time): B = 1 (32 splits) 3.003, 3.015 / 3.033, 3.030 (the
// attention op -9%); B = 4 (17) 3.214, 3.235 / 3.229, 3.212 with the op 6% slower eager, so not
// there. DS_ATTN_COMBINE_BATCH=0: never batched (A/B).
constexpr int kCombineBatchMinSplits = 24;
template <bool kBatched>
__global__ void attn_combine_kernel(BatchMeta b, AttnShape s, int splits, int min_len,
                                    const float* __restrict__ ws,
                                    const __nv_bfloat16* __restrict__ gate,
                                    __nv_bfloat16* __restrict__ out) {
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  __shared__ float max_k[kMaxSplits], sum_k[kMaxSplits], scale_k[kMaxSplits];
  const int t = blockIdx.x, h = blockIdx.y, hd = s.hd;
  if (b.seq_len[b.token_seq[t]] >= min_len) return;
  pdl::wait_for_predecessor();
  const float* part = ws + (static_cast<size_t>(t) * s.nh + h) * splits * (hd + 2);
  for (int k = threadIdx.x; k < splits; k += blockDim.x) {
    max_k[k] = part[k * (hd + 2)];
    sum_k[k] = part[k * (hd + 2) + 1];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int k = 0; k < splits; ++k) M = fmaxf(M, max_k[k]);
  for (int k = threadIdx.x; k < splits; k += blockDim.x)
    scale_k[k] = max_k[k] == -INFINITY ? 0.0f : exp2f(max_k[k] - M);  // maxima in log2 units
  __syncthreads();
  float L = 0.0f;
  for (int k = 0; k < splits; ++k) L += scale_k[k] == 0.0f ? 0.0f : sum_k[k] * scale_k[k];
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    const size_t idx = (static_cast<size_t>(t) * s.nh + h) * hd + d;
    const float g = __bfloat162float(gate[(static_cast<size_t>(t) * s.nh + h) * s.gate_stride + d]);
    float o = 0.0f;
    if constexpr (kBatched) {
      float v[kMaxSplits];  // then the same sum as below, in the same order
#pragma unroll
      for (int k = 0; k < kMaxSplits; ++k)
        v[k] = k < splits && scale_k[k] != 0.0f ? part[k * (hd + 2) + 2 + d] : 0.0f;
#pragma unroll
      for (int k = 0; k < kMaxSplits; ++k)
        if (k < splits) o += scale_k[k] == 0.0f ? 0.0f : v[k] * scale_k[k];
    } else {
#pragma unroll 8
      for (int k = 0; k < splits; ++k)
        o += scale_k[k] == 0.0f ? 0.0f : part[k * (hd + 2) + 2 + d] * scale_k[k];
    }
    out[idx] = __float2bfloat16(o / L / (1.0f + __expf(-g)));
  }
}

template <int kHd, typename KvT>
void launch_split(const BatchMeta& b, int rows, const __nv_bfloat16* q, const __nv_bfloat16* gate,
                  const KvT* k_cache, const KvT* v_cache, const AttnShape& s, int splits,
                  int min_len, float* ws, __nv_bfloat16* out, cudaStream_t stream) {
  constexpr size_t smem = DecodeTiles<kHd, KvT>::kBytes;
  // From kLongSplitRows rows on, every split takes at least kLongSplitKeys keys, from
  // kWideSplitRows on kWideSplitKeys: at short contexts the last splits are then empty (the
  // combine skips them) and each block folds more tiles. Measured on the H200 (4B, context 1k,
  // graphed ms with floors of 128 / 256 / 512 keys, medians of two): B = 4 3.265 / 3.209 / 3.251,
  // B = 16 3.943 / 3.897 / 3.875, B = 32 4.652 / 4.653 / 4.627, B = 64 6.024 / 6.010 / 5.996;
  // earlier, 4 rows 22.6 us a layer with 128 against 27.3 with none, one row 18.6 against 16.9,
  // so not there (a graph fixes the split count by rows, never by context).
  // DS_ATTN_MIN_SPLIT_KEYS=N (A/B) sets one floor for every row count from kLongSplitRows on.
  static const int forced = [] {
    const char* v = std::getenv("DS_ATTN_MIN_SPLIT_KEYS");
    return v ? std::max(0, std::atoi(v)) / kTile * kTile : -1;
  }();
  const int min_chunk = rows < kLongSplitRows    ? 0
                        : forced >= 0            ? forced
                        : rows >= kWideSplitRows ? kWideSplitKeys
                                                 : kLongSplitKeys;
  static const bool page_window = ab_switch_on("DS_ATTN_PAGE_WINDOW");
  // The dependent (the output projection) starts once a block's keys are in where the rows take
  // several splits (a few rows: latency-bound, and the projection's early weight stream slows
  // their loads), at the block's start else. Measured on the H200 (graphed ms, two rounds, late /
  // at the start): context 8k B = 1 2.888, 2.892 / 2.917, 2.915; B = 4 3.201, 3.201 / 3.243,
  // 3.235; B = 16 4.473, 4.482 / 4.490, 4.492; at context 1k within the spread of the runs; late
  // at 64 rows (one split) 5.776, 5.756 / 5.732, 5.733. DS_PDL_LATE_ATTN=0: always at the start,
  // =1: always late (A/B).
  static const int late_forced = ab_switch_forced("DS_PDL_LATE_ATTN");
  const bool late = late_forced == -1 ? splits > 1 : late_forced == 1;
  cudaFuncSetAttribute(attn_split_kernel<kHd, KvT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       smem);
  pdl::launch_dependent(attn_split_kernel<kHd, KvT>, dim3(rows, s.nkv, splits), 32 * kWarps, smem,
                        stream, b, q, gate, k_cache, v_cache, s, splits, min_len, min_chunk,
                        page_window, late, ws, out);
}

// The split count that fills whole waves (attention_wave_splits.h). In ncu at 16 rows, context
// 8k, the 5 splits' 320 blocks ran 2.42 waves at 3.44 TB/s; 2 splits make one wave of 128.
// DS_ATTN_WAVE_SPLITS=0: cap itself (A/B); measured with the page window (above).
int wave_splits(int blocks, int cap, int num_sms) {
  static const bool on = ab_switch_on("DS_ATTN_WAVE_SPLITS");
  return on ? wave_filling_splits(blocks, cap, num_sms) : cap;
}

}  // namespace

int attention_splits(int num_tokens, const AttnShape& s, int num_sms, size_t ws_bytes) {
  if (num_tokens == 0 || num_tokens > 256) return 1;  // prefill: enough blocks without splitting
  const int blocks = num_tokens * s.nkv;
  int splits = wave_splits(blocks, two_wave_splits(blocks, num_sms, kMaxSplits), num_sms);
  while (splits > 1 &&
         static_cast<size_t>(num_tokens) * s.nh * splits * (s.hd + 2) * sizeof(float) > ws_bytes)
    --splits;
  return splits;
}

namespace {

template <typename KvT>
void paged_attention(const BatchMeta& b, int split_rows, int prefill_from, const __nv_bfloat16* q,
                     const __nv_bfloat16* gate, const KvT* k_cache, const KvT* v_cache,
                     const AttnShape& s, int splits, float* ws, __nv_bfloat16* out,
                     cudaStream_t stream) {
  if (b.num_tokens == 0) return;
  int min_len = 1 << 30;
  if (b.max_seq_len >= kAttnPrefillMinLen && prefill_from < b.num_seqs &&
      attention_prefill_supported(s)) {
    min_len = kAttnPrefillMinLen;
    launch_attention_prefill(seqs_from(b, prefill_from), q, gate, k_cache, v_cache, s, min_len, out,
                             stream);
  }
  if (split_rows == 0) return;
  if (s.hd <= 64)
    launch_split<64>(b, split_rows, q, gate, k_cache, v_cache, s, splits, min_len, ws, out, stream);
  else if (s.hd <= 128)
    launch_split<128>(b, split_rows, q, gate, k_cache, v_cache, s, splits, min_len, ws, out,
                      stream);
  else
    launch_split<256>(b, split_rows, q, gate, k_cache, v_cache, s, splits, min_len, ws, out,
                      stream);
  static const bool batch_on = ab_switch_on("DS_ATTN_COMBINE_BATCH");
  const bool batched = batch_on && splits >= kCombineBatchMinSplits;
  if (splits > 1)
    pdl::launch_dependent(batched ? attn_combine_kernel<true> : attn_combine_kernel<false>,
                          dim3(split_rows, s.nh), std::min(s.hd, 256), 0, stream, b, s, splits,
                          min_len, ws, gate, out);
}

}  // namespace

void launch_paged_attention(const BatchMeta& b, int split_rows, int prefill_from,
                            const __nv_bfloat16* q, const __nv_bfloat16* gate,
                            const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                            const AttnShape& s, int splits, float* ws, __nv_bfloat16* out,
                            cudaStream_t stream) {
  paged_attention(b, split_rows, prefill_from, q, gate, k_cache, v_cache, s, splits, ws, out,
                  stream);
}

void launch_paged_attention(const BatchMeta& b, int split_rows, int prefill_from,
                            const __nv_bfloat16* q, const __nv_bfloat16* gate,
                            const uint8_t* k_cache, const uint8_t* v_cache, const AttnShape& s,
                            int splits, float* ws, __nv_bfloat16* out, cudaStream_t stream) {
  paged_attention(b, split_rows, prefill_from, q, gate, k_cache, v_cache, s, splits, ws, out,
                  stream);
}

}  // namespace deltaserve::cuda
