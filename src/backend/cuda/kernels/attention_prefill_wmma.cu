#include <mma.h>

#include "backend/cuda/kernels/attention_prefill.cuh"

namespace deltaserve::cuda {
namespace {

// Tensor-core (WMMA bf16, f32 accumulate) causal flash attention over the paged KV: the first
// prefill kernel, kept beside attention_prefill.cu's until that one is validated on the H200. Block
// (64-query tile, sequence, query head), 4 warps of 16 query rows (two blocks per SM); the warp's Q
// rows and its output accumulators stay in registers, key/value tiles of 64 go through shared
// memory; S = Q K^T and O += P V on tensor cores, the online softmax in f32.
constexpr int kTile = 64, kTcWarps = 4;

template <int HD>
struct TcLayout {
  static constexpr int ldh = HD + 8;     // bf16 rows of K, V (and Q while it is loaded)
  static constexpr int lds = kTile + 4;  // f32 scores
  static constexpr int ldp = kTile + 8;  // bf16 probabilities
  static constexpr size_t bytes =
      2 * kTile * ldh * 2 + kTile * lds * 4 + kTile * ldp * 2 + kTile * 4;
};

// Row of element i of a 16x16 f32 WMMA accumulator held by `lane` (sm_80+: the fragment is two
// m16n8 MMA accumulators — x[0..3] columns 0-7, x[4..7] columns 8-15; pairs of rows lane / 4 and
// lane / 4 + 8). The ops test's prefill cases check every element through the output.
__device__ inline int acc_row(int lane, int i) { return (lane >> 2) + 8 * ((i >> 1) & 1); }
__device__ inline int acc_col(int lane, int i) { return 2 * (lane & 3) + (i & 1) + 8 * (i >> 2); }

template <int HD>
__global__ void __launch_bounds__(32 * kTcWarps, 2)
    attn_prefill_tc_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ q,
                           const __nv_bfloat16* __restrict__ gate,
                           const __nv_bfloat16* __restrict__ kc,
                           const __nv_bfloat16* __restrict__ vc, AttnShape s, int min_len,
                           __nv_bfloat16* __restrict__ out) {
  using namespace nvcuda;
  using Lay = TcLayout<HD>;
  constexpr int ND = HD / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Vs = Ks + kTile * Lay::ldh;
  float* Ss = reinterpret_cast<float*>(Vs + kTile * Lay::ldh);
  __nv_bfloat16* Ps = reinterpret_cast<__nv_bfloat16*>(Ss + kTile * Lay::lds);
  float* corr = reinterpret_cast<float*>(Ps + kTile * Lay::ldp);
  const int tile = blockIdx.x, seq = blockIdx.y, h = blockIdx.z;
  const int n = b.seq_len[seq];
  if (n < min_len || tile * kTile >= n) return;
  const int q0 = tile * kTile, rows = min(kTile, n - q0), start = b.seq_start[seq];
  const int begin = b.seq_begin[seq], kvh = h / (s.nh / s.nkv);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int* pages = b.pages + b.seq_page_off[seq];
  constexpr int kVec = HD / 8;  // 16-byte vectors per row
  // The Q tile through shared memory (rows past the sequence zero) into this warp's fragments.
  for (int e = tid; e < kTile * kVec; e += 32 * kTcWarps) {
    const int r = e / kVec, c = e % kVec;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows)
      v = *reinterpret_cast<const uint4*>(
          q + (static_cast<size_t>(begin + q0 + r) * s.nh + h) * HD + c * 8);
    *reinterpret_cast<uint4*>(Ks + r * Lay::ldh + c * 8) = v;
  }
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qf[ND];
#pragma unroll
  for (int kk = 0; kk < ND; ++kk)
    wmma::load_matrix_sync(qf[kk], Ks + 16 * warp * Lay::ldh + kk * 16, Lay::ldh);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> of[ND];
#pragma unroll
  for (int d = 0; d < ND; ++d) wmma::fill_fragment(of[d], 0.0f);
  // Softmax state of row (16 warp + lane / 2), kept by both lanes of the row.
  const int my_row = 16 * warp + lane / 2, half = lane % 2;
  const int qpos = start + q0 + my_row;
  float m = -INFINITY, l = 0.0f;
  const float scale = rsqrtf(static_cast<float>(HD));
  const int last_key = start + q0 + rows - 1;
  for (int k0 = 0; k0 <= last_key; k0 += kTile) {
    __syncthreads();  // Q (first tile) / the previous K and V are no longer read
    for (int e = tid; e < kTile * kVec; e += 32 * kTcWarps) {
      const int r = e / kVec, c = e % kVec, p = k0 + r;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (p <= last_key) {
        const size_t row =
            static_cast<size_t>(pages[p / b.page_size]) * b.page_size + p % b.page_size;
        const size_t off = (row * s.nkv + kvh) * HD + c * 8;
        kv = *reinterpret_cast<const uint4*>(kc + off);
        vv = *reinterpret_cast<const uint4*>(vc + off);
      }
      *reinterpret_cast<uint4*>(Ks + r * Lay::ldh + c * 8) = kv;
      *reinterpret_cast<uint4*>(Vs + r * Lay::ldh + c * 8) = vv;
    }
    __syncthreads();
    // S[16 warp .., 0..64) = Q K^T.
#pragma unroll
    for (int j = 0; j < kTile / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < ND; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, Ks + 16 * j * Lay::ldh + kk * 16, Lay::ldh);
        wmma::mma_sync(acc, qf[kk], fb, acc);
      }
      wmma::store_matrix_sync(Ss + 16 * warp * Lay::lds + 16 * j, acc, Lay::lds,
                              wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax of row my_row over its 32 columns [32 half, 32 half + 32).
    float* srow = Ss + my_row * Lay::lds + 32 * half;
    float mx = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      const int kpos = k0 + 32 * half + c;
      const float v = kpos <= qpos ? srow[c] * scale : -INFINITY;
      srow[c] = v;
      mx = fmaxf(mx, v);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float cf = m == -INFINITY ? 0.0f : __expf(m - m_new);
    float sum = 0.0f;
    __nv_bfloat16* prow = Ps + my_row * Lay::ldp + 32 * half;
    for (int c = 0; c < 32; ++c) {
      const float p = srow[c] == -INFINITY ? 0.0f : __expf(srow[c] - m_new);
      prow[c] = __float2bfloat16(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * cf + sum;
    m = m_new;
    if (half == 0) corr[my_row] = cf;
    __syncwarp();
    // O = corr * O + P V, O in registers.
#pragma unroll
    for (int d = 0; d < ND; ++d)
#pragma unroll
      for (int i = 0; i < of[d].num_elements; ++i) of[d].x[i] *= corr[16 * warp + acc_row(lane, i)];
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pf[kTile / 16];
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk)
      wmma::load_matrix_sync(pf[kk], Ps + 16 * warp * Lay::ldp + 16 * kk, Lay::ldp);
#pragma unroll
    for (int d = 0; d < ND; ++d)
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
        wmma::load_matrix_sync(fb, Vs + 16 * kk * Lay::ldh + 16 * d, Lay::ldh);
        wmma::mma_sync(of[d], pf[kk], fb, of[d]);
      }
  }
  __syncwarp();
  if (half == 0) corr[my_row] = 1.0f / l;
  __syncwarp();
#pragma unroll
  for (int d = 0; d < ND; ++d)
#pragma unroll
    for (int i = 0; i < of[d].num_elements; ++i) {
      const int r = 16 * warp + acc_row(lane, i), c = 16 * d + acc_col(lane, i);
      if (r >= rows) continue;
      const size_t idx = (static_cast<size_t>(begin + q0 + r) * s.nh + h) * HD + c;
      out[idx] =
          __float2bfloat16(of[d].x[i] * corr[r] / (1.0f + __expf(-__bfloat162float(gate[idx]))));
    }
}

template <int HD>
void launch_prefill_tc(const BatchMeta& b, const __nv_bfloat16* q, const __nv_bfloat16* gate,
                       const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                       const AttnShape& s, int min_len, __nv_bfloat16* out, cudaStream_t stream) {
  const size_t smem = TcLayout<HD>::bytes;
  cudaFuncSetAttribute(attn_prefill_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  const int tiles = (b.max_seq_len + kTile - 1) / kTile;
  attn_prefill_tc_kernel<HD><<<dim3(tiles, b.num_seqs, s.nh), 32 * kTcWarps, smem, stream>>>(
      b, q, gate, k_cache, v_cache, s, min_len, out);
}

}  // namespace

void launch_attention_prefill_wmma(const BatchMeta& b, const __nv_bfloat16* q,
                                   const __nv_bfloat16* gate, const __nv_bfloat16* k_cache,
                                   const __nv_bfloat16* v_cache, const AttnShape& s, int min_len,
                                   __nv_bfloat16* out, cudaStream_t stream) {
  if (s.hd == 64) launch_prefill_tc<64>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
  if (s.hd == 128) launch_prefill_tc<128>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
  if (s.hd == 256) launch_prefill_tc<256>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
}

}  // namespace deltaserve::cuda
