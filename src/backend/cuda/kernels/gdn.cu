#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gdn.cuh"
#include "backend/cuda/kernels/gdn_chunk.cuh"
#include "backend/cuda/kernels/gdn_gates.cuh"
#include "backend/cuda/kernels/gdn_state.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kMaxRowsPerWarp = 256 / kWarps;  // dk <= 256

// Block (sequence, value head, 32-column slice of the head's state S [dk, dv]). Lane l owns column
// col0 + l; warp w owns rows w, w + kWarps, ... of it, held in registers across the sequence's
// tokens. Per token: S = alpha * S; m = S^T k; S += k (beta (v - m))^T; o = S^T q, the two column
// sums reduced across warps through shared memory.
template <class StateT>
__global__ void __launch_bounds__(kThreads)
    delta_rule_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ y,
                      const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ bg,
                      const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                      StateT* __restrict__ state, GdnShape s, __nv_bfloat16* __restrict__ out) {
  using Io = StateIo<StateT>;
  __shared__ float qs[256], ks[256], red[kWarps][32];
  const int seq = blockIdx.x, h = blockIdx.y, kh = h / (s.nv / s.nk);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col = blockIdx.z * 32 + lane;
  const bool has_col = col < s.dv;
  const int key_dim = s.nk * s.dk, C = 2 * key_dim + s.nv * s.dv;
  StateT* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * s.dk * s.dv;
  const bool fresh = b.seq_start[seq] == 0;
  float st[kMaxRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kMaxRowsPerWarp; ++r) {
    const int i = warp + kWarps * r;
    st[r] =
        (!fresh && has_col && i < s.dk) ? Io::load(S + static_cast<size_t>(i) * s.dv + col) : 0.0f;
  }
  const float qscale = rsqrtf(static_cast<float>(s.dk));
  const float neg_A = -__expf(A_log[h]), bias = dt_bias[h];
  const int begin = b.seq_begin[seq], n = b.seq_len[seq], snap_at = b.seq_snap_at[seq];
  auto store = [&](StateT* dst) {
    if (!has_col) return;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; ++r) {
      const int i = warp + kWarps * r;
      if (i < s.dk) Io::store(dst + static_cast<size_t>(i) * s.dv + col, st[r]);
    }
  };
  for (int t = 0; t < n; ++t) {
    if (t == snap_at && t > 0)
      store(state + (static_cast<size_t>(b.seq_snap_slot[seq]) * s.nv + h) * s.dk * s.dv);
    const __nv_bfloat16* row = y + static_cast<size_t>(begin + t) * C;
    const int i0 = threadIdx.x;
    const float qv = i0 < s.dk ? __bfloat162float(row[kh * s.dk + i0]) : 0.0f;
    const float kv = i0 < s.dk ? __bfloat162float(row[key_dim + kh * s.dk + i0]) : 0.0f;
    const float rq = qscale * rsqrtf(block_sum<kThreads>(qv * qv) + 1e-6f);
    const float rk = rsqrtf(block_sum<kThreads>(kv * kv) + 1e-6f);
    if (i0 < s.dk) {
      qs[i0] = qv * rq;
      ks[i0] = kv * rk;
    }
    const size_t gi = static_cast<size_t>(begin + t) * s.nv + h;
    const float beta = gate_beta(__bfloat162float(bg[gi]));
    const float alpha = __expf(gate_log_decay(__bfloat162float(a[gi]), bias, neg_A));
    const float v = has_col ? __bfloat162float(row[2 * key_dim + h * s.dv + col]) : 0.0f;
    __syncthreads();  // qs / ks written
    float m = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; ++r) {
      const int i = warp + kWarps * r;
      if (i < s.dk) {
        st[r] *= alpha;
        m = fmaf(st[r], ks[i], m);
      }
    }
    red[warp][lane] = m;
    __syncthreads();
    m = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m += red[w][lane];
    const float delta = beta * (v - m);
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; ++r) {
      const int i = warp + kWarps * r;
      if (i < s.dk) {
        st[r] = fmaf(ks[i], delta, st[r]);
        o = fmaf(st[r], qs[i], o);
      }
    }
    __syncthreads();  // every warp has read red (m)
    red[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && has_col) {
      o = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) o += red[w][lane];
      out[gi * s.dv + col] = __float2bfloat16(o);
    }
    __syncthreads();  // red, qs, ks are rewritten for the next token
  }
  store(S);
}

