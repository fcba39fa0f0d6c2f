// The fused GDN decode layer (gdn_decode.cuh) for a few sequences: a thread-block cluster a
// (sequence, key head), one block a (value head, quarter of the value columns). A batch-1 step
// then runs 128 blocks at the 4B shape instead of 16 two-head blocks, each reading and writing 16
// KB of state instead of 128 KB: the layer is a chain of dependent loads at that size, and the
// wider grid shortens every link.
//
// Each block convolves its key head's q and k channels and its quarter of its value head's v
// channels, normalises q and k, and runs the delta rule over its state columns; the column
// quarters are independent but for the gated RMSNorm over a head's 128 outputs, whose sum of
// squares each of the head's four blocks stores into the others' shared memory (distributed
// shared memory) before the one cluster barrier, so that none touches another's after it and no
// barrier is needed before leaving (measured 8.7 us a layer at one sequence against 9.2 with the
// sums read after the barrier and a second one at the end). q and k's conv state is shared by the
// key head's blocks: only rank 0 writes it, after the cluster barrier that follows every block's
// reads.
#include "backend/cuda/kernels/gdn_decode_split.cuh"
#include "backend/cuda/kernels/gdn_decode_step.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/tma.cuh"

namespace deltaserve::cuda {
namespace {

using namespace gdn_decode;

constexpr int kSlices = 4, kCols = kDv / kSlices;  // a lane a column
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kRows = kDk / kWarps;         // state rows per thread
constexpr int kChannels = 2 * kDk + kCols;  // q, k and the block's v channels
constexpr int kChannelSteps = (kChannels + kThreads - 1) / kThreads;
static_assert(kCols == 32 && kThreads >= 2 * kDk, "a lane a column; a thread per q / k channel");

// The conv channel of the block's i-th channel (q, then k, then its quarter of v).
__device__ inline int channel_of(int i, int kh, int h, int c, int key_dim) {
  return i < kDk       ? kh * kDk + i
         : i < 2 * kDk ? key_dim + kh * kDk + (i - kDk)
                       : 2 * key_dim + h * kDv + c * kCols + (i - 2 * kDk);
}

// Block (rank = value head j x kSlices + quarter c, key head, sequence); thread (warp w, lane l)
// holds state rows w, w + kWarps, ... of column kCols c + l.
template <class StateT>
__global__ void __launch_bounds__(kThreads)
    gdn_decode_split_kernel(BatchMeta b, GdnDecodeArgs p, StateT* __restrict__ state,
                            bool early_state) {
  pdl::allow_successor();  // a programmatic dependent may start streaming its weights
  const int rank = static_cast<int>(blockIdx.x), kh = static_cast<int>(blockIdx.y);
  const int seq = static_cast<int>(blockIdx.z), j = rank / kSlices, c = rank % kSlices;
  const int g = p.nv / p.nk, h = kh * g + j;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int col = c * kCols + lane;
  const float nw = p.norm_w[col];  // never written by a kernel: before the wait
  const int t = b.seq_begin[seq];
  const bool fresh = b.seq_start[seq] == 0;
  const size_t slot = static_cast<size_t>(b.seq_slot[seq]);
  StateT* S = state + (slot * p.nv + h) * static_cast<size_t>(kDk * kDv) + col;
  float st[kRows];
  const auto load_state = [&] {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      st[r] = fresh ? 0.0f : StateIo<StateT>::load(S + (warp + kWarps * r) * kDv);
  };
  if (early_state) load_state();  // before the wait: gdn_decode.cuh says why that is safe
  pdl::wait_for_predecessor();
  if (!early_state) load_state();
  const size_t gi = static_cast<size_t>(t) * p.nv + h, at = gi * kDv + col;
  // The gates and the output gate loaded with the state, not at the ends of the chain.
  const GateInputs gates = load_gate_inputs(p, gi, h);
  const float zv = __bfloat162float(p.z[at]);
  __shared__ float ys[kChannels];  // conv outputs: q | k | v quarter
  __shared__ float red_m[kWarps][kCols], red_o[kWarps][kCols];
  __shared__ float norms[3];
  __shared__ float head_ss[kSlices];  // the head's blocks' sums of squares of their outputs
  const int key_dim = p.nk * kDk, C = 2 * key_dim + p.nv * kDv;

  ConvWindow win[kChannelSteps];
#pragma unroll
  for (int s = 0; s < kChannelSteps; ++s) {
    const int i = tid + s * kThreads;
    if (i >= kChannels) break;
    const int ch = channel_of(i, kh, h, c, key_dim);
    win[s] = read_conv_window(p, slot, C, t, ch, fresh);
    ys[i] = conv_silu(p, ch, win[s]);
  }
  __syncthreads();
  const float qk = normalise_qk(ys, norms);

  float beta, alpha;
  decode_gates(gates, beta, alpha);
  // m = S^T k and S^T q over this thread's rows, then over the block's warps; with S' = alpha S +
  // k delta^T, delta = beta (v - alpha S^T k) and o = S'^T q = alpha S^T q + delta (k . q).
  float m = 0.0f, o = 0.0f;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int i = warp + kWarps * r;
    m = fmaf(st[r], ys[kDk + i], m);
    o = fmaf(st[r], ys[i], o);
  }
  red_m[warp][lane] = m;
  red_o[warp][lane] = o;
  __syncthreads();
  m = 0.0f;
  o = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    m += red_m[w][lane];
    o += red_o[w][lane];
  }
  const float delta = beta * (ys[2 * kDk + lane] - alpha * m);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int i = warp + kWarps * r;
    StateIo<StateT>::store(S + i * kDv, fmaf(ys[kDk + i], delta, alpha * st[r]));
  }
  const float ov = round_bf16(fmaf(alpha, o, delta * qk));  // as the unfused rule stores it
  if (warp == 0) {
    const float ss = warp_sum(ov * ov);
    if (lane < kSlices)  // into slot c of each of the head's four blocks
      tma::store_f32_to_cta(&head_ss[c], ss, j * kSlices + lane);
  }
  tma::cluster_sync();  // every block's sum stored and its conv-state reads done
  if (warp == 0) {      // the gated RMSNorm over the head's four quarters
    float ss = 0.0f;
#pragma unroll
    for (int q = 0; q < kSlices; ++q) ss += head_ss[q];
    const float inv = rsqrtf(ss / static_cast<float>(kDv) + p.eps);
    p.out[at] = __float2bfloat16(ov * inv * nw * silu(zv));
  }
