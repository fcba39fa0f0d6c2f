// The chunked gated delta rule in one kernel (sm_90a), for steps whose (sequence, value head)
// pairs fill the GPU: a block per pair walks the sequence's chunks in order with three
// warpgroups, and nothing of a chunk goes through global memory but its q / k / v (the conv
// outputs y), its gates and its output. (The prep kernel + state pass of gdn_chunk_prep.cu /
// gdn_chunk_pass*.cu write and read W, U, kd, q and P through a workspace instead.)
//
// The intra warpgroup (threads 0..127) runs a chunk ahead of the state warpgroups. Its thread 0
// copies each chunk's q, k (the key head's) and v rows by TMA into three stages, two chunks ahead.
// From the raw rows it forms the row norms rk and rq (times dk^-1/2) on the CUDA cores, then K K^T
// and Q K^T on wgmma; from the products' accumulators, with the gates' cumulative log decay gam
// (warp 2, one chunk ahead),
//   L_ij = beta_i rk_i rk_j e^(gam_i - gam_j) (k_i . k_j) (j < i),
//   P_ij = rq_i rk_j e^(gam_i - gam_j) (q_i . k_j) (j <= i),
// then T = (I + L)^-1 (gdn_chunk_inverse.cuh); P and T_b = T diag(beta) as bf16 tiles, and the
// per-token factors below, go to the state warpgroups in two stages.
//
// Each state warpgroup keeps 64 value columns of S^T in registers (gdn_chunk_t_ops.cuh), and with
// V' = T_b (V - diag(rk e^gam) K S) (the prep kernel's U - W S):
//   X^T  = S^T K^T                                       (A = S^T; B = k K-major)
//   Y^T  = V^T - X^T diag(rk e^gam)                      (V^T by ldmatrix.trans, in registers)
//   V'^T = Y^T T_b^T                                     (A = Y^T; B = T_b [i][j] K-major)
//   S^T <- e^gam_last S^T + V'^T diag(rk e^(gam_last - gam)) K   (B = k, MN-major)
//   O^T  = S^T q^T (the state before the update) diag(rq e^gam) + V'^T P^T
// Rows past the sequence's end (the next sequence's tokens, or zeros past the step) get beta = 0
// and a flat decay, so their columns of T_b and V' are zero; their outputs are not stored.
// setmaxnreg moves registers between the warpgroups (kIntraRegs / kStateRegs).
#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/gdn_chunk_fused.h"
#include "backend/cuda/kernels/gdn_chunk_inverse.cuh"
#include "backend/cuda/kernels/gdn_chunk_pass_stage.cuh"
#include "backend/cuda/kernels/gdn_chunk_t_ops.cuh"
#include "backend/cuda/kernels/gdn_fused_split.h"
#include "backend/cuda/kernels/gdn_gates.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 384, kInStages = 3, kIntraStages = 2;
// The register split (the two must add up to at most 384 x 168, or setmaxnreg.inc waits for good).
// H200, 8 x 1024 ms a layer: at 426c572 0.326 at 136 / 184, 0.329 at 120 / 192, 0.327 at 152 /
// 176, 0.455 at 88 / 208 (the intra warpgroup spilled); since the intra warpgroup keeps no raw
// products in shared memory (619e083) 0.200 at 120 / 192 against 0.203 at 136 / 184.
constexpr int kIntraRegs = 120, kStateRegs = 192;  // 128 x 120 + 256 x 192 = 384 x 168
constexpr uint32_t kTileBytes = kChunk * kDim * sizeof(bf16);

