// Kernel 2 of the chunked delta rule for steps of many sequences, the state pass that forms every
// output: block (sequence, value head, 64-column slice of the state), walking the sequence's
// chunks in order with the f32 state slice in registers (warp w holds rows 16w..16w+15). The next
// chunk's operands, q and P stream into shared memory (cp.async) while the current one computes;
// every product is a bf16 mma.sync with f32 accumulation. Per chunk:
//   V' = U - W S (S as bf16 in shared memory);
//   O = e^gam (q S) + P V' to the output;
//   S <- e^gam_last S + kd^T V'.
// Steps of few sequences take gdn_chunk_pass.cu and gdn_chunk_out.cu instead.
#include "backend/cuda/kernels/gdn_chunk_layout.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"

namespace deltaserve::cuda::gdn_chunk {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

struct Seq {
  int base, len, h, kh, col0, T;
};

// The state pass over slices of kSlice columns. Warp (row tile m = w % 4, column half w / 4) owns
// 16 x kSlice / 2 of V' and O.
struct Scan {
  static constexpr int kSlice = 64;
  static constexpr int kStages = 2;               // chunks staged: the next one in flight
  static constexpr int kLdS = kSlice + 8;         // rows of the slice (bf16), padded
  static constexpr int kTiles = kSlice / 8;       // 8-column tiles of a warp's state rows
  static constexpr int kHalfTiles = kSlice / 16;  // 8-column tiles of a warp's V' / O rows
  using State = float[kTiles][4];
  using Half = float[kHalfTiles][4];

  struct Stage {
    bf16 w[kChunk][kLd];   // W
    bf16 kd[kChunk][kLd];  // k e^(gam_last - gam)
    bf16 u[kChunk][kLdS];  // U, this block's columns
    float gam[kChunk];
  };
  struct QP {  // each chunk's q and P, double-buffered beside the stages
    bf16 q[kChunk][kLd], p[kChunk][kLd];
  };
  struct Smem {
    Stage st[kStages];
    bf16 s[kDim][kLdS];    // the state slice before the chunk (bf16): B of W S and q S
    bf16 v[kChunk][kLdS];  // V' (bf16): B of P V' and of the state update
    QP qp[kStages];
  };

  // Chunk `c`'s W, kd, U (this block's columns) and gam into `st` (rows past the sequence zero). A
  // thread copies fixed pieces (rows tid / 16 + 16 i of W and kd, rows tid / kTiles + 256 / kTiles
  // j of U), each address one multiply-add from the chunk's first row: the state pass is
  // instruction-bound, and index math was most of its instructions.
  __device__ static void load_chunk(Stage& st, const Seq& q, int c, const Workspace& ws,
                                    const GdnShape& s) {
    const int t0 = c * kChunk, n = min(kChunk, q.len - t0), first = q.base + t0;
    const int tid = threadIdx.x, row_elems = s.nv * kDim, head = q.h * kDim;
#pragma unroll
    for (int i = 0; i < kChunk / 16; ++i) {
      const int r = tid / 16 + 16 * i, col = 8 * (tid % 16);
      const size_t at = static_cast<size_t>(first + (r < n ? r : 0)) * row_elems + head + col;
      mma::cp_async16(st.w[r] + col, ws.w + at, r < n);
      mma::cp_async16(st.kd[r] + col, ws.kd + at, r < n);
    }
    constexpr int kRowsPerPass = kThreads / kTiles;
#pragma unroll
    for (int j = 0; j < kChunk / kRowsPerPass; ++j) {
      const int r = tid / kTiles + kRowsPerPass * j, col = 8 * (tid % kTiles);
      const size_t at =
          static_cast<size_t>(first + (r < n ? r : 0)) * row_elems + head + q.col0 + col;
      mma::cp_async16(st.u[r] + col, ws.u + at, r < n);
    }
    if (tid < kChunk)
      mma::cp_async4(&st.gam[tid],
                     ws.gam + static_cast<size_t>(q.h) * q.T + first + (tid < n ? tid : 0),
                     tid < n);
  }

  // Chunk c's q (into qd) and P (into pd's first 64 columns), pieces as load_chunk's.
  __device__ static void load_q_p(bf16 (*qd)[kLd], bf16 (*pd)[kLd], const Seq& q, int c,
                                  const Workspace& ws, const GdnShape& s) {
    const int t0 = c * kChunk, n = min(kChunk, q.len - t0), first = q.base + t0;
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < kChunk / 16; ++i) {
      const int r = tid / 16 + 16 * i, col = 8 * (tid % 16);
      const size_t at = static_cast<size_t>(first + (r < n ? r : 0)) * s.nk * kDim + q.kh * kDim;
      mma::cp_async16(qd[r] + col, ws.q + at + col, r < n);
    }
#pragma unroll
    for (int j = 0; j < kChunk / 32; ++j) {
      const int r = tid / 8 + 32 * j, col = 8 * (tid % 8);
      const size_t at = static_cast<size_t>(first + (r < n ? r : 0)) * s.nv * kChunk + q.h * kChunk;
      mma::cp_async16(pd[r] + col, ws.p + at + col, r < n);
    }
  }

