// Kernel 2 of the chunked delta rule for steps of few sequences, the state pass over column slices
// on Hopper warpgroup MMAs (sm_90a): block (sequence, value head, 32-column slice of the state),
// one warpgroup walking the sequence's chunks in order with the f32 state slice as two m64n32
// accumulators (rows 0..63 and 64..127). Pairs of a head's slice blocks form thread-block
// clusters: each chunk's W and kd (which both read) are copied from L2 once a pair, by the bulk
// tensor copy engine, each block copying half into both blocks' shared memory (multicast); a
// block's own U columns and the gates come by cp.async. The next chunks' operands stream in while
// the current one computes. Per chunk:
//   the chunk-start state as S^T (bf16, from its shared tile) to the workspace, for
//   gdn_chunk_out.cu;
//   V' = U - W S (A = W by ldmatrix, B = S^T from shared memory), written over U;
//   S <- e^gam_last S + kd^T V' (A = kd^T by ldmatrix, B = V'^T from shared memory).
// S^T and V'^T go to shared memory through stmatrix (transposed) in the 128-byte-swizzled layout
// the MMAs read (wgmma.cuh). Every chunk's output is left to gdn_chunk_out.cu.
#include <string>

#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/gdn_chunk_wg_state.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/tma_map.h"
#include "backend/cuda/kernels/wgmma.cuh"
#include "core/error.h"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 128, kSlice = 32;
// Slice blocks of a head in a cluster: pairs (an H200's GPCs hold fewer than 32 clusters of four
// blocks of one an SM; pairs are TPCs), each copying half of a chunk's four W / kd boxes.
constexpr int kCluster = 2, kBoxesPerBlock = 4 / kCluster;
constexpr int kLdU = kSlice + 8;  // rows of U's slice (bf16), padded
using WgState = WarpgroupState<kSlice>;
using Acc = WgState::Acc;                                  // an m64n32 accumulator
constexpr uint32_t kHalfBytes = WgState::kBlockBytes;      // one 64-row block of S^T
constexpr uint32_t kBoxBytes = kChunk * wgmma::kRowBytes;  // a 64-token x 64-dk SW128 box

// W and kd as [T][nv * dk] matrices, copied in 64 x 64 boxes.
struct Maps {
  CUtensorMap w, kd;
};

struct Seq {
  int base, len, h, col0, T, state_index;
};

template <int kStageCount>
struct Pass {
  static constexpr int kStages = kStageCount;  // chunks staged
  // The stage of chunk c is refilled (with chunk c + kStages) kLag chunks after c: the cluster's
  // blocks release c as they start c + 1, so a lag of 2 seldom waits for the slowest of them.
  static constexpr int kLag = kStages >= 3 ? 2 : 1;

  struct alignas(wgmma::kAtomBytes) Stage {
    bf16 w[2 * kChunk * 64];   // W: two SW128 boxes (dk 0..63, 64..127) of the chunk's tokens
    bf16 kd[2 * kChunk * 64];  // k e^(gam_last - gam), as W
    bf16 u[kChunk][kLdU];      // U, this block's columns
    float gam[kChunk];
  };
  struct Smem {
    bf16 st[2 * kSlice * 64];  // S^T [column][dk]: two SW128 blocks of 64 dk
    bf16 vt[kSlice * 64];      // V'^T [column][token]: one SW128 block
    Stage stage[kStages];
    uint64_t full[kStages];   // a stage's W / kd landed (the four boxes)
    uint64_t empty[kStages];  // every block of the cluster is done with a stage's W / kd
  };
  static constexpr size_t kBytes = sizeof(Smem) + wgmma::kAtomBytes;  // + alignment