// A chunk's q, k and v rows as SW128 tiles (two 64-column blocks each).
struct alignas(wgmma::kAtomBytes) InStage {
  bf16 q[kChunk * kDim], k[kChunk * kDim], v[kChunk * kDim];
};
// What the intra warpgroup forms of a chunk for the state warpgroups.
struct alignas(wgmma::kAtomBytes) IntraStage {
  bf16 p[kChunk * kChunk], tb[kChunk * kChunk];  // P, T diag(beta): SW128 [i][j]
};
// Per token of a chunk, for the state warpgroups: rk e^gam (X's columns), rk e^(gam_last - gam)
// (the update's), rq e^gam (the output's); and e^gam_last.
struct TokenFactors {
  float x[kChunk], u[kChunk], o[kChunk];
  float decay;
};
struct FusedSmem {
  InStage in[kInStages];
  IntraStage intra[kIntraStages];
  TokenFactors f[kIntraStages];
  float rq[kChunk], rk[kChunk];                                 // the intra warpgroup's chunk
  float gam[kIntraStages][kChunk], beta[kIntraStages][kChunk];  // a chunk ahead; gam x log2 e
  float l[kChunk][kLdF], t[kChunk][kLdF], x[4][16][kLdX];       // its products and inverse
  uint64_t full_in[kInStages], empty_in[kInStages], full_intra[kIntraStages],
      empty_intra[kIntraStages];
};
constexpr size_t kSmemBytes = sizeof(FusedSmem) + wgmma::kAtomBytes;
static_assert(kSmemBytes <= 227 * 1024, "one block an SM");

// The intra warpgroup's barrier (named barrier 1).
__device__ void intra_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }

// 2^x (the hardware's approximation, as __expf uses it).
__device__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f;

__device__ void store_pair(bf16* tile, int r, int c, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(tile) + wgmma::sw128_offset(kChunk, r, c)) =
      mma::pack_bf16(lo, hi);
}

// Chunk c's q, k, v rows into its input stage by one thread, once the state warpgroups released
// the stage's previous chunk.
__device__ void load_inputs(FusedSmem& sm, const CUtensorMap* y, const Seq& sq, int c,
                            const GdnShape& s) {
  const int st = c % kInStages, row = sq.base + c * kChunk, key_dim = s.nk * kDim;
  if (c >= kInStages) tma::wait_suspended(&sm.empty_in[st], (c / kInStages + 1) & 1);
  tma::arrive_expect_bytes(&sm.full_in[st], 3 * kTileBytes);
  InStage& in = sm.in[st];
  for (int half = 0; half < 2; ++half) {
    const int at = half * kChunk * 64, col = 64 * half;
    tma::load_2d(in.q + at, y, sq.kh * kDim + col, row, &sm.full_in[st]);
    tma::load_2d(in.k + at, y, key_dim + sq.kh * kDim + col, row, &sm.full_in[st]);
    tma::load_2d(in.v + at, y, 2 * key_dim + sq.h * kDim + col, row, &sm.full_in[st]);
  }
}

// The gate inputs (a, b) of rows 2 lane and 2 lane + 1 of chunk c as loaded, by a warp (rows past
// the sequence read its first row; chunk_gates masks them): converted where used, so that the
// loads stay in flight meanwhile.
struct GateInputs {
  bf16 a[2], b[2];
};
__device__ GateInputs fetch_gates(const bf16* a, const bf16* bg, const Seq& sq, int c, int nv) {
  GateInputs r;
  const int t0 = c * kChunk, lane = threadIdx.x % 32;
  for (int e = 0; e < 2; ++e) {
    const int i = 2 * lane + e;
    const bool in = t0 + i < sq.len;
    const size_t gi = static_cast<size_t>(sq.base + (in ? t0 + i : 0)) * nv + sq.h;
    r.a[e] = a[gi];
    r.b[e] = bg[gi];
  }
  return r;
}

// beta and gam (in log2 units, for ex2) of the chunk's rows (rows past n: beta 0, gam flat), by a
// warp.
__device__ void chunk_gates(FusedSmem& sm, int s2, const GateInputs& in, int n, float A_log,
                            float dt_bias) {
  const int lane = threadIdx.x % 32;
  float g[2];
  for (int e = 0; e < 2; ++e) {
    const int i = 2 * lane + e;
    const float beta = gate_beta(__bfloat162float(in.b[e]));
    const float ge = gate_log_decay(__bfloat162float(in.a[e]), dt_bias, -__expf(A_log));
    sm.beta[s2][i] = i < n ? beta : 0.0f;
    g[e] = i < n ? ge : 0.0f;
  }
  const float run = scan_row_pairs(g[0], g[1]);
  sm.gam[s2][2 * lane] = (run - g[1]) * kLog2e;
  sm.gam[s2][2 * lane + 1] = run * kLog2e;
}

