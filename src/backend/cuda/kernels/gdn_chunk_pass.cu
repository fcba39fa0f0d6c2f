// Kernel 2 of the chunked delta rule: the state pass on Hopper warpgroup MMAs (sm_90a), forming
// every chunk's output as it goes. By default only a single sequence's quarter-head blocks run
// here; whole and half heads take gdn_chunk_pass_transposed.cu (launch_state_pass below picks;
// DS_GDN_PASS_T=0 sends every form here). A warpgroup owns kCols columns of a value head's state
// (two m64 x kCols f32 accumulators, rows 0..63 and 64..127), of V' and of the output: block
// (sequence, value head) of two warpgroups of 64 columns sharing the staged chunk operands (W, kd,
// q, P, U: one copy a head, read once from L2) when the sequences fill the GPU; for few sequences,
// a block of one warpgroup a half (64 columns) or a quarter (32) of a head, each staging the head's
// operands itself, so that a single long sequence runs 128 blocks of shorter chunk steps at the
// 4B shape (measured at 1 x 8192: 0.418 ms a layer against 0.495 for the earlier state-only
// slice pass with an output kernel after it). The next chunks' operands stream into shared memory
// while the current one computes (one chunk ahead; two in a split head's block, whose stages hold
// only its half of U), copied by the bulk tensor copy engine (one thread issues them)
// into 128-byte-swizzled tiles; rows past a sequence's end are the next sequence's (or zeros past
// the step): V' is zeroed there, P is zero above its diagonal, and those output rows are not
// stored. Per chunk:
//   V' = U - W S and O = q S              (A = W, q by ldmatrix; B = S^T in shared memory)
//   O = e^gam O + P V'                    (A = P; B = V'^T in shared memory), to the output
//   S <- e^gam_last S + kd^T V'           (A = kd^T by ldmatrix.trans; issued before P V', so
//                                         that the chunk-to-chunk chain does not wait through it)
// S^T and V'^T go to shared memory through stmatrix (transposed) in the 128-byte-swizzled layout
// the MMAs read (wgmma.cuh).
#include <cstdlib>

#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/gdn_chunk_pass_stage.cuh"
#include "backend/cuda/kernels/gdn_chunk_pass_transposed.h"
#include "backend/cuda/kernels/gdn_chunk_wg_state.cuh"
#include "backend/cuda/kernels/gdn_pass_split.h"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/tma_map.h"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
// A warpgroup owns kCols state columns (64, or 32 where a head is split four ways): an m64 x kCols
// accumulator of each.
template <int kCols>
using Acc = typename WarpgroupState<kCols>::Acc;

// kStages stages: chunk c in stage c % kStages, the next kStages - 1 loading meanwhile.
template <int kCols, int kGroups, int kStages>
struct Smem {
  static constexpr int kUCols = kGroups == 1 ? 64 : kDim;
  bf16 st[kGroups][2 * kCols * 64];  // per warpgroup S^T [column][dk]: two SW128 blocks of 64 dk
  bf16 vt[kGroups][kCols * 64];      // per warpgroup V'^T [column][token]: one SW128 block
  Stage<kUCols> stage[kStages];
  uint64_t full[kStages];  // a stage's tiles landed
};
template <int kCols, int kGroups, int kStages>
constexpr size_t kSmemBytes = sizeof(Smem<kCols, kGroups, kStages>) + wgmma::kAtomBytes;

using Tile = PassTile;

__device__ int warp_in_group() { return threadIdx.x / 32 % 4; }

// V' = U - W S (in v; rows past n zero: their kd must add nothing to S) as bf16 into V'^T.
template <int kCols, int kUCols>
__device__ void form_v(Acc<kCols>& v, const Stage<kUCols>& st, uint32_t vt, int n, int col0) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int c0 = col0 % kUCols + 2 * c;  // in the stage's U columns
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * warp_in_group() + g + 8 * hf;
#pragma unroll
    for (int nt = 0; nt < kCols / 8; ++nt) {
      const float2 u = __bfloat1622float2(
          *reinterpret_cast<const __nv_bfloat162*>(Tile{st.u}.at(i, c0 + 8 * nt)));
      v[4 * nt + 2 * hf] = i < n ? u.x - v[4 * nt + 2 * hf] : 0.0f;
      v[4 * nt + 2 * hf + 1] = i < n ? u.y - v[4 * nt + 2 * hf + 1] : 0.0f;
    }
  }
  WarpgroupState<kCols>::store_transposed(vt, v);
  wgmma::fence_shared_for_async();
}

