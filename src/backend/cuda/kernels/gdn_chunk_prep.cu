// Kernel 1 of the chunked delta rule: every (sequence, chunk of 64, value head) in parallel — a
// block takes kHeads (1 or 2) value heads of one key head, so that their shared q / k are staged,
// convolved, normalised and multiplied once. From the conv output it forms the normalised q / k and
// the gates, then on bf16 tensor cores (f32 accumulation) q_i . k_j and k_i . k_j, and per value
// head L = beta_i (k_i . k_j) e^(gam_i - gam_j) (j < i) and P = (q_i . k_j) e^(gam_i - gam_j)
// (j <= i); T = (I + L)^-1 by 16 x 16 blocks (f32 diagonal blocks, tf32 tensor cores below); and
// W = T diag(beta e^gam) K, U = T diag(beta) V. See gdn_chunk_layout.cuh for what it writes.
#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/gdn_chunk_inverse.cuh"
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/gdn_conv4.cuh"
#include "backend/cuda/kernels/gdn_gates.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
constexpr int kHalo = kConvK - 1, kConvRows = kChunk + kHalo;  // conv inputs before / of a chunk

// q's rows are dead once the products are formed (q . k in registers, normalised q stored): the
// region then holds T diag(beta) and T diag(beta e^gam) of each value head in turn (one row more
// than q's staging takes, for their padding).
struct Inverses {
  bf16 a_u[kChunk][kLdC];  // T diag(beta)
  bf16 a_w[kChunk][kLdC];  // T diag(beta e^gam)
};
union QOrInverses {
  bf16 q[kConvRows + 1][kLd];  // rows 0..63 once staged
  Inverses a;
};

template <int kHeads>
struct PrepSmem {
  QOrInverses qa;
  bf16 k[kConvRows][kLd], v[kHeads][kConvRows][kLd];  // rows 0..63 once staged
  float l[kChunk][kLdF];                              // L (strictly lower)
  float t[kChunk][kLdF];                              // T = (I + L)^-1 (lower)
  float x[4][16][kLdX];                               // block products of the inverse
  float gam[kHeads][kChunk], beta[kHeads][kChunk], beta_egam[kHeads][kChunk];
};
static_assert(2 * (sizeof(PrepSmem<2>) + 1024) <= 228 * 1024, "two blocks per SM");

// Staging over regions dead at the time: the conv taps of the chunk's q, k and v channels
// ([(2 + kHeads) x 128][kConvK], as in the checkpoint) over l before the products; P over a_u
// from the products until it is stored (before the inverse writes a_u); the W and U tiles over l
// and t in the solve.
template <int kHeads>
__host__ __device__ constexpr int tap_bytes() {
  return (2 + kHeads) * kDim * kConvK * 2;
}
static_assert(tap_bytes<2>() <= sizeof(PrepSmem<2>::l), "the taps fit over L");
static_assert(kChunk * kLd * 2 <= sizeof(PrepSmem<2>::l), "a 64 x 128 bf16 tile fits over L / T");
template <int kHeads>
__device__ bf16* taps_of(PrepSmem<kHeads>& sm) {
  return reinterpret_cast<bf16*>(&sm.l[0][0]);
}
template <int kHeads>
__device__ bf16 (*out_tile(PrepSmem<kHeads>& sm, bool is_u))[kLd] {
  return reinterpret_cast<bf16(*)[kLd]>(is_u ? &sm.t[0][0] : &sm.l[0][0]);
}

struct Chunk {
  int begin, n, t0;  // first token row, valid rows, offset in the sequence's step tokens
  int h, kh, T;      // (first) value head, key head, step tokens
  int slot;          // the sequence's state slot
  bool fresh;        // the sequence starts at 0 (no conv state)
};