// The state warpgroups' per-token factors of the chunk (n rows), by a warp (two tokens a lane).
__device__ void token_factors(FusedSmem& sm, int s2, int n) {
  TokenFactors& f = sm.f[s2];
  const float* gam = sm.gam[s2];
  const float last = gam[n - 1];
  for (int i = threadIdx.x % 32; i < kChunk; i += 32) {
    const float e = exp2_approx(gam[i]);
    f.x[i] = sm.rk[i] * e;
    f.u[i] = sm.rk[i] * exp2_approx(last - gam[i]);
    f.o[i] = sm.rq[i] * e;
  }
  if (threadIdx.x % 32 == 0) f.decay = exp2_approx(last);
}

// `scale` / sqrt(|row|^2 + 1e-6) of each of a staged SW128 64 x 128 tile's rows into out[64], by
// the intra warpgroup: two threads a row, one 64-column block each (a row's 16-byte pieces only
// permuted by the swizzle, read from a rotated start so that a warp's rows hit other banks).
__device__ void row_norms(const bf16* tile, float* out, float scale) {
  const int r = threadIdx.x / 2, half = threadIdx.x % 2;
  const char* row = reinterpret_cast<const char*>(tile) + (half * kChunk + r) * wgmma::kRowBytes;
  float sum = 0.0f;
#pragma unroll
  for (int x = 0; x < 8; ++x) {
    const uint4 piece = *reinterpret_cast<const uint4*>(row + 16 * ((x + r) % 8));
    const uint32_t words[4] = {piece.x, piece.y, piece.z, piece.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]));
      sum = fmaf(f.x, f.x, fmaf(f.y, f.y, sum));
    }
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  if (half == 0) out[r] = scale * rsqrtf(sum + 1e-6f);
}

// A B^T of two staged K-major 64 x 128 tiles (raw rows) on wgmma, as one group.
__device__ void issue_raw_product(const bf16* a_tile, const bf16* b_tile, float (&acc)[32]) {
  const uint64_t ad = wgmma::desc(mma::smem_u32(a_tile), 16, wgmma::kAtomBytes),
                 bd = wgmma::desc(mma::smem_u32(b_tile), 16, wgmma::kAtomBytes);
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks) {
    const uint32_t at = ((ks / 4) * kChunk * wgmma::kRowBytes + (ks % 4) * 32) >> 4;
    wgmma::mma_64x64_ss(acc, ad + at, bd + at, ks > 0);
  }
  wgmma::commit();
}

// The 16 x 16 blocks on and below the diagonal of a 64 x 64 lower triangle, row-block major: a
// block each of 10 rounds, thread t its row 16 bi + t / 8, columns 16 bj + 2 (t % 8) (+ 1).
constexpr int kLowerBlocks = 10;
__device__ constexpr int block_row(int b) { return b < 1 ? 0 : b < 3 ? 1 : b < 6 ? 2 : 3; }
__device__ constexpr int block_col(int b) { return b - block_row(b) * (block_row(b) + 1) / 2; }

// P's and T_b's blocks above the diagonal, zero in both stages for good (never written again).
__device__ void zero_upper_blocks(FusedSmem& sm) {
  for (int e = threadIdx.x; e < kIntraStages * 2 * 6 * 128; e += 128) {
    const int pair = e % 128, blk = (e / 128) % 6, which = e / (128 * 6);
    const int bi = blk < 3 ? 0 : blk < 5 ? 1 : 2, bj = blk < 3 ? blk + 1 : blk < 5 ? blk - 1 : 3;
    IntraStage& st = sm.intra[which / 2];
    store_pair(which % 2 ? st.tb : st.p, 16 * bi + pair / 8, 16 * bj + 2 * (pair % 8), 0.0f, 0.0f);
  }
}