// O *= e^gam (per row): the decay of q S.
template <int kCols, class StageT>
__device__ void scale_rows(Acc<kCols>& o, const StageT& st) {
  const int lane = threadIdx.x % 32, i = 16 * warp_in_group() + lane / 4;
  const float e0 = __expf(st.gam[i]), e1 = __expf(st.gam[i + 8]);
#pragma unroll
  for (int nt = 0; nt < kCols / 8; ++nt) {
    o[4 * nt] *= e0;
    o[4 * nt + 1] *= e0;
    o[4 * nt + 2] *= e1;
    o[4 * nt + 3] *= e1;
  }
}

// The chunk's output rows below n.
template <int kCols>
__device__ void store_output(const Acc<kCols>& o, const Seq& q, int t0, int n, const GdnShape& s,
                             int col0, bf16* out) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * warp_in_group() + g + 8 * hf;
    if (i >= n) continue;
    bf16* row = out + (static_cast<size_t>(q.base + t0 + i) * s.nv + q.h) * kDim + col0 + 2 * c;
#pragma unroll
    for (int nt = 0; nt < kCols / 8; ++nt)
      *reinterpret_cast<__nv_bfloat162*>(row + 8 * nt) =
          __floats2bfloat162_rn(o[4 * nt + 2 * hf], o[4 * nt + 2 * hf + 1]);
  }
}

// One chunk of the warpgroup's columns col0 .. col0 + kCols - 1 (its local index in the block
// `group`); S^T published for the next on return.
template <int kCols, class StageT>
__device__ void step(Acc<kCols> (&hs)[2], const StageT& st, uint32_t st_tile, uint32_t vt,
                     const Seq& q, int t0, int n, const GdnShape& s, int group, int col0,
                     bf16* out) {
  using WgState = WarpgroupState<kCols>;
  Acc<kCols> v, o;
  WgState::issue<kDim / 16>(v, Tile{st.w}, st_tile, false);
  wgmma::commit();
  WgState::issue<kDim / 16>(o, Tile{st.q}, st_tile, false);
  wgmma::commit();
  wgmma::wait<1>();  // W S
  form_v<kCols>(v, st, vt, n, col0);
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + group) : "memory");  // V'^T complete
  wgmma::wait<0>();                                                 // q S
  scale_rows<kCols>(o, st);
  const float decay = __expf(st.gam[n - 1]);
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int e = 0; e < kCols / 2; ++e) hs[half][e] *= decay;
  WgState::issue_update(hs, Tile{st.kd}, vt);
  wgmma::commit();
  WgState::issue<kChunk / 16>(o, Tile{st.p}, vt, true);
  wgmma::commit();
  wgmma::wait<1>();  // the update: S^T published before P V' and the output's stores
  WgState::publish(st_tile, hs);
  wgmma::wait<0>();  // P V'
  store_output<kCols>(o, q, t0, n, s, col0, out);
}

// Block (sequence, value head, column part), kGroups warpgroups of kCols columns each.
template <class StateT, int kCols, int kGroups, int kStages>
__global__ void __launch_bounds__(128 * kGroups, 1)
    pass_kernel(BatchMeta b, const __grid_constant__ PassMaps maps, Workspace ws,
                StateT* __restrict__ state, GdnShape s, bf16* __restrict__ out) {
  using WgState = WarpgroupState<kCols>;
  using SmemT = Smem<kCols, kGroups, kStages>;
  extern __shared__ __align__(128) unsigned char pass_raw[];
  SmemT& sm = *wgmma::atom_aligned<SmemT>(pass_raw);
  const int seq = blockIdx.x, h = blockIdx.y;
  const int group = kGroups == 1 ? 0 : static_cast<int>(threadIdx.x) / 128;
  const int col0 = kCols * (kGroups * static_cast<int>(blockIdx.z) + group);
  const int u_half = col0 / 64;  // where the stages hold half of U: the one the block reads
  const Seq q{b.seq_begin[seq], b.seq_len[seq], h, h / (s.nv / s.nk), b.num_tokens};
  const uint32_t st_tile = mma::smem_u32(sm.st[group]), vt = mma::smem_u32(sm.vt[group]);
  const size_t head = static_cast<size_t>(kDim) * kDim;
  StateT* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * head;
  Acc<kCols> hs[2] = {};
  if (b.seq_start[seq] != 0) WgState::template io<false>(S, col0, hs);
  const int snap_at = b.seq_snap_at[seq];
  walk_chunks(
      sm.stage, sm.full, maps, q, ws, u_half, [&] { WgState::publish(st_tile, hs); },
      [&](const auto& stage, int t0, int n) {  // S^T published before the first chunk's barrier
        step<kCols>(hs, stage, st_tile, vt, q, t0, n, s, group, col0, out);
        if (t0 + n == snap_at)  // the in-step snapshot: the state after this chunk
          WgState::template io<true>(
              state + (static_cast<size_t>(b.seq_snap_slot[seq]) * s.nv + h) * head, col0, hs);
      });
  WgState::template io<true>(S, col0, hs);
}