// The first channel of q (which 0), k (1) or the v of value head h + which - 2 (which >= 2) of the
// chunk's heads in a row of y or u, and the shared rows it goes to.
__device__ int channel0(int which, const Chunk& ch, const GdnShape& s) {
  const int key_dim = s.nk * kDim;
  return which == 0   ? ch.kh * kDim
         : which == 1 ? key_dim + ch.kh * kDim
                      : 2 * key_dim + (ch.h + which - 2) * kDim;
}
template <int kHeads>
__device__ bf16 (*rows_of(PrepSmem<kHeads>& sm, int which))[kLd] {
  return which == 0 ? sm.qa.q : which == 1 ? sm.k : sm.v[which - 2];
}
__device__ int conv_dim(const GdnShape& s) { return 2 * s.nk * kDim + s.nv * kDim; }

// q, k, v of the chunk's rows from the conv outputs y into rows 0..63 (rows past n zero).
template <int kHeads>
__device__ void load_conv_outputs(PrepSmem<kHeads>& sm, const Chunk& ch, const bf16* y,
                                  const GdnShape& s) {
  const int C = conv_dim(s);
  for (int e = threadIdx.x; e < (2 + kHeads) * kChunk * 16; e += kThreads) {
    const int which = e / (kChunk * 16), r = (e / 16) % kChunk, c8 = 8 * (e % 16);
    const bf16* src =
        y + static_cast<size_t>(ch.begin + min(r, ch.n - 1)) * C + channel0(which, ch, s);
    mma::cp_async16(rows_of(sm, which)[r] + c8, src + c8, r < ch.n);
  }
}

// The conv inputs of the chunk's rows -3 .. 63 into rows 0..66 (rows past n zero; rows before the
// sequence's first step token from its conv state, oldest first, or zeros for a fresh sequence),
// and the channels' conv taps. A thread copies one 16-byte column piece of q, k and each v of
// every 16th row (the row's address once for them all).
template <int kHeads>
__device__ void load_conv_inputs(PrepSmem<kHeads>& sm, const Chunk& ch, const GdnQkvSource& in,
                                 const GdnShape& s) {
  constexpr int kMats = 2 + kHeads;
  const int C = conv_dim(s), c8 = 8 * (threadIdx.x % 16);
  constexpr int kTapPieces = tap_bytes<kHeads>() / 16, kPiecesPerTile = kTapPieces / kMats;
  static_assert(kTapPieces <= kThreads);
  if (threadIdx.x < kTapPieces) {  // two channels' taps a piece
    const int which = threadIdx.x / kPiecesPerTile, c2 = 2 * (threadIdx.x % kPiecesPerTile);
    mma::cp_async16(taps_of(sm) + (which * kDim + c2) * kConvK,
                    in.conv_w + static_cast<size_t>(channel0(which, ch, s) + c2) * kConvK, true);
  }
  int cols[kMats];  // this thread's channel piece of q, k and each v
#pragma unroll
  for (int which = 0; which < kMats; ++which) cols[which] = channel0(which, ch, s) + c8;
  constexpr int kRowStep = kThreads / 16, kRowSteps = (kConvRows + kRowStep - 1) / kRowStep;
#pragma unroll
  for (int k = 0; k < kRowSteps; ++k) {
    const int j = static_cast<int>(threadIdx.x) / 16 + k * kRowStep, r = j - kHalo;
    if (j >= kConvRows) break;
    if (ch.t0 + r >= 0) {
      const bf16* row = in.u + static_cast<size_t>(ch.begin + min(r, ch.n - 1)) * C;
#pragma unroll
      for (int which = 0; which < kMats; ++which)
        mma::cp_async16(rows_of(sm, which)[j] + c8, row + cols[which], r < ch.n);
    } else {
      for (int which = 0; which < kMats; ++which) {
        const bf16* st = in.conv_state + (static_cast<size_t>(ch.slot) * C + cols[which]) * kHalo;
        bf16* dst = rows_of(sm, which)[j] + c8;
        for (int i = 0; i < 8; ++i)
          dst[i] = ch.fresh ? __float2bfloat16(0.0f) : st[i * kHalo + kHalo + ch.t0 + r];
      }
    }
  }
}

