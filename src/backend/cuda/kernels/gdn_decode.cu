// The fused GDN decode layer (gdn_decode.cuh): conv + SiLU with the conv-state update, q / k L2
// norms, the gates, the delta rule and the gated RMSNorm for one token per sequence, one kernel.
#include <cstdlib>
#include <cstring>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn_decode.cuh"
#include "backend/cuda/kernels/gdn_decode_split.cuh"
#include "backend/cuda/kernels/gdn_decode_step.cuh"
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
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kRows = kDk / kWarps;  // state rows per thread (per value head)
constexpr int kMaxHeadsPerKey = 4;
static_assert(kThreads >= 2 * kDk, "a thread per q / k channel scales them by their norms");
__device__ inline float4 fma4(float4 a, float s, float4 c) {
  return make_float4(fmaf(a.x, s, c.x), fmaf(a.y, s, c.y), fmaf(a.z, s, c.z), fmaf(a.w, s, c.w));
}
__device__ inline float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// Thread (warp w, lane l) holds rows w, w + kWarps, ... of a value head's state, columns
// 4l .. 4l + 3.
template <class StateT>
__device__ inline void load_state(const StateT* S, bool fresh, int warp, int lane,
                                  float4 (&st)[kRows]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    st[r] = fresh ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                  : StateIo<StateT>::load4(S + ((warp + kWarps * r) * 32 + lane) * 4);
}

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
// of its value heads (each channel, and so its conv state, belongs to one block), then the delta
// rule of each of those value heads, warpgroup `group` taking heads group, group + kPar, ..., its
// state in registers (the first head's loads issued before the conv), then the gated RMSNorm of
// its output row.
template <class StateT, int kPar>
__global__ void __launch_bounds__(kPar* kThreads, 2 / kPar)
    gdn_decode_kernel(BatchMeta b, GdnDecodeArgs p, StateT* __restrict__ state) {
  static_assert(kPar == 1 || kPar == 2, "group_sync names two barriers");
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  // The gated norm's weights (never written by a kernel) before the wait: the norm ends the chain.
  float nw[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) nw[e] = p.norm_w[4 * (threadIdx.x % 32) + e];
  pdl::wait_for_predecessor();
  __shared__ float ys[2 * kDk + kMaxHeadsPerKey * kDv];  // conv outputs: q | k | v per head
  __shared__ float4 red_m[kPar][kWarps][32], red_o[kPar][kWarps][32];
  __shared__ float norms[3];  // |q|^-1 dk^-1/2, |k|^-1, q . k (normalised)
  const int seq = blockIdx.x, kh = blockIdx.y, g = p.nv / p.nk;
  const int tid = threadIdx.x, lane = tid % 32;
  const int warp = kPar == 1 ? tid / 32 : (tid / 32) % kWarps,
            group = kPar == 1 ? 0 : tid / kThreads;
  const int key_dim = p.nk * kDk, C = 2 * key_dim + p.nv * kDv;
  const int t = b.seq_begin[seq];
  const bool fresh = b.seq_start[seq] == 0;
  const size_t slot = static_cast<size_t>(b.seq_slot[seq]);
  const auto head_state = [&](int j) {
    return state + (slot * p.nv + kh * g + j) * static_cast<size_t>(kDk * kDv);
  };
  float4 st[kRows];
  if (group < g) load_state(head_state(group), fresh, warp, lane, st);

  // Conv + SiLU of the block's channels; the conv state becomes the last K - 1 inputs.
  const int n_ch = 2 * kDk + g * kDv;
  for (int i = tid; i < n_ch; i += kPar * kThreads) {
    const int c = i < kDk       ? kh * kDk + i
                  : i < 2 * kDk ? key_dim + kh * kDk + (i - kDk)
                                : 2 * key_dim + kh * g * kDv + (i - 2 * kDk);
    const ConvWindow w = read_conv_window(p, slot, C, t, c, fresh);
    ys[i] = conv_silu(p, c, w);
    write_conv_state(p, slot, C, c, w);
  }
  __syncthreads();
  const float qk = normalise_qk(ys, norms);

  for (int j = group; j < g; j += kPar) {
    const int h = kh * g + j;
    if (j > group) load_state(head_state(j), fresh, warp, lane, st);
    const size_t gi = static_cast<size_t>(t) * p.nv + h;
    float beta, alpha;
    decode_gates(load_gate_inputs(p, gi, h), beta, alpha);
    // One pass over the state: m = S^T k and S^T q; with S' = alpha S + k delta^T,
    // delta = beta (v - alpha S^T k) and o = S'^T q = alpha S^T q + delta (k . q).
    float4 m = make_float4(0.0f, 0.0f, 0.0f, 0.0f), o = m;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = warp + kWarps * r;
      m = fma4(st[r], ys[kDk + i], m);
      o = fma4(st[r], ys[i], o);
    }
    red_m[group][warp][lane] = m;
    red_o[group][warp][lane] = o;
    group_sync<kPar>(group);
    m = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    o = m;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      m = add4(m, red_m[group][w][lane]);
      if (warp == 0) o = add4(o, red_o[group][w][lane]);
    }
    const float* v = ys + 2 * kDk + j * kDv + 4 * lane;
    const float4 delta = make_float4(beta * (v[0] - alpha * m.x), beta * (v[1] - alpha * m.y),
                                     beta * (v[2] - alpha * m.z), beta * (v[3] - alpha * m.w));
    StateT* S = head_state(j);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = warp + kWarps * r;
      const float kv = ys[kDk + i];
      const float4 s = st[r];
      StateIo<StateT>::store4(
          S + (i * 32 + lane) * 4,
          make_float4(fmaf(kv, delta.x, alpha * s.x), fmaf(kv, delta.y, alpha * s.y),
                      fmaf(kv, delta.z, alpha * s.z), fmaf(kv, delta.w, alpha * s.w)));
    }
    if (warp == 0) {  // o rounded as the unfused rule stores it, then the gated RMSNorm
      const float ov[4] = {
          round_bf16(fmaf(alpha, o.x, delta.x * qk)), round_bf16(fmaf(alpha, o.y, delta.y * qk)),
          round_bf16(fmaf(alpha, o.z, delta.z * qk)), round_bf16(fmaf(alpha, o.w, delta.w * qk))};
      const float ss = warp_sum(ov[0] * ov[0] + ov[1] * ov[1] + ov[2] * ov[2] + ov[3] * ov[3]);
      const float inv = rsqrtf(ss / static_cast<float>(kDv) + p.eps);
      const size_t at = gi * kDv + 4 * lane;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        p.out[at + e] = __float2bfloat16(ov[e] * inv * nw[e] * silu(__bfloat162float(p.z[at + e])));
    }
    group_sync<kPar>(group);  // red_m / red_o are rewritten by the group's next head
  }
}