// Decode fast path for dv == 128, dk a multiple of 16 up to 256: block (sequence, value head) of 16
// warps; lane l owns columns 4l..4l+3 of the head's whole state (16-byte loads), warp w rows w,
// w + 16, ...; q / k norms are computed once per head.
constexpr int kFastWarps = 16, kFastThreads = 32 * kFastWarps, kFastRows = 256 / kFastWarps;

template <class StateT>
__global__ void __launch_bounds__(kFastThreads)
    delta_rule_dv128_kernel(BatchMeta b, const __nv_bfloat16* __restrict__ y,
                            const __nv_bfloat16* __restrict__ a,
                            const __nv_bfloat16* __restrict__ bg, const float* __restrict__ A_log,
                            const float* __restrict__ dt_bias, StateT* __restrict__ state,
                            GdnShape s, __nv_bfloat16* __restrict__ out) {
  using Io = StateIo<StateT>;
  __shared__ float qs[256], ks[256];
  __shared__ float4 red[kFastWarps][32];
  const int seq = blockIdx.x, h = blockIdx.y, kh = h / (s.nv / s.nk);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, tid = threadIdx.x;
  const int key_dim = s.nk * s.dk, C = 2 * key_dim + s.nv * 128;
  StateT* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * s.dk * 128;
  const bool fresh = b.seq_start[seq] == 0;
  const int rows = s.dk / kFastWarps;
  float4 st[kFastRows];
#pragma unroll
  for (int r = 0; r < kFastRows; ++r)
    st[r] = (!fresh && r < rows) ? Io::load4(S + ((warp + kFastWarps * r) * 32 + lane) * 4)
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float qscale = rsqrtf(static_cast<float>(s.dk));
  const float neg_A = -__expf(A_log[h]), bias = dt_bias[h];
  const int begin = b.seq_begin[seq], n = b.seq_len[seq];
  for (int t = 0; t < n; ++t) {
    const __nv_bfloat16* row = y + static_cast<size_t>(begin + t) * C;
    const bool is_q = tid < 256, has = (tid % 256) < s.dk;
    const int i0 = tid % 256;
    const float x = has ? __bfloat162float(row[(is_q ? 0 : key_dim) + kh * s.dk + i0]) : 0.0f;
    const float sq = block_sum<kFastThreads>(is_q ? x * x : 0.0f);
    const float sk = block_sum<kFastThreads>(is_q ? 0.0f : x * x);
    if (has) {
      if (is_q)
        qs[i0] = x * qscale * rsqrtf(sq + 1e-6f);
      else
        ks[i0] = x * rsqrtf(sk + 1e-6f);
    }
    const size_t gi = static_cast<size_t>(begin + t) * s.nv + h;
    const float beta = gate_beta(__bfloat162float(bg[gi]));
    const float alpha = __expf(gate_log_decay(__bfloat162float(a[gi]), bias, neg_A));
    const __nv_bfloat16* vr = row + 2 * key_dim + h * 128 + 4 * lane;
    const float4 v = make_float4(__bfloat162float(vr[0]), __bfloat162float(vr[1]),
                                 __bfloat162float(vr[2]), __bfloat162float(vr[3]));
    __syncthreads();  // qs / ks written
    float4 m = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < kFastRows; ++r)
      if (r < rows) {
        const float kv = ks[warp + kFastWarps * r];
        st[r].x *= alpha;
        st[r].y *= alpha;
        st[r].z *= alpha;
        st[r].w *= alpha;
        m.x = fmaf(st[r].x, kv, m.x);
        m.y = fmaf(st[r].y, kv, m.y);
        m.z = fmaf(st[r].z, kv, m.z);
        m.w = fmaf(st[r].w, kv, m.w);
      }
    red[warp][lane] = m;
    __syncthreads();
    m = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kFastWarps; ++w) {
      const float4 p = red[w][lane];
      m.x += p.x;
      m.y += p.y;
      m.z += p.z;
      m.w += p.w;
    }
    const float4 d =
        make_float4(beta * (v.x - m.x), beta * (v.y - m.y), beta * (v.z - m.z), beta * (v.w - m.w));
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < kFastRows; ++r)
      if (r < rows) {
        const int i = warp + kFastWarps * r;
        const float kv = ks[i], qv = qs[i];
        st[r].x = fmaf(kv, d.x, st[r].x);
        st[r].y = fmaf(kv, d.y, st[r].y);
        st[r].z = fmaf(kv, d.z, st[r].z);
        st[r].w = fmaf(kv, d.w, st[r].w);
        o.x = fmaf(st[r].x, qv, o.x);
        o.y = fmaf(st[r].y, qv, o.y);
        o.z = fmaf(st[r].z, qv, o.z);
        o.w = fmaf(st[r].w, qv, o.w);
      }
    __syncthreads();  // every warp has read red (m)
    red[warp][lane] = o;
    __syncthreads();
    if (warp == 0) {
      o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kFastWarps; ++w) {
        const float4 p = red[w][lane];
        o.x += p.x;
        o.y += p.y;
        o.z += p.z;
        o.w += p.w;
      }
      __nv_bfloat16* op = out + gi * 128 + 4 * lane;
      op[0] = __float2bfloat16(o.x);
      op[1] = __float2bfloat16(o.y);
      op[2] = __float2bfloat16(o.z);
      op[3] = __float2bfloat16(o.w);
    }
    __syncthreads();  // red, qs, ks are rewritten for the next token
  }