// Rows 0..63 <- silu(conv) of rows 0..66, in place: a thread per (8 channels, 16 rows); row r's
// output (inputs r .. r + 3) goes to row r, which only its own thread still reads.
template <int kHeads>
__device__ void convolve_in_place(PrepSmem<kHeads>& sm) {
  constexpr int kRows = 16, kVecs = (2 + kHeads) * kDim / 8;
  static_assert(kVecs * (kChunk / kRows) <= kThreads);
  const int tid = threadIdx.x, which = (tid % kVecs) / 16, c8 = 8 * (tid % 16);
  const int r0 = kRows * (tid / kVecs);
  const bool active = tid < kVecs * (kChunk / kRows);
  bf16(*m)[kLd] = rows_of(sm, which);
  uint4 below[kHalo];  // inputs r0 + 16 ..: the next thread's first outputs overwrite them
  if (active)
    for (int i = 0; i < kHalo; ++i)
      below[i] = *reinterpret_cast<const uint4*>(m[r0 + kRows + i] + c8);
  __syncthreads();
  if (active) {
    const ConvTaps taps = load_conv_taps(taps_of(sm) + which * kDim * kConvK, c8);
    F32x8 win[kHalo];
    for (int i = 0; i < kHalo; ++i) win[i] = load_bf16x8(m[r0 + i] + c8);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const F32x8 cur = r + kHalo < kRows ? load_bf16x8(m[r0 + r + kHalo] + c8)
                                          : unpack_bf16x8(below[r + kHalo - kRows]);
      store_bf16x8(m[r0 + r] + c8, conv_silu(taps, win, cur));
      conv_shift(win, cur);
    }
  }
  __syncthreads();
}

// q, k (key head) and each v (value head) rows into shared rows 0..63 (from y, or convolved from
// u; rows past n finite); per value head beta and the cumulative log decay gam (rows past n:
// beta 0, gam flat), warp j taking value head h + j.
template <int kHeads>
__device__ void stage_inputs(PrepSmem<kHeads>& sm, const Chunk& ch, const GdnQkvSource& in,
                             const bf16* a, const bf16* bg, const float* A_log,
                             const float* dt_bias, const GdnShape& s) {
  if (in.y != nullptr)
    load_conv_outputs(sm, ch, in.y, s);
  else
    load_conv_inputs(sm, ch, in, s);
  mma::cp_async_commit();
  const int j = threadIdx.x / 32, h = ch.h + j;
  if (j < kHeads) {  // gates, then an inclusive scan of the log decay (two rows per lane)
    const int lane = threadIdx.x % 32;
    float g[2];
    for (int e = 0; e < 2; ++e) {
      const int i = 2 * lane + e;
      g[e] = 0.0f;
      sm.beta[j][i] = 0.0f;
      if (i < ch.n) {
        const size_t gi = static_cast<size_t>(ch.begin + i) * s.nv + h;
        const float av = __bfloat162float(a[gi]), bv = __bfloat162float(bg[gi]);
        const float alog = A_log[h], bias = dt_bias[h];
        const float beta = gate_beta(bv);
        g[e] = gate_log_decay(av, bias, -__expf(alog));
        sm.beta[j][i] = beta;
      }
    }
    const float run = scan_row_pairs(g[0], g[1]);
    sm.gam[j][2 * lane] = run - g[1];
    sm.gam[j][2 * lane + 1] = run;
    sm.beta_egam[j][2 * lane] = sm.beta[j][2 * lane] * __expf(run - g[1]);
    sm.beta_egam[j][2 * lane + 1] = sm.beta[j][2 * lane + 1] * __expf(run);
  }
  mma::cp_async_wait<0>();
  __syncthreads();
  if (in.y == nullptr) convolve_in_place(sm);
}

