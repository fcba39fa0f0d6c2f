#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/kernels/sampling.cuh"

namespace deltaserve::cuda {
namespace {

constexpr int kThreads = 1024, kStatThreads = 256;
constexpr int kBins = 2048, kSub = 1024;
constexpr float kBinsPerUnit = 64.0f;  // bins cover (max - x) / T in [0, 32)

struct ValIdx {
  float v;
  int32_t i;
};
// Larger value first; ties: lower id.
__device__ inline bool before(const ValIdx& a, const ValIdx& b) {
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}
struct ArgBest {
  __device__ ValIdx operator()(const ValIdx& a, const ValIdx& b) const {
    return before(b, a) ? b : a;
  }
};
struct MaxInt {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct MaxSum {  // online softmax statistics
  float m, s;
};
struct MaxSumOp {
  __device__ MaxSum operator()(const MaxSum& a, const MaxSum& b) const {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.0f};
    return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
  }
};

// The logit of token i after the row's penalties, bans and biases; `bits` marks the row's tokens
// with an entry in `adj`, from token bit0 (a multiple of 32) on.
__device__ inline float penalized(const SampleRowParams& p, const SampleAdj* adj,
                                  const uint32_t* bits, int bit0, int i, float x) {
  if (!(bits[(i - bit0) >> 5] >> (i & 31) & 1u)) return x;
  int lo = 0, hi = p.adj_len - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (adj[mid].token < i)
      lo = mid + 1;
    else
      hi = mid;
  }
  const SampleAdj a = adj[lo];
  if (a.flags & kAdjBanned) return -INFINITY;
  if ((a.flags & kAdjInPrompt) || a.out_count > 0)
    x = x > 0.0f ? x / p.repetition : x * p.repetition;
  if (a.out_count > 0) x -= p.frequency * static_cast<float>(a.out_count) + p.presence;
  return x + a.bias;
}

// Bin search over a histogram in shared memory: the first bin at which the running count reaches
// `need` (counts) or the running mass reaches `need_mass` (when need < 0), with `base` count/mass
// already accumulated. Run by one thread.
__device__ inline int first_bin(const int* cnt, const float* mass, int n, int need, float need_mass,
                                int& cum_cnt, float& cum_mass) {
  for (int b = 0; b < n; ++b) {
    cum_cnt += cnt[b];
    cum_mass += mass[b];
    if (need >= 0 ? cum_cnt >= need : cum_mass >= need_mass) return b;
  }
  return n - 1;
}

// Marks the tokens of [i0, i0 + 32 * words) with an entry in adj (adj_len entries) in bits.
__device__ void mark_adjusted(uint32_t* bits, int words, int i0, const SampleAdj* adj,
                              int adj_len) {
  for (int w = threadIdx.x; w < words; w += blockDim.x) bits[w] = 0u;
  __syncthreads();
  for (int e = threadIdx.x; e < adj_len; e += blockDim.x) {
    const int t = adj[e].token - i0;
    if (t >= 0 && t < 32 * words) atomicOr(&bits[t >> 5], 1u << (t & 31));
  }
  __syncthreads();
}

// One thread's running statistics of a slice: the raw logits' max and sum of exp(x - max), and the
// best penalized logit (lowest id on ties: tokens are visited in increasing order).
struct SliceScan {
  MaxSum raw{-INFINITY, 0.0f};
  ValIdx best{-INFINITY, 0x7fffffff};
  __device__ void add(const SampleRowParams& p, const SampleAdj* adj, const uint32_t* bits, int i0,
                      int i, float x) {
    raw = MaxSumOp()(raw, MaxSum{x, 1.0f});
    const ValIdx c{penalized(p, adj, bits, i0, i, x), i};
    if (before(c, best)) best = c;
  }
  // Tokens i .. i + 7 (i - i0 a multiple of 8) from one 16-byte load: one exp a token, and the
  // raw argmax where none of them has an adjustment.
  __device__ void add8(const SampleRowParams& p, const SampleAdj* adj, const uint32_t* bits, int i0,
                       int i, uint4 packed) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&packed);
    float x[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]);
      x[2 * e] = f.x;
      x[2 * e + 1] = f.y;
    }
    float vmax = x[0];