  // This block's boxes of chunk c's W / kd (boxes 0-3: W's dk halves, then kd's; rank r takes
  // kBoxesPerBlock from r kBoxesPerBlock) into every block's stage, completing on their `full`
  // barriers; its own barrier told to expect all four boxes.
  __device__ static void copy_shared(Smem& sm, const Maps& maps, const Seq& q, int c) {
    const int s = c % kStages, r = static_cast<int>(tma::cluster_rank());
    Stage& st = sm.stage[s];
    tma::arrive_expect_bytes(&sm.full[s], 4 * kBoxBytes);
#pragma unroll
    for (int i = 0; i < kBoxesPerBlock; ++i) {
      const int box = r * kBoxesPerBlock + i, half = box % 2;
      bf16* dst = (box < 2 ? st.w : st.kd) + half * kChunk * 64;
      tma::load_2d_multicast(dst, box < 2 ? &maps.w : &maps.kd, q.h * kDim + 64 * half,
                             q.base + c * kChunk, &sm.full[s], (1u << kCluster) - 1);
    }
  }

  // Chunk `c`'s U (this block's columns) and gam into `st` (rows past the sequence zero).
  __device__ static void load_own(Stage& st, const Seq& q, int c, const Workspace& ws,
                                  const GdnShape& s) {
    const int t0 = c * kChunk, n = min(kChunk, q.len - t0), first = q.base + t0;
    const int tid = threadIdx.x, row_elems = s.nv * kDim, head = q.h * kDim;
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
    WgState::issue<kDim / 16>(v, Sw128Rows<kChunk>{st.w}, st_tile, false);
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
        // Rows past the sequence (their W / kd are other sequences' or zeros) add nothing to S.
        v[4 * nt + 2 * hf] = i < n ? u.x - v[4 * nt + 2 * hf] : 0.0f;
        v[4 * nt + 2 * hf + 1] = i < n ? u.y - v[4 * nt + 2 * hf + 1] : 0.0f;
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
    WgState::issue_update(hs, Sw128Rows<kChunk>{st.kd}, vt);
    wgmma::commit();
    wgmma::wait<0>();
  }

  __device__ static void init_barriers(Smem& sm) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        tma::barrier_init(&sm.full[s], 1);
        tma::barrier_init(&sm.empty[s], kCluster);
      }
      tma::barrier_init_fence();
    }
    tma::cluster_sync();  // every block's barriers initialised before any copy or arrival
  }

  // Thread 0, starting chunk c: releases chunk c - 1's stage in every block of the cluster (when a
  // later chunk will refill it), then refills the stage of chunk c - kLag once all have released
  // it.
  __device__ static void recycle(Smem& sm, const Maps& maps, const Seq& q, int c, int chunks) {
    if (threadIdx.x != 0) return;
    const int done = c - 1;
    if (done >= 0 && done + kStages < chunks)
      for (int r = 0; r < kCluster; ++r) tma::arrive_in_cta(&sm.empty[done % kStages], r);
    const int old = c - kLag;
    if (old >= 0 && old + kStages < chunks) {
      tma::wait(&sm.empty[old % kStages], (old / kStages) & 1);
      copy_shared(sm, maps, q, old + kStages);
    }
  }

  template <class StateT>
  __device__ static void run(Smem& sm, const BatchMeta& b, const Maps& maps, const Workspace& ws,
                             StateT* state, const GdnShape& s) {
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
    init_barriers(sm);
    if (threadIdx.x == 0)
      for (int c = 0; c < min(kStages, chunks); ++c) copy_shared(sm, maps, q, c);
    // One cp.async group per chunk (empty past the last): chunk c's is complete when at most
    // kStages - 2 later ones are pending.
    auto stage_own = [&](int c) {
      if (c < chunks) load_own(sm.stage[c % kStages], q, c, ws, s);
      mma::cp_async_commit();
    };
    for (int c = 0; c + 1 < kStages; ++c) stage_own(c);
    WgState::publish(st_tile, hs);
    for (int c = 0; c < chunks; ++c) {
      mma::cp_async_wait<kStages - 2>();
      __syncthreads();  // chunk c's own operands staged, S^T published, chunk c - 1 done with
      recycle(sm, maps, q, c, chunks);
      stage_own(c + kStages - 1);  // into the stage chunk c - 1 used
      const Stage& st = sm.stage[c % kStages];
      const int t0 = c * kChunk, n = min(kChunk, q.len - t0);
      store_chunk_state(ws.h + (static_cast<size_t>(q.state_index + c) * s.nv + h) * head, q,
                        sm.st);
      tma::wait(&sm.full[c % kStages], (c / kStages) & 1);
      form_v(st, st_tile, vt, q, t0, n, s, ws);
      __syncthreads();  // V'^T complete; every read of S^T done
      update_state(st, vt, hs, n);
      WgState::publish(st_tile, hs);
      if (t0 + n == snap_at)  // the in-step snapshot: the state after this chunk
        WgState::io<true>(state + (static_cast<size_t>(b.seq_snap_slot[seq]) * s.nv + h) * head,
                          q.col0, hs);
    }
    WgState::io<true>(S, q.col0, hs);
    tma::cluster_sync();  // no block leaves while another may still arrive on its barriers
  }
};