// From K K^T and Q K^T of the raw rows (wgmma accumulators), on and below the diagonal blocks
// (warp w holds rows 16 w .. 16 w + 15, so blocks 0 .. w of its block row):
// L_ij = beta_i rk_i rk_j e^(gam_i - gam_j) (k_i . k_j) (j < i: the entries the inverse reads)
// into l, and P_ij = rq_i rk_j e^(gam_i - gam_j) (q_i . k_j) (j <= i) as bf16 into the intra
// stage; each decay factor once for both.
__device__ void decay_products(FusedSmem& sm, int s2, const float (&kk)[32],
                               const float (&qk)[32]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = 16 * warp + lane / 4, c2 = 2 * (lane % 4);
  const float* gam = sm.gam[s2];
  bf16* p = sm.intra[s2].p;
  float gi[2], li[2], pi[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = r + 8 * hf;
    gi[hf] = gam[i];
    li[hf] = sm.beta[s2][i] * sm.rk[i];
    pi[hf] = sm.rq[i];
  }
#pragma unroll
  for (int blk = 0; blk < 8; ++blk) {
    if (blk > 2 * warp + 1) break;  // above the diagonal block
    const int j = 8 * blk + c2;
    const float rk0 = sm.rk[j], rk1 = sm.rk[j + 1], g0 = gam[j], g1 = gam[j + 1];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = r + 8 * hf, e = 4 * blk + 2 * hf;
      const float d0 = j <= i ? rk0 * exp2_approx(gi[hf] - g0) : 0.0f;
      const float d1 = j + 1 <= i ? rk1 * exp2_approx(gi[hf] - g1) : 0.0f;
      const float l0 = j < i ? li[hf] * kk[e] * d0 : 0.0f;
      const float l1 = j + 1 < i ? li[hf] * kk[e + 1] * d1 : 0.0f;
      *reinterpret_cast<float2*>(&sm.l[i][j]) = make_float2(l0, l1);
      store_pair(p, i, j, pi[hf] * qk[e] * d0, pi[hf] * qk[e + 1] * d1);
    }
  }
}

// The row norms rk = |k_r|^-1 and rq = |q_r|^-1 dk^-1/2 on the CUDA cores, then K K^T and Q K^T of
// the raw rows on wgmma, then L and P (decay_products). (The norms issued after the products, under
// them, measured slower: 8 x 1024 0.196 against 0.1915 ms a layer, H200 same lease; rk from the
// diagonal of K K^T 0.2005.)
__device__ void products_and_decay(FusedSmem& sm, const InStage& in, int s2) {
  float kk[32], qk[32];
  row_norms(in.k, sm.rk, 1.0f);
  row_norms(in.q, sm.rq, rsqrtf(static_cast<float>(kDim)));
  wgmma::fence();
  issue_raw_product(in.k, in.k, kk);
  issue_raw_product(in.q, in.k, qk);
  intra_sync();  // the norms
  wgmma::wait<0>();
  decay_products(sm, s2, kk, qk);
}

// T diag(beta) as bf16 into the intra stage, on and below the diagonal blocks (T is zero above the
// diagonal within them).
__device__ void store_t_beta(FusedSmem& sm, int s2) {
  const int r = threadIdx.x / 8, c2 = 2 * (threadIdx.x % 8);
#pragma unroll
  for (int b = 0; b < kLowerBlocks; ++b) {
    const int i = 16 * block_row(b) + r, j = 16 * block_col(b) + c2;
    const float2 t = *reinterpret_cast<const float2*>(&sm.t[i][j]);
    store_pair(sm.intra[s2].tb, i, j, t.x * sm.beta[s2][j], t.y * sm.beta[s2][j + 1]);
  }
}