// q / |q| / sqrt(dk) and k / |k| in place; q to the workspace (once per key head), k e^(gam_last -
// gam_i) to it, gam to it. Eight threads per row, in two passes of 32 rows; thread p of a row takes
// the 16-byte pieces at columns 8 p and 64 + 8 p, so that the eight threads' pieces of a row fall
// in different shared-memory banks and their stores are one contiguous row.
template <int kHeads>
__device__ void normalise(PrepSmem<kHeads>& sm, const Chunk& ch, const GdnShape& s,
                          const Workspace& ws) {
  constexpr int kPerRow = 8, kPieces = kDim / 8 / kPerRow, kRowsPerPass = kThreads / kPerRow;
  constexpr int kPieceStride = 8 * kPerRow;  // columns between a thread's pieces
  const int c0 = 8 * (threadIdx.x % kPerRow);
  const bool writes_q = ch.h % (s.nv / s.nk) == 0;
#pragma unroll
  for (int r = threadIdx.x / kPerRow; r < kChunk; r += kRowsPerPass) {
    F32x8 q[kPieces], k[kPieces];
    float sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      q[i] = load_bf16x8(sm.qa.q[r] + c0 + kPieceStride * i);
      k[i] = load_bf16x8(sm.k[r] + c0 + kPieceStride * i);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        sq = fmaf(q[i].v[e], q[i].v[e], sq);
        sk = fmaf(k[i].v[e], k[i].v[e], sk);
      }
    }
#pragma unroll
    for (int o = 1; o < kPerRow; o <<= 1) {
      sq += __shfl_xor_sync(0xffffffffu, sq, o);
      sk += __shfl_xor_sync(0xffffffffu, sk, o);
    }
    const float rq = rsqrtf(static_cast<float>(kDim)) * rsqrtf(sq + 1e-6f);
    const float rk = rsqrtf(sk + 1e-6f);
    const bool row = r < ch.n;
    const size_t tok = static_cast<size_t>(ch.begin + r);
    bf16* dq = ws.q + (tok * s.nk + ch.kh) * kDim + c0;
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        q[i].v[e] *= rq;
        k[i].v[e] *= rk;
      }
      store_bf16x8(sm.qa.q[r] + c0 + kPieceStride * i, q[i]);
      store_bf16x8(sm.k[r] + c0 + kPieceStride * i, k[i]);
      if (row && writes_q) store_bf16x8(dq + kPieceStride * i, q[i]);
    }
    if (!row) continue;
#pragma unroll
    for (int j = 0; j < kHeads; ++j) {  // k e^(gam_last - gam_r) of each value head
      const float d = __expf(sm.gam[j][ch.n - 1] - sm.gam[j][r]);
      bf16* dk = ws.kd + (tok * s.nv + ch.h + j) * kDim + c0;
#pragma unroll
      for (int i = 0; i < kPieces; ++i) {
        F32x8 kd;
#pragma unroll
        for (int e = 0; e < 8; ++e) kd.v[e] = k[i].v[e] * d;
        store_bf16x8(dk + kPieceStride * i, kd);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kHeads; ++j)
    if (threadIdx.x < ch.n)
      ws.gam[static_cast<size_t>(ch.h + j) * ch.T + ch.begin + threadIdx.x] =
          sm.gam[j][threadIdx.x];
  __syncthreads();
}

// q_i . k_j and k_i . k_j on bf16 tensor cores, kept in registers for every value head: warp w
// takes rows 16 (w % 4) .. + 15, columns 32 (w / 4) .. + 31 (its tiles above the diagonal are
// zeros: no MMAs).
struct Products {
  float kk[4][4], qk[4][4];
  int m, n0;
  bool zero;  // warp-uniform: the warp's tiles are above the diagonal

  template <int kHeads>
  __device__ explicit Products(PrepSmem<kHeads>& sm) : kk{}, qk{} {
    const int warp = threadIdx.x / 32;
    m = warp % 4;
    n0 = 32 * (warp / 4);
    zero = n0 >= 16 * (m + 1);
    if (!zero) {
      const PaddedRows q{sm.qa.q[0], kLd}, k{sm.k[0], kLd};
#pragma unroll
      for (int ks = 0; ks < kDim / 16; ++ks) {
        uint32_t ka[4], qa[4];
        mma::load_a_at(ka, k, 16 * m, 16 * ks);
        mma::load_a_at(qa, q, 16 * m, 16 * ks);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t kb[4];
          mma::load_b_trans_at(kb, k, n0 + 16 * np, 16 * ks);
          mma::mma(kk[2 * np], ka, kb[0], kb[1]);
          mma::mma(kk[2 * np + 1], ka, kb[2], kb[3]);
          mma::mma(qk[2 * np], qa, kb[0], kb[1]);
          mma::mma(qk[2 * np + 1], qa, kb[2], kb[3]);
        }
      }
    }
    __syncthreads();  // q's rows are dead from here: the region takes P and the inverses
  }
};

