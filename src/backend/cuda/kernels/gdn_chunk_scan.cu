// Kernel 2 of the chunked delta rule, the state pass: block (sequence, value head, 32-column slice
// of the state), walking the sequence's chunks in order with the f32 state slice in registers (warp
// w holds rows 16w..16w+15). The next chunk's operands stream into shared memory (cp.async) while
// the current one computes; every product is a bf16 mma.sync with f32 accumulation. Per chunk:
//   V' = U - W S (S as bf16 in shared memory), written back over U for the output kernel;
//   S <- e^gam_last S + kd^T V'.
// Before every chunk but the last, S goes to the workspace (bf16) for gdn_chunk_out.cu, which forms
// those chunks' outputs in parallel; the last chunk's output, O = e^gam (q S) + P V', is formed
// here (its q and P load into the stage the next chunk would have used).
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256, kSlice = 32, kLdS = kSlice + 8;

struct Stage {
  bf16 w[kChunk][kLd];   // W; for the last chunk, the other stage holds its q here
  bf16 kd[kChunk][kLd];  // k e^(gam_last - gam); for the last chunk, the other stage its P
  bf16 u[kChunk][kLdS];  // U, this block's columns
  float gam[kChunk];
};

struct ScanSmem {
  Stage st[2];
  bf16 s[kDim][kLdS];    // the state slice before the chunk (bf16): B of W S and q S
  bf16 v[kChunk][kLdS];  // V' (bf16): B of P V' and of the state update
};

struct Seq {
  int base, len, h, kh, col0, T;
};

__device__ size_t row_of(const Seq& q, int t0, int r, int n) {
  return static_cast<size_t>(q.base + t0 + min(r, n - 1));
}

// Chunk `c`'s W, kd, U (this block's columns) and gam into `st` (rows past the sequence zero).
__device__ void load_chunk(Stage& st, const Seq& q, int c, const Workspace& ws, const GdnShape& s) {
  const int t0 = c * kChunk, n = min(kChunk, q.len - t0);
  for (int e = threadIdx.x; e < 2 * kChunk * 16; e += kThreads) {
    const int which = e / (kChunk * 16), r = (e / 16) % kChunk, c16 = e % 16;
    const size_t at = (row_of(q, t0, r, n) * s.nv + q.h) * kDim + 8 * c16;
    mma::cp_async16((which == 0 ? st.w[r] : st.kd[r]) + 8 * c16, (which == 0 ? ws.w : ws.kd) + at,
                    r < n);
  }
  for (int e = threadIdx.x; e < kChunk * (kSlice / 8); e += kThreads) {
    const int r = e / (kSlice / 8), c8 = e % (kSlice / 8);
    const bf16* src = ws.u + (row_of(q, t0, r, n) * s.nv + q.h) * kDim + q.col0 + 8 * c8;
    mma::cp_async16(st.u[r] + 8 * c8, src, r < n);
  }
  if (threadIdx.x < kChunk) {
    const int r = threadIdx.x;
    mma::cp_async4(&st.gam[r], ws.gam + static_cast<size_t>(q.h) * q.T + row_of(q, t0, r, n),
                   r < n);
  }
}

// The last chunk's q (into st.w) and P (into st.kd's first 64 columns).
__device__ void load_q_p(Stage& st, const Seq& q, int c, const Workspace& ws, const GdnShape& s) {
  const int t0 = c * kChunk, n = min(kChunk, q.len - t0);
  for (int e = threadIdx.x; e < kChunk * 24; e += kThreads) {
    const int r = e / 24, c8 = e % 24;
    const size_t row = row_of(q, t0, r, n);
    if (c8 < 16)
      mma::cp_async16(st.w[r] + 8 * c8, ws.q + (row * s.nk + q.kh) * kDim + 8 * c8, r < n);
    else
      mma::cp_async16(st.kd[r] + 8 * (c8 - 16), ws.p + (row * s.nv + q.h) * kChunk + 8 * (c8 - 16),
                      r < n);
  }
}

