// Kernel 2 of the chunked delta rule: block (sequence, value head, 64-column slice of the state),
// walking the sequence's chunks in order with the f32 state slice in registers (warp w holds rows
// 16w..16w+15). The next chunk's operands stream into shared memory (cp.async) while the current
// one computes; every product is a bf16 mma.sync with f32 accumulation. Per chunk:
//   phase A: V' = U - W S and O = e^gam (q S)            (S as bf16 in shared memory)
//   phase B: O += P V' (to `out`);  S <- e^gam_last S + kd^T V'
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256, kSlice = 64;

struct Stage {
  bf16 w[kChunk][kLd], q[kChunk][kLd], kd[kChunk][kLd];
  bf16 p[kChunk][kLdC], u[kChunk][kLdC];  // u: this block's 64 columns
  float gam[kChunk];
};

struct ScanSmem {
  Stage st[2];
  bf16 s[kDim][kLdC];    // the state slice before the chunk (bf16): B of W S and q S
  bf16 v[kChunk][kLdC];  // V' (bf16): B of P V' and of the state update
};

struct Seq {
  int base, len, h, kh, col0, T;
};

// Chunk `c`'s operands into `st` (rows past the sequence zero), as one cp.async group.
__device__ void load_chunk(Stage& st, const Seq& q, int c, const Workspace& ws, const GdnShape& s) {
  const int t0 = c * kChunk, n = min(kChunk, q.len - t0);
  for (int e = threadIdx.x; e < 3 * kChunk * 16; e += kThreads) {
    const int which = e / (kChunk * 16), r = (e / 16) % kChunk, c16 = e % 16;
    const size_t tok = static_cast<size_t>(q.base + t0 + min(r, n - 1));
    const bf16* src = which == 0   ? ws.w + (tok * s.nv + q.h) * kDim
                      : which == 1 ? ws.q + (tok * s.nk + q.kh) * kDim
                                   : ws.kd + (tok * s.nv + q.h) * kDim;
    bf16* dst = which == 0 ? st.w[r] : which == 1 ? st.q[r] : st.kd[r];
    mma::cp_async16(dst + 8 * c16, src + 8 * c16, r < n);
  }
  for (int e = threadIdx.x; e < 2 * kChunk * 8; e += kThreads) {
    const int which = e / (kChunk * 8), r = (e / 8) % kChunk, c8 = e % 8;
    const size_t tok = static_cast<size_t>(q.base + t0 + min(r, n - 1));
    const bf16* src =
        which == 0 ? ws.p + (tok * s.nv + q.h) * kChunk : ws.u + (tok * s.nv + q.h) * kDim + q.col0;
    mma::cp_async16((which == 0 ? st.p[r] : st.u[r]) + 8 * c8, src + 8 * c8, r < n);
  }
  if (threadIdx.x < kChunk) {
    const int r = threadIdx.x;
    mma::cp_async4(&st.gam[r],
                   ws.gam + static_cast<size_t>(q.h) * q.T + q.base + t0 + min(r, n - 1), r < n);
  }
  mma::cp_async_commit();
}