#pragma unroll
  for (int r = 0; r < kFastRows; ++r)
    if (r < rows) Io::store4(S + ((warp + kFastWarps * r) * 32 + lane) * 4, st[r]);
}

template <class StateT>
void launch_recurrent(const BatchMeta& b, const __nv_bfloat16* y, const __nv_bfloat16* a,
                      const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                      StateT* state, const GdnShape& s, __nv_bfloat16* out, cudaStream_t stream) {
  if (s.dv == 128 && s.dk % kFastWarps == 0 && s.dk <= 256 && b.num_tokens == b.num_seqs)
    delta_rule_dv128_kernel<StateT><<<dim3(b.num_seqs, s.nv), kFastThreads, 0, stream>>>(
        b, y, a, bgate, A_log, dt_bias, state, s, out);
  else
    delta_rule_kernel<StateT><<<dim3(b.num_seqs, s.nv, (s.dv + 31) / 32), kThreads, 0, stream>>>(
        b, y, a, bgate, A_log, dt_bias, state, s, out);
}

}  // namespace

void launch_gated_delta_rule(const BatchMeta& b, const __nv_bfloat16* y, const __nv_bfloat16* a,
                             const __nv_bfloat16* bgate, const float* A_log, const float* dt_bias,
                             GdnState state, const GdnShape& s, float* ws, int num_sms,
                             __nv_bfloat16* out, cudaStream_t stream) {
  if (b.num_seqs == 0) return;
  if (ws != nullptr && b.num_tokens > b.num_seqs && gdn_chunked_supported(s)) {
    // No conv-state update: nothing but kernel launches, whose errors cudaGetLastError reports.
    (void)launch_gdn_chunked(b, GdnQkvSource{y, nullptr, nullptr, nullptr}, a, bgate, A_log,
                             dt_bias, state, s, GatedNorm{}, ws, num_sms, out, stream);
    return;
  }
  if (state.bf16)
    launch_recurrent(b, y, a, bgate, A_log, dt_bias, static_cast<__nv_bfloat16*>(state.data), s,
                     out, stream);
  else
    launch_recurrent(b, y, a, bgate, A_log, dt_bias, static_cast<float*>(state.data), s, out,
                     stream);
}

}  // namespace deltaserve::cuda