  // hs (rows 16w.., this block's columns) as bf16 pairs: f(row, column in the slice, pair).
  template <class F>
  __device__ static void each_pair(const State& hs, F f) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    for (int nt = 0; nt < kTiles; ++nt)
      for (int hf = 0; hf < 2; ++hf)
        f(16 * warp + g + 8 * hf, 8 * nt + 2 * c,
          __floats2bfloat162_rn(hs[nt][2 * hf], hs[nt][2 * hf + 1]));
  }

  // The state slice as bf16 into shared memory.
  __device__ static void publish_state(Smem& sm, const State& hs) {
    each_pair(hs, [&](int r, int col, __nv_bfloat162 v) {
      *reinterpret_cast<__nv_bfloat162*>(&sm.s[r][col]) = v;
    });
  }

  // The f32 state slice to / from a slot's [dk][dv] state (f32 or bf16 in memory).
  template <bool kStore, class StateT>
  __device__ static void state_io(StateT* S, const Seq& q, State& hs) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    for (int nt = 0; nt < kTiles; ++nt)
      for (int hf = 0; hf < 2; ++hf) {
        StateT* p = S + (16 * warp + g + 8 * hf) * kDim + q.col0 + 8 * nt + 2 * c;
        if constexpr (kStore) {
          StateIo<StateT>::store2(p, make_float2(hs[nt][2 * hf], hs[nt][2 * hf + 1]));
        } else {
          const float2 v = StateIo<StateT>::load2(p);
          hs[nt][2 * hf] = v.x;
          hs[nt][2 * hf + 1] = v.y;
        }
      }
  }

  // acc += A[16m.., 0..K) . B[0..K, (kSlice / 2) half..) for warp (row tile m, column half).
  template <int K>
  __device__ static void times_half(const bf16* A, int lda, const bf16 (*B)[kLdS], Half& acc) {
    const int warp = threadIdx.x / 32, m = warp % 4, half = warp / 4;
    for (int ks = 0; ks < K / 16; ++ks) {
      uint32_t a[4];
      mma::load_a(a, A + 16 * m * lda + 16 * ks, lda);
      for (int np = 0; np < kHalfTiles / 2; ++np) {
        uint32_t b[4];
        mma::load_b(b, B[16 * ks] + (kSlice / 2) * half + 16 * np, kLdS);
        mma::mma(acc[2 * np], a, b[0], b[1]);
        mma::mma(acc[2 * np + 1], a, b[2], b[3]);
      }
    }
  }

  // V' = U - W S into sm.v.
  __device__ static void form_v(Smem& sm, const Stage& st) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    const int m = warp % 4, half = warp / 4;
    Half v = {};
    times_half<kDim>(st.w[0], kLd, sm.s, v);
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * m + g + 8 * hf, col0 = (kSlice / 2) * half + 2 * c;
      for (int nt = 0; nt < kHalfTiles; ++nt) {
        const int col = col0 + 8 * nt;
        const float2 u =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&st.u[i][col]));
        *reinterpret_cast<__nv_bfloat162*>(&sm.v[i][col]) =
            __floats2bfloat162_rn(u.x - v[nt][2 * hf], u.y - v[nt][2 * hf + 1]);
      }
    }
  }

  // A chunk's output: O = e^gam (q S) (before the barrier), then O += P V' to `out`.
  __device__ static void output_q_part(const Smem& sm, const Stage& st, const bf16* qs, Half& o) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, m = warp % 4;
    times_half<kDim>(qs, kLd, sm.s, o);
    for (int hf = 0; hf < 2; ++hf) {
      const float eg = __expf(st.gam[16 * m + g + 8 * hf]);
      for (int nt = 0; nt < kHalfTiles; ++nt) {
        o[nt][2 * hf] *= eg;
        o[nt][2 * hf + 1] *= eg;
      }
    }
  }

  __device__ static void output_v_part(const Smem& sm, const bf16* ps, Half& o, const Seq& q,
                                       int t0, int n, const GdnShape& s, bf16* out) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    const int m = warp % 4, half = warp / 4;
    times_half<kChunk>(ps, kLd, sm.v, o);
    for (int hf = 0; hf < 2; ++hf) {
      const int i = 16 * m + g + 8 * hf;
      if (i >= n) continue;
      bf16* row = out + (static_cast<size_t>(q.base + t0 + i) * s.nv + q.h) * kDim + q.col0 +
                  (kSlice / 2) * half;
      for (int nt = 0; nt < kHalfTiles; ++nt)
        *reinterpret_cast<__nv_bfloat162*>(row + 8 * nt + 2 * c) =
            __floats2bfloat162_rn(o[nt][2 * hf], o[nt][2 * hf + 1]);
    }
  }

  // S <- e^gam_last S + kd^T V' (warp w: rows 16w.. of the slice).
  __device__ static void update_state(const Smem& sm, const Stage& st, State& hs, int n) {
    const int warp = threadIdx.x / 32;
    const float decay = __expf(st.gam[n - 1]);
    for (int nt = 0; nt < kTiles; ++nt)
      for (int e = 0; e < 4; ++e) hs[nt][e] *= decay;
    for (int ks = 0; ks < kChunk / 16; ++ks) {
      uint32_t ak[4];
      mma::load_a_trans(ak, st.kd[16 * ks] + 16 * warp, kLd);
      for (int np = 0; np < kTiles / 2; ++np) {
        uint32_t bv[4];
        mma::load_b(bv, sm.v[16 * ks] + 16 * np, kLdS);
        mma::mma(hs[2 * np], ak, bv[0], bv[1]);
        mma::mma(hs[2 * np + 1], ak, bv[2], bv[3]);
      }
    }
  }

  template <class StateT>
  __device__ static void run(Smem& sm, const BatchMeta& b, const Workspace& ws, StateT* state,
                             const GdnShape& s, bf16* out) {
    const int seq = blockIdx.x, h = blockIdx.y;
    const Seq q{b.seq_begin[seq],
                b.seq_len[seq],
                h,
                h / (s.nv / s.nk),
                static_cast<int>(blockIdx.z) * kSlice,
                b.num_tokens};
    const size_t head = static_cast<size_t>(kDim) * kDim;
    StateT* S = state + (static_cast<size_t>(b.seq_slot[seq]) * s.nv + h) * head;
    State hs = {};
    if (b.seq_start[seq] != 0) state_io<false>(S, q, hs);
    publish_state(sm, hs);
    const int chunks = (q.len + kChunk - 1) / kChunk, snap_at = b.seq_snap_at[seq];
    // One cp.async group per chunk (empty past the last): chunk c's is complete when at most
    // kStages - 1 later ones are pending.
    auto stage_chunk = [&](int c) {
      if (c < chunks) {
        load_chunk(sm.st[c % kStages], q, c, ws, s);
        load_q_p(sm.qp[c % kStages].q, sm.qp[c % kStages].p, q, c, ws, s);
      }
      mma::cp_async_commit();
    };
    for (int c = 0; c + 1 < kStages; ++c) stage_chunk(c);
    for (int c = 0; c < chunks; ++c) {
      stage_chunk(c + kStages - 1);  // into the stage chunk c - 1 used
      mma::cp_async_wait<kStages - 1>();
      __syncthreads();  // chunk c with its q / P staged, the state published
      const Stage& st = sm.st[c % kStages];
      const int t0 = c * kChunk, n = min(kChunk, q.len - t0);
      form_v(sm, st);
      Half o = {};
      output_q_part(sm, st, sm.qp[c % kStages].q[0], o);
      __syncthreads();  // V' complete; every read of sm.s done
      output_v_part(sm, sm.qp[c % kStages].p[0], o, q, t0, n, s, out);
      update_state(sm, st, hs, n);
      publish_state(sm, hs);
      if (t0 + n == snap_at)  // the in-step snapshot: the state after this chunk
        state_io<true>(state + (static_cast<size_t>(b.seq_snap_slot[seq]) * s.nv + h) * head, q,
                       hs);
      __syncthreads();  // the stage may be refilled, sm.v rewritten
    }
    state_io<true>(S, q, hs);
  }
};