#pragma unroll
    for (int e = 1; e < 8; ++e) vmax = fmaxf(vmax, x[e]);
    if (vmax > -INFINITY) {
      const float m = fmaxf(raw.m, vmax);
      float sum = raw.m == -INFINITY ? 0.0f : raw.s * __expf(raw.m - m);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += __expf(x[e] - m);
      raw = {m, sum};
    }
    if ((bits[(i - i0) >> 5] >> ((i - i0) & 31) & 0xffu) != 0u) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const ValIdx c{penalized(p, adj, bits, i0, i + e, x[e]), i + e};
        if (before(c, best)) best = c;
      }
      return;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (x[e] > best.v) best = {x[e], i + e};  // ids increase: a tie keeps the lower
  }
};

// Block (slice, row): over the row's tokens [slice * kSampleSlice, ...) the raw logits' max and
// sum of exp (for the logprobs) and the penalized argmax (greedy), many blocks a row. A row that
// starts 16-byte aligned is read eight tokens a load.
__global__ void __launch_bounds__(kStatThreads)
    row_stats_kernel(const __nv_bfloat16* __restrict__ logits, int64_t ld, int V,
                     const SampleRowParams* __restrict__ params,
                     const SampleAdj* __restrict__ adj_all, SampleRowStats* __restrict__ stats) {
  __shared__ uint32_t bits[kSampleSlice / 32];
  using ReduceMS = cub::BlockReduce<MaxSum, kStatThreads>;
  using Reduce = cub::BlockReduce<ValIdx, kStatThreads>;
  __shared__ union {
    typename ReduceMS::TempStorage ms;
    typename Reduce::TempStorage r;
  } tmp;
  const int row = blockIdx.y, i0 = blockIdx.x * kSampleSlice, i1 = min(V, i0 + kSampleSlice);
  const SampleRowParams p = params[row];
  const SampleAdj* adj = adj_all + p.adj_begin;
  mark_adjusted(bits, kSampleSlice / 32, i0, adj, p.adj_len);
  const __nv_bfloat16* x = logits + static_cast<int64_t>(row) * ld;
  SliceScan scan;
  int i = i0;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const int whole = i0 + (i1 - i0) / 8 * 8;
    for (int v = i0 + 8 * static_cast<int>(threadIdx.x); v < whole; v += 8 * kStatThreads)
      scan.add8(p, adj, bits, i0, v, *reinterpret_cast<const uint4*>(x + v));
    i = whole;
  }
  for (i += threadIdx.x; i < i1; i += kStatThreads)
    scan.add(p, adj, bits, i0, i, __bfloat162float(x[i]));
  const MaxSum rs = ReduceMS(tmp.ms).Reduce(scan.raw, MaxSumOp());
  __syncthreads();
  const ValIdx b = Reduce(tmp.r).Reduce(scan.best, ArgBest());
  if (threadIdx.x == 0) stats[row * gridDim.x + blockIdx.x] = {rs.m, rs.s, b.v, b.i};
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const __nv_bfloat16* __restrict__ logits, int64_t ld, int V,
                  const SampleRowParams* __restrict__ params, const SampleAdj* __restrict__ adj_all,
                  const SampleRowStats* __restrict__ stats, int slices,
                  int32_t* __restrict__ token_out, float* __restrict__ lp_out,
                  int32_t* __restrict__ top_ids, float* __restrict__ top_lp) {
  extern __shared__ uint32_t bits[];  // (V + 31) / 32 words
  __shared__ int cnt[kBins];
  __shared__ float mass[kBins];
  __shared__ int scnt[kSub];
  __shared__ float smass[kSub];
  using Reduce = cub::BlockReduce<ValIdx, kThreads>;
  using ReduceMS = cub::BlockReduce<MaxSum, kThreads>;
  using ReduceF = cub::BlockReduce<float, kThreads>;
  using ReduceI = cub::BlockReduce<int, kThreads>;
  using Scan = cub::BlockScan<float, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage r;
    typename ReduceMS::TempStorage ms;
    typename ReduceF::TempStorage f;
    typename ReduceI::TempStorage i;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ float sh_f[4];
  __shared__ int sh_i[2];

  const int row = blockIdx.x, tid = threadIdx.x;
  const SampleRowParams p = params[row];
  const SampleAdj* adj = adj_all + p.adj_begin;
  const __nv_bfloat16* x = logits + static_cast<int64_t>(row) * ld;
  // The row's slices (row_stats_kernel): raw max / sum of exp (logprobs), penalized argmax.
  MaxSum raw{-INFINITY, 0.0f};
  ValIdx best{-INFINITY, 0x7fffffff};
  for (int k = tid; k < slices; k += kThreads) {
    const SampleRowStats& st = stats[row * slices + k];
    raw = MaxSumOp()(raw, MaxSum{st.max, st.sum_exp});
    const ValIdx c{st.best, st.best_id};
    if (before(c, best)) best = c;
  }
  const MaxSum rs = ReduceMS(tmp.ms).Reduce(raw, MaxSumOp());
  __syncthreads();
  const ValIdx b0 = Reduce(tmp.r).Reduce(best, ArgBest());
  if (tid == 0) {
    sh_f[0] = rs.m + __logf(rs.s);  // lse of the raw logits
    sh_f[1] = b0.v;
    sh_i[0] = b0.i;
  }
  __syncthreads();
  const float lse = sh_f[0], m_adj = sh_f[1];
  int token = sh_i[0] < V ? sh_i[0] : 0;

  if (p.temperature >= 1e-5f && m_adj > -INFINITY) {
    mark_adjusted(bits, (V + 31) / 32, 0, adj, p.adj_len);
    const float inv_t = 1.0f / p.temperature;
    // d = (m_adj - x) / T >= 0; the kept set is {d <= dcut}.
    auto dist = [&](int i) {
      const float v = penalized(p, adj, bits, 0, i, __bfloat162float(x[i]));
      return v == -INFINITY ? INFINITY : (m_adj - v) * inv_t;
    };
    for (int b = tid; b < kBins; b += kThreads) {
      cnt[b] = 0;
      mass[b] = 0.0f;
    }
    __syncthreads();
    for (int i = tid; i < V; i += kThreads) {
      const float d = dist(i);
      if (d == INFINITY) continue;
      const int b = min(static_cast<int>(d * kBinsPerUnit), kBins - 1);
      atomicAdd(&cnt[b], 1);
      atomicAdd(&mass[b], __expf(-d));
    }
    __syncthreads();
    // Refines bin `bin`: a sub-histogram of it (the last bin also takes everything beyond).
    auto refine = [&](int bin) {
      for (int b = tid; b < kSub; b += kThreads) {
        scnt[b] = 0;
        smass[b] = 0.0f;
      }
      __syncthreads();
      const float lo = static_cast<float>(bin) / kBinsPerUnit;
      for (int i = tid; i < V; i += kThreads) {
        const float d = dist(i);
        if (d == INFINITY || min(static_cast<int>(d * kBinsPerUnit), kBins - 1) != bin) continue;
        const int sb = min(max(static_cast<int>((d - lo) * kBinsPerUnit * kSub), 0), kSub - 1);
        atomicAdd(&scnt[sb], 1);
        atomicAdd(&smass[sb], __expf(-d));
      }
      __syncthreads();
    };
    auto sub_edge = [&](int bin, int sb) {  // upper edge of sub-bin sb of bin
      return bin == kBins - 1 && sb == kSub - 1
                 ? INFINITY
                 : (static_cast<float>(bin) + static_cast<float>(sb + 1) / kSub) / kBinsPerUnit;
    };
    float dcut = INFINITY, total = 0.0f;
    if (tid == 0) {
      for (int b = 0; b < kBins; ++b) total += mass[b];
      sh_f[2] = total;
    }
    __syncthreads();
    total = sh_f[2];
    if (p.top_k > 0 && p.top_k < V) {
      if (tid == 0) {
        int cc = 0;
        float cm = 0.0f;
        sh_i[1] = first_bin(cnt, mass, kBins, p.top_k, 0.0f, cc, cm);
        sh_i[0] = cc - cnt[sh_i[1]];  // count before the bin
        sh_f[3] = cm - mass[sh_i[1]];
      }
      __syncthreads();
      const int bk = sh_i[1];
      refine(bk);
      if (tid == 0) {
        int cc = sh_i[0];
        float cm = sh_f[3];
        const int sb = first_bin(scnt, smass, kSub, p.top_k, 0.0f, cc, cm);
        sh_f[2] = sub_edge(bk, sb);
        sh_f[3] = cm;  // mass of the top-k set
      }
      __syncthreads();
      dcut = sh_f[2];
      total = sh_f[3];
      __syncthreads();
    }
    if (p.top_p < 1.0f) {
      const float need = p.top_p * total;
      if (tid == 0) {
        int cc = 0;
        float cm = 0.0f;
        sh_i[1] = first_bin(cnt, mass, kBins, -1, need, cc, cm);
        sh_f[3] = cm - mass[sh_i[1]];
      }
      __syncthreads();
      const int bp = sh_i[1];
      const float before_mass = sh_f[3];
      __syncthreads();
      if (static_cast<float>(bp) / kBinsPerUnit < dcut) {  // else top-k already cuts harder
        refine(bp);
        if (tid == 0) {
          int cc = 0;
          float cm = before_mass;
          const int sb = first_bin(scnt, smass, kSub, -1, need, cc, cm);
          sh_f[2] = fminf(dcut, sub_edge(bp, sb));
        }
        __syncthreads();
        dcut = sh_f[2];
        __syncthreads();
      }
    }
    if (p.min_p > 0.0f) dcut = fminf(dcut, -__logf(p.min_p));
    // Draw: inverse CDF over kept tokens in id order; each thread owns a contiguous chunk.
    const int chunk = (V + kThreads - 1) / kThreads;
    const int c0 = min(V, tid * chunk), c1 = min(V, c0 + chunk);
    float w = 0.0f;
    int last = -1;
    for (int i = c0; i < c1; ++i) {
      const float d = dist(i);
      if (d <= dcut) {
        w += __expf(-d);
        last = i;
      }
    }
    float prefix = 0.0f, all = 0.0f;
    Scan(tmp.scan).ExclusiveSum(w, prefix, all);
    __syncthreads();
    const int last_all = ReduceI(tmp.i).Reduce(last, MaxInt());
    if (tid == 0) sh_i[0] = last_all;
    __syncthreads();
    token = sh_i[0];
    __syncthreads();
    const float target = p.u * all;
    if (w > 0.0f && prefix <= target && target < prefix + w) {
      float acc = prefix;
      for (int i = c0; i < c1; ++i) {
        const float d = dist(i);
        if (d <= dcut) {
          acc += __expf(-d);
          if (target < acc) {
            sh_i[0] = i;
            break;
          }
        }
      }
    }
    __syncthreads();
    token = sh_i[0];
  }

  if (tid == 0) {
    token_out[row] = token;
    lp_out[row] = __bfloat162float(x[token]) - lse;
  }
  // Top-n raw logprobs: n block argmax passes, each below the previous pick.
  ValIdx prev{INFINITY, -1};
  for (int k = 0; k < min(p.num_logprobs, kSampleMaxTop); ++k) {
    ValIdx c{-INFINITY, 0x7fffffff};
    for (int i = tid; i < V; i += kThreads) {
      const ValIdx e{__bfloat162float(x[i]), i};
      if (before(prev, e) && before(e, c)) c = e;
    }
    __syncthreads();
    const ValIdx b = Reduce(tmp.r).Reduce(c, ArgBest());
    if (tid == 0) {
      top_ids[row * kSampleMaxTop + k] = b.i;
      top_lp[row * kSampleMaxTop + k] = b.v - lse;
      sh_f[0] = b.v;
      sh_i[0] = b.i;
    }
    __syncthreads();
    prev = {sh_f[0], sh_i[0]};
    __syncthreads();
  }
}

}  // namespace

void launch_sample(const __nv_bfloat16* logits, int64_t ld, int vocab, int rows,
                   const SampleRowParams* params, const SampleAdj* adj, SampleRowStats* stats,
                   int32_t* token, float* logprob, int32_t* top_ids, float* top_lp,
                   cudaStream_t stream) {
  if (rows == 0) return;
  const int slices = sample_slices(vocab);
  row_stats_kernel<<<dim3(slices, rows), kStatThreads, 0, stream>>>(logits, ld, vocab, params, adj,
                                                                    stats);
  const size_t smem = static_cast<size_t>((vocab + 31) / 32) * sizeof(uint32_t);
  // Static + dynamic shared memory exceed the default 48 KiB for large vocabularies: opt in (a
  // host-side attribute of the current device; cheap, and right for every device and thread).
  cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  sample_kernel<<<rows, kThreads, smem, stream>>>(logits, ld, vocab, params, adj, stats, slices,
                                                  token, logprob, top_ids, top_lp);
}

}  // namespace deltaserve::cuda