template <class StateT, int kCols, int kGroups, int kStages>
void launch_kernel(const BatchMeta& b, const PassMaps& maps, const Workspace& ws, StateT* state,
                   const GdnShape& s, bf16* out, cudaStream_t stream) {
  constexpr int smem = kSmemBytes<kCols, kGroups, kStages>, parts = kDim / (kCols * kGroups);
  static_assert(smem <= 227 * 1024, "the pass's stages fit one SM's shared memory");
  const auto kernel = pass_kernel<StateT, kCols, kGroups, kStages>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kernel<<<dim3(b.num_seqs, s.nv, parts), 128 * kGroups, smem, stream>>>(b, maps, ws, state, s,
                                                                         out);
}

// A split head's block (one warpgroup) with its loads issued kStages - 1 chunks ahead: three
// stages of half-U tiles fit beside its state (DS_GDN_PASS_STAGES=0: two, A/B).
template <class StateT, int kCols>
void launch_split(const BatchMeta& b, const PassMaps& maps, const Workspace& ws, StateT* state,
                  const GdnShape& s, bf16* out, cudaStream_t stream) {
  static const bool three = ab_switch_on("DS_GDN_PASS_STAGES");
  if (three)
    launch_kernel<StateT, kCols, 1, 3>(b, maps, ws, state, s, out, stream);
  else
    launch_kernel<StateT, kCols, 1, 2>(b, maps, ws, state, s, out, stream);
}

template <class StateT>
void launch_typed(const BatchMeta& b, const Workspace& ws, StateT* state, const GdnShape& s,
                  int split, bf16* out, cudaStream_t stream) {
  const PassMaps maps = pass_maps(b, ws, s);
  if (split == 4)
    launch_split<StateT, 32>(b, maps, ws, state, s, out, stream);
  else if (split == 2)
    launch_split<StateT, 64>(b, maps, ws, state, s, out, stream);
  else
    launch_kernel<StateT, 64, 2, 2>(b, maps, ws, state, s, out, stream);
}

}  // namespace

void launch_state_pass(const BatchMeta& b, const Workspace& ws, GdnState state, const GdnShape& s,
                       int sm_count, bf16* out, cudaStream_t stream) {
  // DS_GDN_PASS_PARTS=1, 2 or 4 forces the column parts a head (A/B, tests).
  static const int forced = [] {
    const char* v = std::getenv("DS_GDN_PASS_PARTS");
    const int n = v ? std::atoi(v) : 0;
    return n == 1 || n == 2 || n == 4 ? n : 0;
  }();
  const int split = forced ? forced : state_pass_parts(b.num_seqs, s.nv, sm_count);
  // Whole and half heads take the pass with the state transposed in registers (on the H200,
  // gdn_bench, ms a layer: 8 x 1024 0.321 against 0.326 at bc8b3ec; 2 x 4096 0.323 against 0.334,
  // 2 x 16384 1.257 against 1.291 at 3c896b8); quarter heads (one sequence) keep this one (1 x 8192
  // 0.378 against 0.419 for the transposed pass's 64-column halves).
  // DS_GDN_PASS_T=0 never takes it, =1 always does (A/B, tests).
  static const int transposed = ab_switch_forced("DS_GDN_PASS_T");
  if (transposed == 1 || (transposed == -1 && split <= 2))
    return launch_state_pass_transposed(b, ws, state, s, split > 1, out, stream);
  if (state.bf16)
    launch_typed(b, ws, static_cast<bf16*>(state.data), s, split, out, stream);
  else
    launch_typed(b, ws, static_cast<float*>(state.data), s, split, out, stream);
}

}  // namespace deltaserve::cuda::gdn_chunk
