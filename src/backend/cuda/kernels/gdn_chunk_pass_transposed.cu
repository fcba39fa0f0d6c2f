// The GDN state pass with the state kept transposed in registers (sm_90a): a warpgroup owns 64
// value columns of a head as S^T (an m64 x n128 f32 wgmma accumulator: rows = its value columns,
// columns = dk), so that every chunk-to-chunk operand is an accumulator turned into bf16 A
// fragments in registers (as flash attention keeps P), never written to shared memory:
//   V'^T = U^T - S^T W^T       (A = S^T; B = W, K-major: [token][dk] as staged)
//   O^T  = S^T q^T             (B = q, K-major), then O^T *= e^gam per token, O^T += V'^T P^T
//                              (A = V'^T; B = P [i][j], K-major)
//   S^T <- e^gam_last S^T + V'^T kd   (A = V'^T; B = kd [token][dk], MN-major)
// U^T comes from the staged U by ldmatrix.trans straight into the accumulator layout. Each
// warpgroup runs its own chain: no barrier between them inside a chunk, only the stage's. Block
// (sequence, value head, half of the head) of one warpgroup, or (sequence, value head) of two;
// three stages of chunk operands (gdn_chunk_pass_stage.cuh), the loads two chunks ahead.
#include "backend/cuda/kernels/gdn_chunk.cuh"
#include "backend/cuda/kernels/gdn_chunk_pass_stage.cuh"
#include "backend/cuda/kernels/gdn_chunk_pass_transposed.h"
#include "backend/cuda/kernels/gdn_chunk_t_ops.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kCols = 64, kStages = 3;

template <int kGroups>
struct TSmem {
  static constexpr int kUCols = kGroups == 1 ? 64 : kDim;
  Stage<kUCols> stage[kStages];
  uint64_t full[kStages];
};
template <int kGroups>
constexpr size_t kTSmemBytes = sizeof(TSmem<kGroups>) + wgmma::kAtomBytes;

// One chunk of the warpgroup's columns v0 .. v0 + 63 (ucol0: the first in the stage's U tile).
template <class StageT>
__device__ void step_t(float (&hs)[64], const StageT& st, const Seq& q, int t0, int n,
                       const GdnShape& s, int v0, int ucol0, bf16* out) {
  const int c2 = 2 * (threadIdx.x % 4);
  uint32_t as[8][4];
  state_fragments(hs, as);
  float x[32], o[32];
  wgmma::fence();
  issue_over_dk(x, as, mma::smem_u32(st.w));
  wgmma::commit();
  issue_over_dk(o, as, mma::smem_u32(st.q));
  wgmma::commit();
  uint32_t uf[4][4];  // U^T in the accumulator layout, while the MMAs run
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    mma::load_a_trans_at(uf[ks], PassTile{st.u}, 16 * ks, ucol0 + 16 * warp4());
  const float decay = __expf(st.gam[n - 1]);
  wgmma::wait<1>();  // X = S^T W^T
  uint32_t av[4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int blk = 2 * ks + i / 2, e = 2 * (i % 2), tok = 8 * blk + c2;
      const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&uf[ks][i]));
      const float lo = tok < n ? u.x - x[4 * blk + e] : 0.0f;
      const float hi = tok + 1 < n ? u.y - x[4 * blk + e + 1] : 0.0f;
      av[ks][i] = mma::pack_bf16(lo, hi);
    }
  issue_state_update_t(hs, av, mma::smem_u32(st.kd), decay);
  wgmma::wait<1>();  // O^T = S^T q^T (the update may still run)
  finish_output_t(
      o, av, mma::smem_u32(st.p), [&](int tok) { return __expf(st.gam[tok]); },
      out + (static_cast<size_t>(q.base + t0) * s.nv + q.h) * kDim, s.nv, n, v0);
}

template <class StateT, int kGroups>
__global__ void __launch_bounds__(128 * kGroups, 1)
    pass_t_kernel(BatchMeta b, const __grid_constant__ PassMaps maps, Workspace ws,
                  StateT* __restrict__ state, GdnShape s, bf16* __restrict__ out) {
  using SmemT = TSmem<kGroups>;
  extern __shared__ __align__(128) unsigned char pass_t_raw[];
  SmemT& sm = *wgmma::atom_aligned<SmemT>(pass_t_raw);
  const int seq = blockIdx.x, h = blockIdx.y, group = static_cast<int>(threadIdx.x) / 128;
  const int v0 = kCols * (kGroups * static_cast<int>(blockIdx.z) + group);
  const int u_half = v0 / 64, ucol0 = v0 % SmemT::kUCols;
  const Seq q{b.seq_begin[seq], b.seq_len[seq], h, h / (s.nv / s.nk), b.num_tokens};
  const size_t head = static_cast<size_t>(kDim) * kDim;
  StateT* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * head;
  float hs[64];
#pragma unroll
  for (int e = 0; e < 64; ++e) hs[e] = 0.0f;
  if (b.seq_start[seq] != 0) io_t<false>(S, v0, hs);
  const int snap_at = b.seq_snap_at[seq];
  walk_chunks(
      sm.stage, sm.full, maps, q, ws, u_half, [] {},
      [&](const auto& stage, int t0, int n) {
        step_t(hs, stage, q, t0, n, s, v0, ucol0, out);
        if (t0 + n == snap_at)  // the in-step snapshot: the state after this chunk
          io_t<true>(state + (static_cast<size_t>(b.seq_snap_slot[seq]) * s.nv + h) * head, v0, hs);
      });
  io_t<true>(S, v0, hs);
}

template <class StateT, int kGroups>
void launch_t(const BatchMeta& b, const PassMaps& maps, const Workspace& ws, StateT* state,
              const GdnShape& s, bf16* out, cudaStream_t stream) {
  constexpr int smem = kTSmemBytes<kGroups>, parts = kDim / (kCols * kGroups);
  static_assert(smem <= 227 * 1024, "three stages fit one SM's shared memory");
  const auto kernel = pass_t_kernel<StateT, kGroups>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kernel<<<dim3(b.num_seqs, s.nv, parts), 128 * kGroups, smem, stream>>>(b, maps, ws, state, s,
                                                                         out);
}

template <class StateT>
void launch_typed_t(const BatchMeta& b, const Workspace& ws, StateT* state, const GdnShape& s,
                    bool halves, bf16* out, cudaStream_t stream) {
  const PassMaps maps = pass_maps(b, ws, s);
  if (halves)
    launch_t<StateT, 1>(b, maps, ws, state, s, out, stream);
  else
    launch_t<StateT, 2>(b, maps, ws, state, s, out, stream);
}

}  // namespace

void launch_state_pass_transposed(const BatchMeta& b, const Workspace& ws, GdnState state,
                                  const GdnShape& s, bool halves, __nv_bfloat16* out,
                                  cudaStream_t stream) {
  if (state.bf16)
    launch_typed_t(b, ws, static_cast<bf16*>(state.data), s, halves, out, stream);
  else
    launch_typed_t(b, ws, static_cast<float*>(state.data), s, halves, out, stream);
}

}  // namespace deltaserve::cuda::gdn_chunk