template <class StateT>
__global__ void __launch_bounds__(kThreads, 1)
    scan_kernel(BatchMeta b, Workspace ws, StateT* __restrict__ state, GdnShape s,
                bf16* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char scan_raw[];
  Scan::run(*reinterpret_cast<Scan::Smem*>(scan_raw), b, ws, state, s, out);
}

template <class StateT>
void launch_typed(const BatchMeta& b, const Workspace& ws, StateT* state, const GdnShape& s,
                  bf16* out, cudaStream_t stream) {
  constexpr int smem = sizeof(Scan::Smem);
  cudaFuncSetAttribute(scan_kernel<StateT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  scan_kernel<StateT><<<dim3(b.num_seqs, s.nv, kDim / Scan::kSlice), kThreads, smem, stream>>>(
      b, ws, state, s, out);
}

}  // namespace

bool scan_forms_every_output(int num_seqs, const GdnShape& s, int sm_count) {
  return num_seqs * s.nv > kStatePassRoom ||
         num_seqs * s.nv * (kDim / Scan::kSlice) >= 2 * sm_count;
}

void launch_scan(const BatchMeta& b, const Workspace& ws, GdnState state, const GdnShape& s,
                 bf16* out, cudaStream_t stream) {
  if (state.bf16)
    launch_typed(b, ws, static_cast<bf16*>(state.data), s, out, stream);
  else
    launch_typed(b, ws, static_cast<float*>(state.data), s, out, stream);
}

}  // namespace deltaserve::cuda::gdn_chunk