// The state slice (rows 16w.., this block's columns) as bf16 into shared memory.
__device__ void publish_state(ScanSmem& sm, const float (&hs)[4][4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  for (int nt = 0; nt < 4; ++nt)
    for (int hf = 0; hf < 2; ++hf)
      *reinterpret_cast<__nv_bfloat162*>(&sm.s[16 * warp + g + 8 * hf][8 * nt + 2 * c]) =
          __floats2bfloat162_rn(hs[nt][2 * hf], hs[nt][2 * hf + 1]);
}

// The state slice as bf16 into the chunk-start state `H` [dk][dv] of the workspace.
__device__ void store_chunk_state(bf16* H, const Seq& q, const float (&hs)[4][4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  for (int nt = 0; nt < 4; ++nt)
    for (int hf = 0; hf < 2; ++hf)
      *reinterpret_cast<__nv_bfloat162*>(H + (16 * warp + g + 8 * hf) * kDim + q.col0 + 8 * nt +
                                         2 * c) =
          __floats2bfloat162_rn(hs[nt][2 * hf], hs[nt][2 * hf + 1]);
}

// The f32 state slice to / from a slot's [dk][dv] state.
template <bool kStore>
__device__ void state_io(float* S, const Seq& q, float (&hs)[4][4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  for (int nt = 0; nt < 4; ++nt)
    for (int hf = 0; hf < 2; ++hf) {
      float2* p =
          reinterpret_cast<float2*>(S + (16 * warp + g + 8 * hf) * kDim + q.col0 + 8 * nt + 2 * c);
      if constexpr (kStore) {
        *p = make_float2(hs[nt][2 * hf], hs[nt][2 * hf + 1]);
      } else {
        const float2 v = *p;
        hs[nt][2 * hf] = v.x;
        hs[nt][2 * hf + 1] = v.y;
      }
    }
}

// acc[0..1] += A[16m.., 0..K) . S[0..K, 16 half..] for warp (row tile m, column half).
template <int K>
__device__ void times_state_half(const bf16* A, int lda, const bf16 (*B)[kLdS],
                                 float (&acc)[2][4]) {
  const int warp = threadIdx.x / 32, m = warp % 4, half = warp / 4;
  for (int ks = 0; ks < K / 16; ++ks) {
    uint32_t a[4], b[4];
    mma::load_a(a, A + 16 * m * lda + 16 * ks, lda);
    mma::load_b(b, B[16 * ks] + 16 * half, kLdS);
    mma::mma(acc[0], a, b[0], b[1]);
    mma::mma(acc[1], a, b[2], b[3]);
  }
}

// V' = U - W S into sm.v, and over U in the workspace (rows below n).
__device__ void form_v(ScanSmem& sm, const Stage& st, const Seq& q, int t0, int n,
                       const GdnShape& s, const Workspace& ws) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int m = warp % 4, half = warp / 4;
  float v[2][4] = {};
  times_state_half<kDim>(st.w[0], kLd, sm.s, v);
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * m + g + 8 * hf;
    for (int nt = 0; nt < 2; ++nt) {
      const int col = 16 * half + 8 * nt + 2 * c;
      const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&st.u[i][col]));
      const __nv_bfloat162 vp = __floats2bfloat162_rn(u.x - v[nt][2 * hf], u.y - v[nt][2 * hf + 1]);
      *reinterpret_cast<__nv_bfloat162*>(&sm.v[i][col]) = vp;
      if (i < n)
        *reinterpret_cast<__nv_bfloat162*>(
            ws.u + (static_cast<size_t>(q.base + t0 + i) * s.nv + q.h) * kDim + q.col0 + col) = vp;
    }
  }
}

// The last chunk's output: O = e^gam (q S) (before the barrier), then O += P V' to `out`.
__device__ void output_q_part(const ScanSmem& sm, const Stage& st, const Stage& qp,
                              float (&o)[2][4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, m = warp % 4;
  times_state_half<kDim>(qp.w[0], kLd, sm.s, o);
  for (int hf = 0; hf < 2; ++hf) {
    const float eg = __expf(st.gam[16 * m + g + 8 * hf]);
    for (int nt = 0; nt < 2; ++nt) {
      o[nt][2 * hf] *= eg;
      o[nt][2 * hf + 1] *= eg;
    }
  }
}

__device__ void output_v_part(const ScanSmem& sm, const Stage& qp, float (&o)[2][4], const Seq& q,
                              int t0, int n, const GdnShape& s, bf16* out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int m = warp % 4, half = warp / 4;
  times_state_half<kChunk>(qp.kd[0], kLd, sm.v, o);
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * m + g + 8 * hf;
    if (i >= n) continue;
    bf16* row =
        out + (static_cast<size_t>(q.base + t0 + i) * s.nv + q.h) * kDim + q.col0 + 16 * half;
    for (int nt = 0; nt < 2; ++nt)
      *reinterpret_cast<__nv_bfloat162*>(row + 8 * nt + 2 * c) =
          __floats2bfloat162_rn(o[nt][2 * hf], o[nt][2 * hf + 1]);
  }
}

