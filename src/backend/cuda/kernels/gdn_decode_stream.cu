// The fused GDN decode layer (gdn_decode.cuh) for many sequences: one block an SM, each taking a
// contiguous, even share of the (sequence, key head) items. For each item the block convolves the
// key head's channels and normalises q and k; then, for each of its value heads in turn, it takes
// the head's state out of a shared-memory stage into registers, hands the stage back to the bulk
// copy engine for a later head's state, and runs the delta rule and gated norm, storing the new
// state from registers. The loads of the next kStages - 1 heads stay in flight throughout (the
// block-per-item forms issue a head's loads only when they reach it, and run in waves).
#include <algorithm>

#include "backend/cuda/kernels/gdn_decode_head.cuh"
#include "backend/cuda/kernels/gdn_decode_stream.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/tma.cuh"

namespace deltaserve::cuda {
namespace {

using namespace gdn_decode;

constexpr int kThreads = kHeadThreads;
constexpr int kStageBudget = 192 * 1024;  // shared memory for value-head states

template <class StateT>
struct Stages {
  static constexpr int kHeadElems = kDk * kDv;
  static constexpr int kHeadBytes = kHeadElems * static_cast<int>(sizeof(StateT));
  static constexpr int kCount = kStageBudget / kHeadBytes;  // 3 f32, 6 bf16
};

// A block's items [first, first + count): item i is (sequence i / nk, key head i % nk); its
// value heads follow in order, use u being value head u % g of item first + u / g.
struct Share {
  int first, count;
};
__device__ inline Share share_of(int items) {
  const int c = static_cast<int>(blockIdx.x), blocks = static_cast<int>(gridDim.x);
  const int first = static_cast<int>(static_cast<int64_t>(c) * items / blocks);
  return {first, static_cast<int>(static_cast<int64_t>(c + 1) * items / blocks) - first};
}

template <class StateT>
__device__ inline StateT* value_head_state(StateT* state, const BatchMeta& b,
                                           const GdnDecodeArgs& p, int item, int j) {
  const size_t slot = static_cast<size_t>(b.seq_slot[item / p.nk]);
  const int h = (item % p.nk) * (p.nv / p.nk) + j;
  return state + (slot * p.nv + h) * static_cast<size_t>(Stages<StateT>::kHeadElems);
}

template <class StateT>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_decode_stream_kernel(BatchMeta b, GdnDecodeArgs p, StateT* __restrict__ state) {
  using St = Stages<StateT>;
  extern __shared__ __align__(128) unsigned char raw[];
  StateT* stages = reinterpret_cast<StateT*>(raw);
  __shared__ uint64_t full[St::kCount];
  __shared__ float ys[kKeyHeadChannels];
  __shared__ HeadScratch scratch;
  __shared__ float norms[3];  // |q|^-1 dk^-1/2, |k|^-1, q . k (normalised)
  pdl::allow_successor();     // a programmatic dependent may start streaming its weights
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  float nw[4];  // the gated norm's weights, never written by a kernel: before the wait
#pragma unroll
  for (int e = 0; e < 4; ++e) nw[e] = p.norm_w[4 * lane + e];
  if (tid == 0) {
    for (int s = 0; s < St::kCount; ++s) tma::barrier_init(&full[s], 1);
    tma::barrier_init_fence();
  }
  __syncthreads();
  pdl::wait_for_predecessor();
  const int g = p.nv / p.nk;
  const Share share = share_of(b.num_seqs * p.nk);
  const int uses = share.count * g;
  // Thread 0: use u's state into its stage (nothing for a fresh sequence: the phase completes on
  // the arrival alone).
  const auto load = [&](int u) {
    const int item = share.first + u / g, s = u % St::kCount;
    const bool fresh = b.seq_start[item / p.nk] == 0;
    tma::arrive_expect_bytes(&full[s], fresh ? 0 : St::kHeadBytes);
    if (!fresh)
      tma::load_bulk(stages + s * St::kHeadElems, value_head_state(state, b, p, item, u % g),
                     St::kHeadBytes, &full[s]);
  };
  if (tid == 0)
    for (int u = 0; u < min(uses, St::kCount); ++u) load(u);
  for (int i = 0, u = 0; i < share.count; ++i) {
    const int item = share.first + i, seq = item / p.nk, kh = item % p.nk;
    const int t = b.seq_begin[seq];
    const bool fresh = b.seq_start[seq] == 0;
    convolve_key_head(p, static_cast<size_t>(b.seq_slot[seq]), t, kh, fresh, ys, tid, kThreads);
    __syncthreads();
    const float qk = normalise_qk(ys, norms);
    for (int j = 0; j < g; ++j, ++u) {
      const int s = u % St::kCount, h = kh * g + j;
      tma::wait(&full[s], (u / St::kCount) & 1);
      float4 st[kHeadRows];
      load_head_state(stages + s * St::kHeadElems, fresh, warp, lane, st);
      __syncthreads();  // every thread's rows out of the stage: it takes a later head's state
      if (tid == 0 && u + St::kCount < uses) load(u + St::kCount);
      delta_rule_head(p, st, ys, ys + 2 * kDk + j * kDv, qk, static_cast<size_t>(t) * p.nv + h, h,
                      value_head_state(state, b, p, item, j), nw, scratch, [] { __syncthreads(); });
    }
  }
}

template <class StateT>
cudaError_t launch(const BatchMeta& b, const GdnDecodeArgs& p, StateT* state, int num_sms,
                   cudaStream_t stream) {
  constexpr int smem = Stages<StateT>::kCount * Stages<StateT>::kHeadBytes;
  const auto kernel = gdn_decode_stream_kernel<StateT>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const int blocks = std::min(num_sms, b.num_seqs * p.nk);
  return pdl::launch_with(pdl::dependent_launch_enabled(), kernel, blocks, kThreads, smem, stream,
                          b, p, state);
}

}  // namespace

bool gdn_decode_stream_pays(int nk, int num_seqs, int num_sms) { return num_seqs * nk > num_sms; }

cudaError_t launch_gdn_decode_stream(const BatchMeta& b, const GdnDecodeArgs& p, GdnState state,
                                     int num_sms, cudaStream_t stream) {
  return state.bf16 ? launch(b, p, static_cast<__nv_bfloat16*>(state.data), num_sms, stream)
                    : launch(b, p, static_cast<float*>(state.data), num_sms, stream);
}

}  // namespace deltaserve::cuda