template <class P, class StateT>
__global__ void __launch_bounds__(kThreads)
    pass_kernel(BatchMeta b, const __grid_constant__ Maps maps, Workspace ws,
                StateT* __restrict__ state, GdnShape s) {
  extern __shared__ __align__(128) unsigned char pass_raw[];
  P::run(*wgmma::atom_aligned<typename P::Smem>(pass_raw), b, maps, ws, state, s);
}

// A launch of the pass: grid (sequence, value head, slice), the slices of a head one cluster.
template <class P, class StateT>
struct ClusterLaunch {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t cfg{};
  ClusterLaunch(int num_seqs, int nv, cudaStream_t stream) {
    cudaFuncSetAttribute(pass_kernel<P, StateT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(P::kBytes));
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = kCluster;
    cfg.gridDim = dim3(num_seqs, nv, kDim / kSlice);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = P::kBytes;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // cfg points at attr
};

template <class P, class StateT>
void launch(const BatchMeta& b, const Workspace& ws, StateT* state, const GdnShape& s,
            cudaStream_t stream) {
  const int64_t cols = static_cast<int64_t>(s.nv) * kDim;
  const Maps maps{encode_tma_2d_bf16(ws.w, b.num_tokens, cols, kChunk),
                  encode_tma_2d_bf16(ws.kd, b.num_tokens, cols, kChunk)};
  const ClusterLaunch<P, StateT> l(b.num_seqs, s.nv, stream);
  const cudaError_t e = cudaLaunchKernelEx(&l.cfg, pass_kernel<P, StateT>, b, maps, ws, state, s);
  if (e != cudaSuccess)
    throw DeviceError(std::string("GDN slice pass launch: ") + cudaGetErrorString(e));
}

// How many of the pass's clusters the GPU holds at once (asked once per pass and state type; 0
// when the query fails, its error cleared so that no later check reports it).
template <class P, class StateT>
int resident_clusters() {
  static const int count = [] {
    const ClusterLaunch<P, StateT> l(1, 1, nullptr);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, pass_kernel<P, StateT>, &l.cfg) == cudaSuccess) return n;
    (void)cudaGetLastError();
    return 0;
  }();
  return count;
}

// Deep (W / kd up to 2 chunks ahead, U 3) where every cluster is resident at once at one block an
// SM (the occupancy query: clusters are placed within a GPC), else 1 ahead at two blocks an SM.
template <class StateT>
void launch_typed(const BatchMeta& b, const Workspace& ws, StateT* state, const GdnShape& s,
                  cudaStream_t stream) {
  if (b.num_seqs * s.nv * (kDim / kSlice / kCluster) <= resident_clusters<Pass<4>, StateT>())
    launch<Pass<4>>(b, ws, state, s, stream);
  else
    launch<Pass<2>>(b, ws, state, s, stream);
}

}  // namespace

void launch_slice_pass(const BatchMeta& b, const Workspace& ws, GdnState state, const GdnShape& s,
                       cudaStream_t stream) {
  if (state.bf16)
    launch_typed(b, ws, static_cast<bf16*>(state.data), s, stream);
  else
    launch_typed(b, ws, static_cast<float*>(state.data), s, stream);
}

}  // namespace deltaserve::cuda::gdn_chunk