// The intra warpgroup: every chunk of the sequence, one ahead of the state warpgroups.
__device__ void intra_role(FusedSmem& sm, const CUtensorMap* y, const Seq& sq, int chunks,
                           const bf16* a, const bf16* bg, float A_log, float dt_bias,
                           const GdnShape& s) {
  // Warps 2 and 3 idle while warps 0 and 1 invert L's diagonal blocks: warp 2 then forms the next
  // chunk's gates, warp 3 this chunk's per-token factors.
  const int warp = threadIdx.x / 32;
  const bool loader = threadIdx.x == 0, gate_warp = warp == 2, factor_warp = warp == 3;
  zero_upper_blocks(sm);
  if (loader)
    for (int c = 0; c < min(chunks, kInStages - 1); ++c) load_inputs(sm, y, sq, c, s);
  if (gate_warp)
    chunk_gates(sm, 0, fetch_gates(a, bg, sq, 0, s.nv), min(kChunk, sq.len), A_log, dt_bias);
  GateInputs gates{};
  if (gate_warp && chunks > 1) gates = fetch_gates(a, bg, sq, 1, s.nv);
  const InverseTiles tiles{sm.l, sm.t, sm.x};
  for (int c = 0; c < chunks; ++c) {
    const int s2 = c % kIntraStages, s3 = c % kInStages, n = min(kChunk, sq.len - c * kChunk);
    if (c >= kIntraStages) tma::wait_suspended(&sm.empty_intra[s2], (c / kIntraStages + 1) & 1);
    tma::wait(&sm.full_in[s3], (c / kInStages) & 1);
    intra_sync();  // the previous chunk's reads of l and t done; this one's gam and beta written
    products_and_decay(sm, sm.in[s3], s2);
    intra_sync();  // L
    invert_diagonal(tiles);
    if (gate_warp && c + 1 < chunks) {  // the next chunk's gam and beta (their slots' last readers,
                                        // chunk c - 1's, are done)
      chunk_gates(sm, (c + 1) % kIntraStages, gates, min(kChunk, sq.len - (c + 1) * kChunk), A_log,
                  dt_bias);
      if (c + 2 < chunks) gates = fetch_gates(a, bg, sq, c + 2, s.nv);
    }
    if (factor_warp) token_factors(sm, s2, n);
    intra_sync();
    invert_below_diagonal(tiles, [] { intra_sync(); });
    store_t_beta(sm, s2);
    wgmma::fence_shared_for_async();  // P and T_b are read by the state warpgroups' wgmma
    tma::arrive(&sm.full_intra[s2]);
    if (loader && c + kInStages - 1 < chunks) load_inputs(sm, y, sq, c + kInStages - 1, s);
  }
}

// One chunk of a state warpgroup's columns v0 .. v0 + 63; its outputs from row `first` on. The
// chunk-to-chunk chain (X, V', the update) is issued first, O^T = S^T q^T once the update is done
// (from the state's fragments packed again before the decay). With both in flight at once ptxas
// serialized the kernel's wgmma for want of registers (C7512); one after the other measured 0.1935
// against 0.1955 ms a layer at 8 x 1024 (H200, same lease).
__device__ void state_step(float (&hs)[64], const InStage& in, const IntraStage& it,
                           const TokenFactors& f, int n, int v0, bf16* first, int nv) {
  const int c2 = 2 * (threadIdx.x % 4);
  uint32_t ay[4][4];  // Y^T = V^T - X^T diag(rk e^gam) as A fragments over the chunk's tokens
  {
    float x[32];
    uint32_t as[8][4];
    state_fragments(hs, as);
    wgmma::fence();
    issue_over_dk(x, as, mma::smem_u32(in.k));
    wgmma::commit();
    wgmma::wait<0>();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      uint32_t vf[4];  // V^T in the accumulator layout
      mma::load_a_trans_at(vf, PassTile{in.v}, 16 * ks, v0 + 16 * warp4());
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int blk = 2 * ks + i / 2, e = 2 * (i % 2), tok = 8 * blk + c2;
        const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&vf[i]));
        const float lo = tok < n ? v.x - x[4 * blk + e] * f.x[tok] : 0.0f;
        const float hi = tok + 1 < n ? v.y - x[4 * blk + e + 1] * f.x[tok + 1] : 0.0f;
        ay[ks][i] = mma::pack_bf16(lo, hi);
      }
    }
  }
  uint32_t av[4][4], au[4][4];  // V'^T for P, and scaled for the update
  {
    float vp[32];
    wgmma::fence();
    const uint64_t tbd = wgmma::desc(mma::smem_u32(it.tb), 16, wgmma::kAtomBytes);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma::mma_64x64_rs<false>(vp, ay[ks], tbd + ((ks * 32) >> 4), ks > 0);
    wgmma::commit();
    wgmma::wait<0>();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int blk = 2 * ks + i / 2, e = 2 * (i % 2), tok = 8 * blk + c2;
        const float lo = vp[4 * blk + e], hi = vp[4 * blk + e + 1];
        av[ks][i] = mma::pack_bf16(lo, hi);
        au[ks][i] = mma::pack_bf16(lo * f.u[tok], hi * f.u[tok + 1]);
      }
  }
  float o[32];
  {
    uint32_t as[8][4];
    state_fragments(hs, as);
    issue_state_update_t(hs, au, mma::smem_u32(in.k), f.decay);
    wgmma::wait<0>();  // the update (its accumulators are the state)
    wgmma::fence();
    issue_over_dk(o, as, mma::smem_u32(in.q));
    wgmma::commit();
    wgmma::wait<0>();
  }
  finish_output_t(
      o, av, mma::smem_u32(it.p), [&](int tok) { return f.o[tok]; }, first, nv, n, v0);
}