// Value head j's L = beta_i (k_i . k_j) e^(gam_i - gam_j) (j < i) into shared memory (f32) and
// P = (q_i . k_j) e^(gam_i - gam_j) (j <= i) staged over a_u (bf16), each decay factor computed
// once for both. L above its diagonal blocks is never read and not written.
template <int kHeads>
__device__ void decay_products(PrepSmem<kHeads>& sm, const Products& pr, int jh) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const float *gam = sm.gam[jh], *beta = sm.beta[jh];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * pr.m + g + 8 * hf, j = pr.n0 + 8 * nt + 2 * c;
      float l[2] = {0.0f, 0.0f}, p[2] = {0.0f, 0.0f};
      if (!pr.zero)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (j + e <= i) {
            const float decay = __expf(gam[i] - gam[j + e]);
            p[e] = pr.qk[nt][2 * hf + e] * decay;
            if (j + e < i) l[e] = beta[i] * pr.kk[nt][2 * hf + e] * decay;
          }
      *reinterpret_cast<__nv_bfloat162*>(&sm.qa.a.a_u[i][j]) = __floats2bfloat162_rn(p[0], p[1]);
      if (!pr.zero) {
        sm.l[i][j] = l[0];
        sm.l[i][j + 1] = l[1];
      }
    }
  __syncthreads();
}

// P from its staging over a_u to the workspace in 16-byte pieces (rows past n not stored), by
// warps 4-7 while warps 0-1 invert L's diagonal blocks (a_u is next written after the inverse).
template <int kHeads>
__device__ void store_p(const PrepSmem<kHeads>& sm, const Chunk& ch, const GdnShape& s,
                        const Workspace& ws) {
  constexpr int kFirst = 128, kPieces = kChunk / 8;
  for (int e = threadIdx.x - kFirst; e < kChunk * kPieces; e += kThreads - kFirst) {
    const int r = e / kPieces, c8 = 8 * (e % kPieces);
    if (r >= ch.n) break;
    const size_t row = static_cast<size_t>(ch.begin + r) * s.nv + ch.h;
    *reinterpret_cast<uint4*>(ws.p + row * kChunk + c8) =
        *reinterpret_cast<const uint4*>(&sm.qa.a.a_u[r][c8]);
  }
}

// Value head jh's T, then T diag(beta) and T diag(beta e^gam) as bf16 (blocks above the diagonal
// zero); P stored beside the first step (ch.h the value head).
template <int kHeads>
__device__ void invert(PrepSmem<kHeads>& sm, int jh, const Chunk& ch, const GdnShape& s,
                       const Workspace& ws) {
  const InverseTiles tiles{sm.l, sm.t, sm.x};
  if (threadIdx.x >= 128)
    store_p(sm, ch, s, ws);
  else
    invert_diagonal(tiles);
  __syncthreads();
  invert_below_diagonal(tiles, [] { __syncthreads(); });
  for (int e = threadIdx.x; e < kChunk * kChunk / 2; e += kThreads) {
    const int i = e / (kChunk / 2), j = 2 * (e % (kChunk / 2));
    const bool above = i / 16 < j / 16;
    const float t0 = above ? 0.0f : sm.t[i][j], t1 = above ? 0.0f : sm.t[i][j + 1];
    *reinterpret_cast<__nv_bfloat162*>(&sm.qa.a.a_u[i][j]) =
        __floats2bfloat162_rn(t0 * sm.beta[jh][j], t1 * sm.beta[jh][j + 1]);
    *reinterpret_cast<__nv_bfloat162*>(&sm.qa.a.a_w[i][j]) =
        __floats2bfloat162_rn(t0 * sm.beta_egam[jh][j], t1 * sm.beta_egam[jh][j + 1]);
  }
  __syncthreads();
}

