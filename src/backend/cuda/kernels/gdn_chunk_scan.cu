// Kernel 2 of the chunked delta rule for steps of few sequences, the state pass over column slices
// on Hopper warpgroup MMAs (sm_90a): block (sequence, value head, 32-column slice of the state),
// one warpgroup walking the sequence's chunks in order with the f32 state slice as two m64n32
// accumulators (rows 0..63 and 64..127). The next chunks' operands stream into shared memory
// (cp.async, kStages - 1 chunks in flight) while the current one computes. Per chunk:
//   the chunk-start state as S^T (bf16, from its shared tile) to the workspace, for
//   gdn_chunk_out.cu;
//   V' = U - W S (A = W by ldmatrix, B = S^T from shared memory), written over U;
//   S <- e^gam_last S + kd^T V' (A = kd^T by ldmatrix, B = V'^T from shared memory).
// S^T and V'^T go to shared memory through stmatrix (transposed) in the 128-byte-swizzled layout
// the MMAs read (wgmma.cuh). Every chunk's output is left to gdn_chunk_out.cu.
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/gdn_chunk_wg_state.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 128, kSlice = 32;
constexpr int kLdU = kSlice + 8;  // rows of U's slice (bf16), padded
using WgState = WarpgroupState<kSlice>;
using Acc = WgState::Acc;                              // an m64n32 accumulator
constexpr uint32_t kHalfBytes = WgState::kBlockBytes;  // one 64-row block of S^T

struct Seq {
  int base, len, h, col0, T, state_index;
};

template <int kStageCount>
struct Pass {
  static constexpr int kStages = kStageCount;  // chunks staged: the next kStages - 1 in flight

  struct Stage {
    bf16 w[kChunk][kLd];   // W
    bf16 kd[kChunk][kLd];  // k e^(gam_last - gam)
    bf16 u[kChunk][kLdU];  // U, this block's columns
    float gam[kChunk];
  };
  struct Smem {
    bf16 st[2 * kSlice * 64];  // S^T [column][dk]: two SW128 blocks of 64 dk
    bf16 vt[kSlice * 64];      // V'^T [column][token]: one SW128 block
    Stage stage[kStages];
  };
  static constexpr size_t kBytes = sizeof(Smem) + wgmma::kAtomBytes;  // + alignment

  // Chunk `c`'s W, kd, U (this block's columns) and gam into `st` (rows past the sequence zero).
  __device__ static void load_chunk(Stage& st, const Seq& q, int c, const Workspace& ws,
                                    const GdnShape& s) {
    const int t0 = c * kChunk, n = min(kChunk, q.len - t0), first = q.base + t0;
    const int tid = threadIdx.x, row_elems = s.nv * kDim, head = q.h * kDim;
#pragma unroll
    for (int i = 0; i < kChunk / 8; ++i) {
      const int r = tid / 16 + 8 * i, col = 8 * (tid % 16);
      const size_t at = static_cast<size_t>(first + (r < n ? r : 0)) * row_elems + head + col;
      mma::cp_async16(st.w[r] + col, ws.w + at, r < n);
      mma::cp_async16(st.kd[r] + col, ws.kd + at, r < n);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = tid / 4 + 32 * j, col = 8 * (tid % 4);
      const size_t at =
          static_cast<size_t>(first + (r < n ? r : 0)) * row_elems + head + q.col0 + col;
      mma::cp_async16(st.u[r] + col, ws.u + at, r < n);
    }
    if (tid < kChunk)
      mma::cp_async4(&st.gam[tid],
                     ws.gam + static_cast<size_t>(q.h) * q.T + first + (tid < n ? tid : 0),
                     tid < n);
  }

  // The chunk-start state (published as S^T in shared memory) into this block's rows of the
  // workspace's S^T `Ht` [dv][dk]: 16-byte pieces, a row's 256 bytes from 16 threads (whole
  // sectors; stores from the accumulators would write half sectors).
  __device__ static void store_chunk_state(bf16* Ht, const Seq& q, const bf16* st) {
#pragma unroll
    for (int k = 0; k < 2 * kSlice * 64 / 8 / kThreads; ++k) {
      const int e = threadIdx.x + kThreads * k, col = e / 16, piece = e % 16;
      const uint32_t at =
          (piece / 8) * kHalfBytes + wgmma::sw128_offset(kSlice, col, 8 * (piece % 8));
      *reinterpret_cast<uint4*>(Ht + (q.col0 + col) * kDim + 8 * piece) =
          *reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(st) + at);
    }
  }

  // V' = U - W S: into V'^T (shared) and over U in the workspace (rows below n).
  __device__ static void form_v(const Stage& st, uint32_t st_tile, uint32_t vt, const Seq& q,
                                int t0, int n, const GdnShape& s, const Workspace& ws) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    Acc v;
    WgState::issue<kDim / 16>(v, st.w[0], kLd, st_tile, false);
    wgmma::commit();
    wgmma::wait<0>();
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * warp + g + 8 * hf;
      bf16* urow = ws.u + static_cast<size_t>(q.base + t0 + i) * s.nv * kDim + q.h * kDim + q.col0;