#pragma unroll
  for (int s = 0; s < kChannelSteps; ++s) {
    const int i = tid + s * kThreads;
    if (i < kChannels && (i >= 2 * kDk || rank == 0))
      write_conv_state(p, slot, C, channel_of(i, kh, h, c, key_dim), win[s]);
  }
}

template <class StateT>
cudaError_t launch(const BatchMeta& b, const GdnDecodeArgs& p, StateT* state, cudaStream_t stream) {
  const int cluster = (p.nv / p.nk) * kSlices;
  return pdl::launch_clustered(pdl::dependent_launch_enabled(), dim3(cluster, 1, 1),
                               gdn_decode_split_kernel<StateT>, dim3(cluster, p.nk, b.num_seqs),
                               kThreads, 0, stream, b, p, state, gdn_decode_early_state());
}

}  // namespace

// Measured on the H200 at the 4B shape (16 key heads), per layer, with this form's first build
// (norm sums read after the barrier, a second barrier before leaving): one sequence 9.2 us
// against the two-head form's 11.5; four sequences 15.6 against 13.1 (the form repeats each key
// head's q / k conv and norms in every block of its cluster). The final form (8.7 us at one
// sequence) was not re-timed at four.
bool gdn_decode_split_pays(int nk, int nv, int num_seqs, int num_sms) {
  return nv / nk * kSlices <= 8 && 8 * num_seqs * nk <= num_sms;
}

cudaError_t launch_gdn_decode_split(const BatchMeta& b, const GdnDecodeArgs& p, GdnState state,
                                    cudaStream_t stream) {
  if (state.bf16) return launch(b, p, static_cast<__nv_bfloat16*>(state.data), stream);
  return launch(b, p, static_cast<float*>(state.data), stream);
}

}  // namespace deltaserve::cuda