// Warps 0-3: W = (T diag(beta e^gam)) K; warps 4-7: U = (T diag(beta)) V; 16 rows per warp, in two
// halves of 64 columns; staged over L / T, then stored to the workspace: with kBulk by the bulk
// copy engine, a row a thread of the first kBulkThreads (L / T free again once their bulk groups
// are read), else in 16-byte pieces by every thread.
constexpr int kBulkThreads = 2 * kChunk;
template <int kHeads, bool kBulk>
__device__ void solve(PrepSmem<kHeads>& sm, int jh, const Chunk& ch, const GdnShape& s,
                      const Workspace& ws) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const bool is_u = warp >= 4;
  const int m = warp % 4;
  const bf16(*A)[kLdC] = is_u ? sm.qa.a.a_u : sm.qa.a.a_w;
  const bf16(*X)[kLd] = is_u ? sm.v[jh] : sm.k;
  bf16(*tile)[kLd] = out_tile(sm, is_u);
  for (int half = 0; half < 2; ++half) {
    float acc[8][4] = {};
    mma::tile_16x64<kChunk>(acc, A[16 * m], kLdC, X[0] + 64 * half, kLd);
    for (int hf = 0; hf < 2; ++hf)
      for (int nt = 0; nt < 8; ++nt)
        *reinterpret_cast<__nv_bfloat162*>(&tile[16 * m + g + 8 * hf][64 * half + 8 * nt + 2 * c]) =
            __floats2bfloat162_rn(acc[nt][2 * hf], acc[nt][2 * hf + 1]);
  }
  if constexpr (kBulk) {
    wgmma::fence_shared_for_async();  // the tiles' writes visible to the bulk copies
    __syncthreads();
    if (threadIdx.x < kBulkThreads) {
      const bool u = threadIdx.x >= kChunk;
      const int r = static_cast<int>(threadIdx.x) % kChunk;
      if (r < ch.n) {
        const size_t row = static_cast<size_t>(ch.begin + r) * s.nv + ch.h;
        tma::store_bulk((u ? ws.u : ws.w) + row * kDim, out_tile(sm, u)[r], kDim * sizeof(bf16));
      }
      tma::bulk_commit();
    }
    return;
  }
  __syncthreads();
  constexpr int kPieces = kDim / 8;
  for (int e = threadIdx.x; e < 2 * kChunk * kPieces; e += kThreads) {
    const bool u = e >= kChunk * kPieces;
    const int r = (e / kPieces) % kChunk, c8 = 8 * (e % kPieces);
    if (r >= ch.n) continue;
    const size_t row = static_cast<size_t>(ch.begin + r) * s.nv + ch.h;
    *reinterpret_cast<uint4*>((u ? ws.u : ws.w) + row * kDim + c8) =
        *reinterpret_cast<const uint4*>(&out_tile(sm, u)[r][c8]);
  }
}

template <int kHeads, bool kBulk>
__global__ void __launch_bounds__(kThreads, 2)
    prep_kernel(BatchMeta b, GdnQkvSource in, const bf16* __restrict__ a,
                const bf16* __restrict__ bg, const float* __restrict__ A_log,
                const float* __restrict__ dt_bias, GdnShape s, Workspace ws) {
  extern __shared__ __align__(128) unsigned char prep_raw[];
  PrepSmem<kHeads>& sm = *reinterpret_cast<PrepSmem<kHeads>*>(prep_raw);
  const int seq = blockIdx.x, t0 = blockIdx.y * kChunk, len = b.seq_len[seq];
  if (t0 >= len) return;
  const int h = kHeads * static_cast<int>(blockIdx.z);  // value heads h .. h + kHeads - 1
  const Chunk ch{
      b.seq_begin[seq] + t0, min(kChunk, len - t0), t0, h, h / (s.nv / s.nk), b.num_tokens,
      b.seq_slot[seq],       b.seq_start[seq] == 0};
  stage_inputs(sm, ch, in, a, bg, A_log, dt_bias, s);
  normalise(sm, ch, s, ws);
  const Products pr(sm);
#pragma unroll 1
  for (int j = 0; j < kHeads; ++j) {
    Chunk head = ch;
    head.h = ch.h + j;
    decay_products(sm, pr, j);
    invert(sm, j, head, s, ws);
    solve<kHeads, kBulk>(sm, j, head, s, ws);
    if (j + 1 < kHeads) {  // the stores from L / T done before the next L
      if (kBulk && threadIdx.x < kBulkThreads) tma::bulk_wait_read<0>();
      __syncthreads();
    }
  }
  if (kBulk && threadIdx.x < kBulkThreads)
    tma::bulk_wait<0>();  // shared memory read, W / U written
}