template <class StateT>
void launch(const BatchMeta& b, const GdnDecodeArgs& p, StateT* state, int num_sms,
            cudaStream_t stream) {
  const dim3 grid(b.num_seqs, p.nk);
  // Two heads a block where a grid of single-head blocks would leave most SMs without a second
  // block (a few sequences: the chain of dependent loads bounds the step, not the state traffic).
  if (p.nv / p.nk >= 2 && b.num_seqs * p.nk <= num_sms)
    pdl::launch_dependent(gdn_decode_kernel<StateT, 2>, grid, 2 * kThreads, 0, stream, b, p, state);
  else
    pdl::launch_dependent(gdn_decode_kernel<StateT, 1>, grid, kThreads, 0, stream, b, p, state);
}

}  // namespace

bool gdn_decode_supported(int nk, int nv, int dk, int dv, int K) {
  return dk == kDk && dv == kDv && K == kK && nk > 0 && nv % nk == 0 && nv / nk <= kMaxHeadsPerKey;
}

void launch_gdn_decode(const BatchMeta& b, const GdnDecodeArgs& p, GdnState state, int num_sms,
                       cudaStream_t stream) {
  if (b.num_seqs == 0) return;
  static const bool split_on = [] {
    const char* v = std::getenv("DS_GDN_DECODE_SPLIT");
    return !(v && std::strcmp(v, "0") == 0);
  }();
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