// A state warpgroup: its columns of the head's state through every chunk, then to the state slot
// (and a snapshot slot after the chunk ending at snap_at).
template <class StateT>
__device__ void state_role(FusedSmem& sm, const BatchMeta& b, int seq, const Seq& sq, int chunks,
                           StateT* state, const GdnShape& s, bf16* out) {
  const int v0 = 64 * (static_cast<int>(threadIdx.x) / 128 - 1);
  const size_t head = static_cast<size_t>(kDim) * kDim;
  StateT* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + sq.h) * head;
  float hs[64];
#pragma unroll
  for (int e = 0; e < 64; ++e) hs[e] = 0.0f;
  if (b.seq_start[seq] != 0) io_t<false>(S, v0, hs);
  const int snap_at = b.seq_snap_at[seq];
  for (int c = 0; c < chunks; ++c) {
    const int s2 = c % kIntraStages, s3 = c % kInStages, t0 = c * kChunk;
    const int n = min(kChunk, sq.len - t0);
    tma::wait_suspended(&sm.full_in[s3], (c / kInStages) & 1);
    tma::wait_suspended(&sm.full_intra[s2], (c / kIntraStages) & 1);
    state_step(hs, sm.in[s3], sm.intra[s2], sm.f[s2], n, v0,
               out + (static_cast<size_t>(sq.base + t0) * s.nv + sq.h) * kDim, s.nv);
    tma::arrive(&sm.empty_in[s3]);
    tma::arrive(&sm.empty_intra[s2]);
    if (t0 + n == snap_at)  // the in-step snapshot: the state after this chunk
      io_t<true>(state + (static_cast<size_t>(b.seq_snap_slot[seq]) * s.nv + sq.h) * head, v0, hs);
  }
  io_t<true>(S, v0, hs);
}

template <class StateT>
__global__ void __launch_bounds__(kThreads, 1)
    fused_kernel(BatchMeta b, const __grid_constant__ CUtensorMap y, const bf16* __restrict__ a,
                 const bf16* __restrict__ bg, const float* __restrict__ A_log,
                 const float* __restrict__ dt_bias, StateT* __restrict__ state, GdnShape s,
                 bf16* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char fused_raw[];
  FusedSmem& sm = *wgmma::atom_aligned<FusedSmem>(fused_raw);
  const int seq = blockIdx.x, h = blockIdx.y;
  const Seq sq{b.seq_begin[seq], b.seq_len[seq], h, h / (s.nv / s.nk), b.num_tokens};
  const int chunks = (sq.len + kChunk - 1) / kChunk;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kInStages; ++i) {
      tma::barrier_init(&sm.full_in[i], 1);
      tma::barrier_init(&sm.empty_in[i], 256);
    }
    for (int i = 0; i < kIntraStages; ++i) {
      tma::barrier_init(&sm.full_intra[i], 128);
      tma::barrier_init(&sm.empty_intra[i], 256);
    }
    tma::barrier_init_fence();
  }
  __syncthreads();  // the barriers initialised
  if (threadIdx.x < 128) {
    wgmma::regs_dec<kIntraRegs>();
    intra_role(sm, &y, sq, chunks, a, bg, A_log[h], dt_bias[h], s);
  } else {
    wgmma::regs_inc<kStateRegs>();
    state_role(sm, b, seq, sq, chunks, state, s, out);
  }
}