#pragma unroll
      for (int nt = 0; nt < kSlice / 8; ++nt) {
        const int col = 8 * nt + 2 * c;
        const float2 u =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&st.u[i][col]));
        v[4 * nt + 2 * hf] = u.x - v[4 * nt + 2 * hf];
        v[4 * nt + 2 * hf + 1] = u.y - v[4 * nt + 2 * hf + 1];
        if (i < n)
          *reinterpret_cast<__nv_bfloat162*>(urow + col) =
              __floats2bfloat162_rn(v[4 * nt + 2 * hf], v[4 * nt + 2 * hf + 1]);
      }
    }
    WgState::store_transposed(vt, v);
    wgmma::fence_shared_for_async();
  }

  // S <- e^gam_last S + kd^T V' (half: rows 64 half .. of the slice).
  __device__ static void update_state(const Stage& st, uint32_t vt, Acc (&hs)[2], int n) {
    const float decay = __expf(st.gam[n - 1]);
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int e = 0; e < 16; ++e) hs[half][e] *= decay;
    WgState::issue_update(hs, st.kd, vt);
    wgmma::commit();
    wgmma::wait<0>();
  }

  template <class StateT>
  __device__ static void run(Smem& sm, const BatchMeta& b, const Workspace& ws, StateT* state,
                             const GdnShape& s) {
    const int seq = blockIdx.x, h = blockIdx.y;
    const Seq q{b.seq_begin[seq],
                b.seq_len[seq],
                h,
                static_cast<int>(blockIdx.z) * kSlice,
                b.num_tokens,
                chunk_state_index(b.seq_begin[seq], seq, 0)};
    const uint32_t st_tile = mma::smem_u32(sm.st), vt = mma::smem_u32(sm.vt);
    const size_t head = static_cast<size_t>(kDim) * kDim;
    StateT* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * head;
    Acc hs[2] = {};
    if (b.seq_start[seq] != 0) WgState::io<false>(S, q.col0, hs);
    const int chunks = (q.len + kChunk - 1) / kChunk, snap_at = b.seq_snap_at[seq];
    // One cp.async group per chunk (empty past the last): chunk c's is complete when at most
    // kStages - 2 later ones are pending.
    auto stage_chunk = [&](int c) {
      if (c < chunks) load_chunk(sm.stage[c % kStages], q, c, ws, s);
      mma::cp_async_commit();
    };
    for (int c = 0; c + 1 < kStages; ++c) stage_chunk(c);
    WgState::publish(st_tile, hs);
    for (int c = 0; c < chunks; ++c) {
      mma::cp_async_wait<kStages - 2>();
      __syncthreads();  // chunk c staged, S^T published, every read of chunk c - 1's stage done
      stage_chunk(c + kStages - 1);  // into the stage chunk c - 1 used
      const Stage& st = sm.stage[c % kStages];
      const int t0 = c * kChunk, n = min(kChunk, q.len - t0);
      store_chunk_state(ws.h + (static_cast<size_t>(q.state_index + c) * s.nv + h) * head, q,
                        sm.st);
      form_v(st, st_tile, vt, q, t0, n, s, ws);
      __syncthreads();  // V'^T complete; every read of S^T done
      update_state(st, vt, hs, n);
      WgState::publish(st_tile, hs);
      if (t0 + n == snap_at)  // the in-step snapshot: the state after this chunk
        WgState::io<true>(state + (static_cast<size_t>(b.seq_snap_slot[seq]) * s.nv + h) * head,
                          q.col0, hs);
    }
    WgState::io<true>(S, q.col0, hs);
  }
};

template <class P, class StateT>
__global__ void __launch_bounds__(kThreads)
    pass_kernel(BatchMeta b, Workspace ws, StateT* __restrict__ state, GdnShape s) {
  extern __shared__ __align__(128) unsigned char pass_raw[];
  P::run(*wgmma::atom_aligned<typename P::Smem>(pass_raw), b, ws, state, s);
}

template <class P, class StateT>
void launch(const BatchMeta& b, const Workspace& ws, StateT* state, const GdnShape& s,
            cudaStream_t stream) {
  constexpr int smem = P::kBytes;
  cudaFuncSetAttribute(pass_kernel<P, StateT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  pass_kernel<P, StateT>
      <<<dim3(b.num_seqs, s.nv, kDim / kSlice), kThreads, smem, stream>>>(b, ws, state, s);
}

// Deep (3 chunks in flight) where the blocks fit one per SM, else 1 in flight at two per SM.
template <class StateT>
void launch_typed(const BatchMeta& b, const Workspace& ws, StateT* state, const GdnShape& s,
                  int sm_count, cudaStream_t stream) {
  if (b.num_seqs * s.nv * (kDim / kSlice) <= sm_count)
    launch<Pass<4>>(b, ws, state, s, stream);
  else
    launch<Pass<2>>(b, ws, state, s, stream);
}

}  // namespace

void launch_slice_pass(const BatchMeta& b, const Workspace& ws, GdnState state, const GdnShape& s,
                       int sm_count, cudaStream_t stream) {
  if (state.bf16)
    launch_typed(b, ws, static_cast<bf16*>(state.data), s, sm_count, stream);
  else
    launch_typed(b, ws, static_cast<float*>(state.data), s, sm_count, stream);
}

}  // namespace deltaserve::cuda::gdn_chunk
