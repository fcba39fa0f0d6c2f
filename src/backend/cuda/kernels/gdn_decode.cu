// The fused GDN decode layer (gdn_decode.cuh): conv + SiLU with the conv-state update, q / k L2
// norms, the gates, the delta rule and the gated RMSNorm for one token per sequence, one kernel.
#include "backend/cuda/ab_switch.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn_decode.cuh"
#include "backend/cuda/kernels/gdn_decode_head.cuh"
#include "backend/cuda/kernels/gdn_decode_split.cuh"
#include "backend/cuda/kernels/gdn_state.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace deltaserve::cuda {
namespace {

using namespace gdn_decode;

// 8 warps of up to 128 registers a thread a value head (ptxas: 125 f32 state / 127 bf16; 128 in
// the two-head form): two blocks an SM, so one block's conv and norms overlap the other's state
// traffic (16 warps ran one block an SM). Where the grid is small (few sequences) a block runs
// kPar = 2 value heads side by side, one warpgroup of 8 each, which halves the chain of dependent
// loads a block waits through.
constexpr int kThreads = kHeadThreads;

// A warpgroup's barrier (named barrier 1 + group): the groups of a block run their heads apart.
// (Immediate ids: a register id makes ptxas reserve all 16 barriers.)
template <int kPar>
__device__ inline void group_sync(int group) {
  if (kPar == 1 || group == 0)
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  else
    asm volatile("bar.sync 2, %0;\n" ::"n"(kThreads) : "memory");
}

// Block (sequence, key head): the conv of the key head's q and k channels and of the v channels
// of its value heads, then the delta rule of each of those value heads, warpgroup `group` taking
// heads group, group + kPar, ..., its state in registers (the first head's loads issued before the
// conv), then the gated RMSNorm of its output row.
template <class StateT, int kPar>
__global__ void __launch_bounds__(kPar* kThreads, 2 / kPar)
    gdn_decode_kernel(BatchMeta b, GdnDecodeArgs p, StateT* __restrict__ state, bool early_state) {
  static_assert(kPar == 1 || kPar == 2, "group_sync names two barriers");
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  // The gated norm's weights (never written by a kernel) before the wait: the norm ends the chain.
  float nw[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) nw[e] = p.norm_w[4 * (threadIdx.x % 32) + e];
  __shared__ float ys[kKeyHeadChannels];
  __shared__ HeadScratch scratch[kPar];
  __shared__ float norms[3];  // |q|^-1 dk^-1/2, |k|^-1, q . k (normalised)
  const int seq = blockIdx.x, kh = blockIdx.y, g = p.nv / p.nk;
  const int tid = threadIdx.x, lane = tid % 32;
  const int warp = (tid / 32) % kHeadWarps, group = kPar == 1 ? 0 : tid / kThreads;
  const int t = b.seq_begin[seq];
  const bool fresh = b.seq_start[seq] == 0;
  const size_t slot = static_cast<size_t>(b.seq_slot[seq]);
  const auto head_state = [&](int j) {
    return state + (slot * p.nv + kh * g + j) * static_cast<size_t>(kDk * kDv);
  };
  float4 st[kHeadRows];
  // With early_state the first head's state loads go before the wait (gdn_decode.cuh says why
  // that is safe), overlapping the projection before this kernel.
  if (early_state && group < g) load_head_state(head_state(group), fresh, warp, lane, st);
  pdl::wait_for_predecessor();
  if (!early_state && group < g) load_head_state(head_state(group), fresh, warp, lane, st);
  convolve_key_head(p, slot, t, kh, fresh, ys, tid, kPar * kThreads);
  __syncthreads();
  const float qk = normalise_qk(ys, norms);
  for (int j = group; j < g; j += kPar) {
    if (j > group) load_head_state(head_state(j), fresh, warp, lane, st);
    const int h = kh * g + j;
    delta_rule_head(p, st, ys, ys + 2 * kDk + j * kDv, qk, static_cast<size_t>(t) * p.nv + h, h,
                    head_state(j), nw, scratch[group], [&] { group_sync<kPar>(group); });
  }
}

template <class StateT>
void launch(const BatchMeta& b, const GdnDecodeArgs& p, StateT* state, int num_sms,
            cudaStream_t stream) {
  const dim3 grid(b.num_seqs, p.nk);
  // Two heads a block where a grid of single-head blocks would leave most SMs without a second
  // block (a few sequences: the chain of dependent loads bounds the step, not the state traffic).
  const bool early = gdn_decode_early_state();
  if (p.nv / p.nk >= 2 && b.num_seqs * p.nk <= num_sms)
    pdl::launch_dependent(gdn_decode_kernel<StateT, 2>, grid, 2 * kThreads, 0, stream, b, p, state,
                          early);
  else
    pdl::launch_dependent(gdn_decode_kernel<StateT, 1>, grid, kThreads, 0, stream, b, p, state,
                          early);
}

}  // namespace

bool gdn_decode_supported(int nk, int nv, int dk, int dv, int K) {
  return dk == kDk && dv == kDv && K == kK && nk > 0 && nv % nk == 0 && nv / nk <= kMaxHeadsPerKey;
}

void launch_gdn_decode(const BatchMeta& b, const GdnDecodeArgs& p, GdnState state, int num_sms,
                       cudaStream_t stream) {
  if (b.num_seqs == 0) return;
  static const bool split_on = ab_switch_on("DS_GDN_DECODE_SPLIT");
  if (split_on && gdn_decode_split_pays(p.nk, p.nv, b.num_seqs, num_sms)) {
    if (launch_gdn_decode_split(b, p, state, stream) == cudaSuccess) return;
    (void)cudaGetLastError();  // a cluster launch refused (no room for a cluster): the other forms
  }
  if (state.bf16)
    launch(b, p, static_cast<__nv_bfloat16*>(state.data), num_sms, stream);
  else
    launch(b, p, static_cast<float*>(state.data), num_sms, stream);
}

}  // namespace deltaserve::cuda