template <class StateT>
void launch_typed(const BatchMeta& b, const bf16* y, const bf16* a, const bf16* bgate,
                  const float* A_log, const float* dt_bias, StateT* state, const GdnShape& s,
                  bf16* out, cudaStream_t stream) {
  const CUtensorMap map =
      encode_tma_2d_bf16(y, b.num_tokens, static_cast<int64_t>(2 * s.nk + s.nv) * kDim, kChunk);
  cudaFuncSetAttribute(fused_kernel<StateT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(kSmemBytes));
  fused_kernel<StateT><<<dim3(b.num_seqs, s.nv), kThreads, kSmemBytes, stream>>>(
      b, map, a, bgate, A_log, dt_bias, state, s, out);
}

}  // namespace

namespace {

// Whether the step takes the fused kernel with its (sequence, value head) blocks covering at least
// `eighths` / 8 of the SMs; DS_GDN_FUSED=1 takes it wherever it applies, =0 never (A/B, tests).
bool fused_covers(const BatchMeta& b, const GdnShape& s, int num_sms, int eighths) {
  static const int forced = ab_switch_forced("DS_GDN_FUSED");
  if (forced != -1) return forced == 1;
  return fused_blocks_cover(b.num_seqs, s.nv, num_sms, eighths);
}

}  // namespace

bool fused_pays(const BatchMeta& b, const GdnShape& s, int num_sms) {
  // Its blocks walk their chunks one after another, so it pays only with a block for most SMs.
  // H200 at ca3c264, gdn_bench rule ms a layer, fused / prep + pass: 8 x 1024 (256 blocks) 0.219
  // / 0.306, 4 x 2048 (128) 0.214 / (0.301), 16 x 512 (512) 0.232 / 0.309, 32 x 256 (1024) 0.256 /
  // 0.318, 3 x 2730 (96) 0.287 / 0.306, 2 x 4096 (64) 0.418 / 0.330.
  return fused_covers(b, s, num_sms, kFusedEighthsFromY);
}

bool fused_pays_after_conv(const BatchMeta& b, const GdnShape& s, int num_sms) {
  // The conv kernel's pass over u and y costs what the fused kernel gains over the prep with the
  // conv inside until the blocks nearly fill the GPU. H200 at 2483b60 + this routing, gdn_bench
  // --mixer ms a layer, conv kernel + fused / conv in the prep: 8 x 1024 0.371 / 0.4005, 4 x 2048
  // (128 blocks) 0.367 / 0.3945, 16 x 512 0.3825 / 0.405, 32 x 256 0.4075 / 0.417, 3 x 2730 (96)
  // 0.4305 / 0.400.
  return fused_covers(b, s, num_sms, kFusedEighthsAfterConv);
}

void launch_fused(const BatchMeta& b, const GdnQkvSource& in, const bf16* a, const bf16* bgate,
                  const float* A_log, const float* dt_bias, GdnState state, const GdnShape& s,
                  bf16* out, cudaStream_t stream) {
  if (state.bf16)
    launch_typed(b, in.y, a, bgate, A_log, dt_bias, static_cast<bf16*>(state.data), s, out, stream);
  else
    launch_typed(b, in.y, a, bgate, A_log, dt_bias, static_cast<float*>(state.data), s, out,
                 stream);
}

}  // namespace deltaserve::cuda::gdn_chunk