// The state slice (rows 16w.., this block's columns) as bf16 into shared memory.
__device__ void publish_state(ScanSmem& sm, const float (&hs)[8][4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  for (int nt = 0; nt < 8; ++nt)
    for (int hf = 0; hf < 2; ++hf)
      *reinterpret_cast<__nv_bfloat162*>(&sm.s[16 * warp + g + 8 * hf][8 * nt + 2 * c]) =
          __floats2bfloat162_rn(hs[nt][2 * hf], hs[nt][2 * hf + 1]);
}

// The f32 state slice to / from a slot's [dk][dv] state.
template <bool kStore>
__device__ void state_io(float* S, const Seq& q, float (&hs)[8][4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  for (int nt = 0; nt < 8; ++nt)
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

// Phase A for warp (row tile m, column half): V' = U - W S into sm.v; returns e^gam (q S) in o.
__device__ void phase_a(ScanSmem& sm, const Stage& st, float (&o)[4][4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int m = warp % 4, half = warp / 4;
  float v[4][4] = {};
  for (int nt = 0; nt < 4; ++nt)
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
  for (int ks = 0; ks < kDim / 16; ++ks) {
    uint32_t aw[4], aq[4];
    mma::load_a(aw, st.w[16 * m] + 16 * ks, kLd);
    mma::load_a(aq, st.q[16 * m] + 16 * ks, kLd);
    for (int np = 0; np < 2; ++np) {
      uint32_t bs[4];
      mma::load_b(bs, sm.s[16 * ks] + 32 * half + 16 * np, kLdC);
      mma::mma(v[2 * np], aw, bs[0], bs[1]);
      mma::mma(v[2 * np + 1], aw, bs[2], bs[3]);
      mma::mma(o[2 * np], aq, bs[0], bs[1]);
      mma::mma(o[2 * np + 1], aq, bs[2], bs[3]);
    }
  }
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * m + g + 8 * hf;
    const float eg = __expf(st.gam[i]);
    for (int nt = 0; nt < 4; ++nt) {
      const int col = 32 * half + 8 * nt + 2 * c;
      const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&st.u[i][col]));
      *reinterpret_cast<__nv_bfloat162*>(&sm.v[i][col]) =
          __floats2bfloat162_rn(u.x - v[nt][2 * hf], u.y - v[nt][2 * hf + 1]);
      o[nt][2 * hf] *= eg;
      o[nt][2 * hf + 1] *= eg;
    }
  }
}

// Phase B, the output part: o += P V', rows below n to `out`.
__device__ void phase_b_out(const ScanSmem& sm, const Stage& st, float (&o)[4][4], const Seq& q,
                            int t0, int n, const GdnShape& s, bf16* out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int m = warp % 4, half = warp / 4;
  for (int ks = 0; ks < kChunk / 16; ++ks) {
    uint32_t ap[4];
    mma::load_a(ap, st.p[16 * m] + 16 * ks, kLdC);
    for (int np = 0; np < 2; ++np) {
      uint32_t bv[4];
      mma::load_b(bv, sm.v[16 * ks] + 32 * half + 16 * np, kLdC);
      mma::mma(o[2 * np], ap, bv[0], bv[1]);
      mma::mma(o[2 * np + 1], ap, bv[2], bv[3]);
    }
  }
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * m + g + 8 * hf;
    if (i >= n) continue;
    bf16* row =
        out + (static_cast<size_t>(q.base + t0 + i) * s.nv + q.h) * kDim + q.col0 + 32 * half;
    for (int nt = 0; nt < 4; ++nt)
      *reinterpret_cast<__nv_bfloat162*>(row + 8 * nt + 2 * c) =
          __floats2bfloat162_rn(o[nt][2 * hf], o[nt][2 * hf + 1]);
  }
}

// Phase B, the state part: S <- e^gam_last S + kd^T V' (warp w: rows 16w.. of the slice).
__device__ void phase_b_state(const ScanSmem& sm, const Stage& st, float (&hs)[8][4], int n) {
  const int warp = threadIdx.x / 32;
  const float decay = __expf(st.gam[n - 1]);
  for (int nt = 0; nt < 8; ++nt)
    for (int e = 0; e < 4; ++e) hs[nt][e] *= decay;
  for (int ks = 0; ks < kChunk / 16; ++ks) {
    uint32_t ak[4];
    mma::load_a_trans(ak, st.kd[16 * ks] + 16 * warp, kLd);
    for (int np = 0; np < 4; ++np) {
      uint32_t bv[4];
      mma::load_b(bv, sm.v[16 * ks] + 16 * np, kLdC);
      mma::mma(hs[2 * np], ak, bv[0], bv[1]);
      mma::mma(hs[2 * np + 1], ak, bv[2], bv[3]);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
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
  float hs[8][4] = {};
  if (b.seq_start[seq] != 0) state_io<false>(S, q, hs);
  publish_state(sm, hs);
  const int chunks = (q.len + kChunk - 1) / kChunk;
  load_chunk(sm.st[0], q, 0, ws, s);
  for (int c = 0; c < chunks; ++c) {
    if (c + 1 < chunks)
      load_chunk(sm.st[(c + 1) % 2], q, c + 1, ws, s);
    else
      mma::cp_async_commit();
    mma::cp_async_wait<1>();
    __syncthreads();  // chunk c staged, the state published
    const Stage& st = sm.st[c % 2];
    const int t0 = c * kChunk, n = min(kChunk, q.len - t0);
    float o[4][4];
    phase_a(sm, st, o);
    __syncthreads();  // V' complete; every read of sm.s done
    phase_b_out(sm, st, o, q, t0, n, s, out);
    phase_b_state(sm, st, hs, n);
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