// S <- e^gam_last S + kd^T V' (warp w: rows 16w.. of the slice).
__device__ void update_state(const ScanSmem& sm, const Stage& st, float (&hs)[4][4], int n) {
  const int warp = threadIdx.x / 32;
  const float decay = __expf(st.gam[n - 1]);
  for (int nt = 0; nt < 4; ++nt)
    for (int e = 0; e < 4; ++e) hs[nt][e] *= decay;
  for (int ks = 0; ks < kChunk / 16; ++ks) {
    uint32_t ak[4];
    mma::load_a_trans(ak, st.kd[16 * ks] + 16 * warp, kLd);
    for (int np = 0; np < 2; ++np) {
      uint32_t bv[4];
      mma::load_b(bv, sm.v[16 * ks] + 16 * np, kLdS);
      mma::mma(hs[2 * np], ak, bv[0], bv[1]);
      mma::mma(hs[2 * np + 1], ak, bv[2], bv[3]);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 2)
    scan_kernel(BatchMeta b, Workspace ws, float* __restrict__ state, GdnShape s,
                bf16* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char scan_raw[];
  ScanSmem& sm = *reinterpret_cast<ScanSmem*>(scan_raw);
  const int seq = blockIdx.x, h = blockIdx.y;
  const Seq q{
      b.seq_begin[seq], b.seq_len[seq], h, h / (s.nv / s.nk), static_cast<int>(blockIdx.z) * kSlice,
      b.num_tokens};
  const size_t head = static_cast<size_t>(kDim) * kDim;
  float* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * head;
  float hs[4][4] = {};
  if (b.seq_start[seq] != 0) state_io<false>(S, q, hs);
  publish_state(sm, hs);
  const int chunks = (q.len + kChunk - 1) / kChunk, last = chunks - 1;
  load_chunk(sm.st[0], q, 0, ws, s);
  mma::cp_async_commit();
  for (int c = 0; c < chunks; ++c) {
    Stage& other = sm.st[(c + 1) % 2];
    if (c < last)
      load_chunk(other, q, c + 1, ws, s);
    else
      load_q_p(other, q, c, ws, s);
    mma::cp_async_commit();
    if (c < last)
      mma::cp_async_wait<1>();
    else
      mma::cp_async_wait<0>();
    __syncthreads();  // chunk c staged (and the last chunk's q / P), the state published
    const Stage& st = sm.st[c % 2];
    const int t0 = c * kChunk, n = min(kChunk, q.len - t0);
    if (c < last)  // the chunk-start state of a full chunk, for gdn_chunk_out.cu
      store_chunk_state(ws.h + static_cast<size_t>(q.base + t0) * s.nv * head / kChunk + h * head,
                        q, hs);
    form_v(sm, st, q, t0, n, s, ws);
    float o[2][4] = {};
    if (c == last) output_q_part(sm, st, other, o);
    __syncthreads();  // V' complete; every read of sm.s done
    if (c == last) output_v_part(sm, other, o, q, t0, n, s, out);
    update_state(sm, st, hs, n);
    publish_state(sm, hs);
    if (t0 + n == b.seq_snap_at[seq])  // the in-step snapshot: the state after this chunk
      state_io<true>(state + (static_cast<size_t>(b.seq_snap_slot[seq]) * s.nv + h) * head, q, hs);
    __syncthreads();  // the stage may be refilled, sm.v rewritten
  }
  state_io<true>(S, q, hs);
}

}  // namespace

void launch_scan(const BatchMeta& b, const Workspace& ws, float* state, const GdnShape& s,
                 bf16* out, cudaStream_t stream) {
  constexpr int smem = sizeof(ScanSmem);
  cudaFuncSetAttribute(scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  scan_kernel<<<dim3(b.num_seqs, s.nv, kDim / kSlice), kThreads, smem, stream>>>(b, ws, state, s,
                                                                                 out);
}

}  // namespace deltaserve::cuda::gdn_chunk