template <int kHeads, bool kBulk>
void launch_prep_form(const BatchMeta& b, const GdnQkvSource& in, const bf16* a, const bf16* bgate,
                      const float* A_log, const float* dt_bias, const GdnShape& s,
                      const Workspace& ws, cudaStream_t stream) {
  constexpr int smem = sizeof(PrepSmem<kHeads>);
  const auto kernel = prep_kernel<kHeads, kBulk>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const int chunks = (b.max_seq_len + kChunk - 1) / kChunk;
  kernel<<<dim3(b.num_seqs, chunks, s.nv / kHeads), kThreads, smem, stream>>>(
      b, in, a, bgate, A_log, dt_bias, s, ws);
}

// W / U by the bulk copy engine where q / k / v come from y. Measured on the H200 (gdn_bench, ms a
// layer, per-thread stores / bulk, two rounds, one lease): the rule 1 x 8192 0.364, 0.362 / 0.355,
// 0.352; 1 x 32768 1.400, 1.389 / 1.366, 1.357; 1 x 2048 0.099, 0.098 / 0.097, 0.097. With the conv
// on the way in (the model's mixer) it gained nothing (1 x 8192 0.457, 0.455 / 0.458, 0.455) and
// lost at 1 x 32768 (1.710, 1.699 / 1.730, 1.720). DS_GDN_PREP_BULK=0 never takes it (A/B).
template <int kHeads>
void launch_prep_heads(const BatchMeta& b, const GdnQkvSource& in, const bf16* a, const bf16* bgate,
                       const float* A_log, const float* dt_bias, const GdnShape& s,
                       const Workspace& ws, cudaStream_t stream) {
  static const bool bulk_on = ab_switch_on("DS_GDN_PREP_BULK");
  if (bulk_on && in.y != nullptr)
    launch_prep_form<kHeads, true>(b, in, a, bgate, A_log, dt_bias, s, ws, stream);
  else
    launch_prep_form<kHeads, false>(b, in, a, bgate, A_log, dt_bias, s, ws, stream);
}

}  // namespace

// Two value heads a block where a key head has an even number of them and the paired grid has a
// block for every SM; else one (twice the blocks for short steps). Measured on the H200 (4B,
// gdn_bench, rule ms a layer, one head / two): 1 x 512 0.032 / 0.036 (128 paired blocks),
// 1 x 1024 0.060 / 0.057 (256), 1 x 2048 0.110 / 0.103, 1 x 8192 0.414 / 0.386, 8 x 1024
// 0.351 / 0.326. DS_GDN_PREP_PAIRS=0 never pairs, =1 always does where it can (A/B, tests).
void launch_prep(const BatchMeta& b, const GdnQkvSource& in, const bf16* a, const bf16* bgate,
                 const float* A_log, const float* dt_bias, const GdnShape& s, const Workspace& ws,
                 int num_sms, cudaStream_t stream) {
  static const int forced = ab_switch_forced("DS_GDN_PREP_PAIRS");
  const int64_t paired_blocks =
      static_cast<int64_t>(b.num_seqs) * ((b.max_seq_len + kChunk - 1) / kChunk) * (s.nv / 2);
  const bool pays = forced == -1 ? paired_blocks >= num_sms : forced == 1;
  if (pays && (s.nv / s.nk) % 2 == 0)
    launch_prep_heads<2>(b, in, a, bgate, A_log, dt_bias, s, ws, stream);
  else
    launch_prep_heads<1>(b, in, a, bgate, A_log, dt_bias, s, ws, stream);
}

}  // namespace deltaserve::cuda::gdn_chunk
