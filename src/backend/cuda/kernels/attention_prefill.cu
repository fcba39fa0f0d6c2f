// Causal flash attention of prefill sequences over the paged KV (bf16 wgmma with f32 accumulation,
// sm_90a). Block (query head, sequence, 128-query tile), two warpgroups of 64 query rows; the
// heaviest tiles (latest queries) are launched first. The Q tile stays in shared memory; key /
// value tiles of 64 rows stream through two shared-memory stages with cp.async (into the 128-byte
// swizzled layout wgmma reads), the next tile's copy in flight while the current one computes.
// Per key tile, per warpgroup: S = Q K^T (wgmma, both operands from shared memory), the online
// softmax in registers (exp2, f32), P as bf16 A fragments straight from S's accumulators, and
// O += P V (wgmma, A from registers, V read MN-major).
#include "backend/cuda/kernels/attention_prefill.cuh"
#include "backend/cuda/kernels/mma_bf16.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace deltaserve::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kRows = 128, kKeys = 64, kWarps = kRows / 16, kThreads = 32 * kWarps;

template <int HD>
struct PrefillLayout {
  // SW128 tiles: Q (kRows x HD), then two stages of K and V (kKeys x HD each).
  static constexpr uint32_t q_bytes = kRows * HD * 2, kv_bytes = kKeys * HD * 2;
  static constexpr size_t bytes = q_bytes + 4 * kv_bytes + wgmma::kAtomBytes;  // + alignment
};

struct Tile {
  int begin, start, q0, rows, kvh, h, last_key;
  const int32_t* pages;
};

// Keys [k0, k0 + 64) of the KV head into (ks, vs) as one cp.async group (keys past last_key zero).
template <int HD>
__device__ void load_kv(unsigned char* ks, unsigned char* vs, const Tile& t, int k0,
                        const BatchMeta& b, const bf16* kc, const bf16* vc, int nkv) {
  constexpr int kVec = HD / 8;
  for (int e = threadIdx.x; e < kKeys * kVec; e += kThreads) {
    const int r = e / kVec, c = e % kVec, p = min(k0 + r, t.last_key);
    const size_t row =
        static_cast<size_t>(t.pages[p / b.page_size]) * b.page_size + p % b.page_size;
    const size_t off = (row * nkv + t.kvh) * HD + c * 8;
    const bool valid = k0 + r <= t.last_key;
    const uint32_t at = wgmma::sw128_offset(kKeys, r, 8 * c);
    mma::cp_async16(ks + at, kc + off, valid);
    mma::cp_async16(vs + at, vc + off, valid);
  }
  mma::cp_async_commit();
}

// S (this warpgroup's 64 rows x 64 keys) = Q K^T, Q and K K-major SW128 tiles.
template <int HD>
__device__ void scores(uint32_t qs, uint32_t ks, float (&s)[8][4]) {
  constexpr uint32_t kSbo = wgmma::kAtomBytes, kStep = 32;  // 16 bf16 along K
  qs += (threadIdx.x / 128) * 64 * wgmma::kRowBytes;
  float(&d)[32] = reinterpret_cast<float(&)[32]>(s);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const uint32_t col = kk / 4, in = (kk % 4) * kStep;
    wgmma::mma_64x64_ss(d, wgmma::desc(qs + col * kRows * wgmma::kRowBytes + in, 16, kSbo),
                        wgmma::desc(ks + col * kKeys * wgmma::kRowBytes + in, 16, kSbo), kk > 0);
  }
  wgmma::commit();
  wgmma::wait<0>();
}

// The online softmax over one key tile for the thread's rows g and g + 8: masks keys after each
// row's position, updates the running max m and (per-thread partial) sum l, rescales o, and turns
// s into unnormalised probabilities.
template <int HD>
__device__ void online_softmax(float (&s)[8][4], float (&o)[HD / 8][4], float (&m)[2],
                               float (&l)[2], int k0, int qpos0, bool masked, float scale_log2) {
  const int lane = threadIdx.x % 32, c = lane % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int qpos = qpos0 + 8 * hf;
    float mx = m[hf];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = s[n][2 * hf + e];
        if (masked && k0 + 8 * n + 2 * c + e > qpos) v = -INFINITY;
        mx = fmaxf(mx, v);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Every row sees key 0 in the first tile, so mx is finite from then on.
    const float base = mx * scale_log2, corr = exp2f((m[hf] - mx) * scale_log2);
    m[hf] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = s[n][2 * hf + e];
        v = exp2f(fmaf(v, scale_log2, -base));
        sum += v;
      }
    l[hf] = l[hf] * corr + sum;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      o[d][2 * hf] *= corr;
      o[d][2 * hf + 1] *= corr;
    }
  }
}

// O (this warpgroup's 64 rows x HD) += P V, P taken from the score accumulators as bf16 A
// fragments, V (keys x HD) an MN-major SW128 tile.
template <int HD>
__device__ void accumulate(const float (&p)[8][4], uint32_t vs, float (&o)[HD / 8][4]) {
  constexpr uint32_t kLbo = kKeys * wgmma::kRowBytes, kSbo = wgmma::kAtomBytes;
  float(&d)[HD / 2] = reinterpret_cast<float(&)[HD / 2]>(o);
  uint32_t a[kKeys / 16][4];  // all of P packed before the first wgmma reads any of it
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      a[kk][i] = mma::pack_bf16(p[2 * kk + i / 2][2 * (i % 2)], p[2 * kk + i / 2][2 * (i % 2) + 1]);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint64_t b = wgmma::desc(vs + kk * 16 * wgmma::kRowBytes, kLbo, kSbo);
    if constexpr (HD == 64) wgmma::mma_64x64_rs(d, a[kk], b);
    if constexpr (HD == 128) wgmma::mma_64x128_rs(d, a[kk], b);
    if constexpr (HD == 256) wgmma::mma_64x256_rs(d, a[kk], b);
  }
  wgmma::commit();
  wgmma::wait<0>();
}

// out = O / l * sigmoid(gate) for the thread's rows that exist.
template <int HD>
__device__ void write_out(const float (&o)[HD / 8][4], float (&l)[2], const Tile& t, int nh,
                          const bf16* gate, bf16* out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float sum = l[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = 16 * warp + g + 8 * hf;
    if (r >= t.rows) continue;
    const float inv = 1.0f / sum;
    const size_t base = (static_cast<size_t>(t.begin + t.q0 + r) * nh + t.h) * HD + 2 * c;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      const size_t idx = base + 8 * d;
      const float2 gv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(gate + idx));
      *reinterpret_cast<__nv_bfloat162*>(out + idx) =
          __floats2bfloat162_rn(o[d][2 * hf] * inv / (1.0f + __expf(-gv.x)),
                                o[d][2 * hf + 1] * inv / (1.0f + __expf(-gv.y)));
    }
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_kernel(BatchMeta b, const bf16* __restrict__ q, const bf16* __restrict__ gate,
                        const bf16* __restrict__ kc, const bf16* __restrict__ vc, AttnShape s,
                        int min_len, bf16* __restrict__ out) {
  using Lay = PrefillLayout<HD>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // SW128 tiles need 1024-byte alignment (the swizzle follows address bits 7..9).
  unsigned char* qs = smem_raw + (-static_cast<int>(mma::smem_u32(smem_raw)) & 1023);
  unsigned char* kv = qs + Lay::q_bytes;  // stage i: K at kv + 2i kv_bytes, V after it
  const int h = blockIdx.x, seq = blockIdx.y, n = b.seq_len[seq];
  const int tile = gridDim.z - 1 - blockIdx.z;  // heaviest first
  if (n < min_len || tile * kRows >= n) return;
  Tile t;
  t.begin = b.seq_begin[seq];
  t.start = b.seq_start[seq];
  t.q0 = tile * kRows;
  t.rows = min(kRows, n - t.q0);
  t.h = h;
  t.kvh = h / (s.nh / s.nkv);
  t.last_key = t.start + t.q0 + t.rows - 1;
  t.pages = b.pages + b.seq_page_off[seq];
  constexpr int kVec = HD / 8;
  for (int e = threadIdx.x; e < kRows * kVec; e += kThreads) {
    const int r = e / kVec, c = e % kVec;
    const bf16* src =
        q + (static_cast<size_t>(t.begin + t.q0 + min(r, t.rows - 1)) * s.nh + h) * HD;
    mma::cp_async16(qs + wgmma::sw128_offset(kRows, r, 8 * c), src + c * 8, r < t.rows);
  }
  load_kv<HD>(kv, kv + Lay::kv_bytes, t, 0, b, kc, vc, s.nkv);  // Q joins this group
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int qpos0 = t.start + t.q0 + 16 * warp + lane / 4;  // position of the thread's row g
  const int first_masked = t.start + t.q0;                  // tiles ending before it need no mask
  const float scale_log2 = rsqrtf(static_cast<float>(HD)) * 1.4426950408889634f;
  float o[HD / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int tiles = t.last_key / kKeys + 1;
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles) {
      unsigned char* next = kv + 2 * ((j + 1) % 2) * Lay::kv_bytes;
      load_kv<HD>(next, next + Lay::kv_bytes, t, (j + 1) * kKeys, b, kc, vc, s.nkv);
      mma::cp_async_wait<1>();
    } else {
      mma::cp_async_wait<0>();
    }
    wgmma::fence_shared_for_async();
    __syncthreads();  // tile j (and Q) visible to every warp's wgmma
    const uint32_t ks = mma::smem_u32(kv + 2 * (j % 2) * Lay::kv_bytes);
    const int k0 = j * kKeys;
    float sc[8][4];
    scores<HD>(mma::smem_u32(qs), ks, sc);
    online_softmax<HD>(sc, o, m, l, k0, qpos0, k0 + kKeys - 1 > first_masked, scale_log2);
    accumulate<HD>(sc, ks + Lay::kv_bytes, o);
    __syncthreads();  // stage j % 2 is free for tile j + 2
  }
  write_out<HD>(o, l, t, s.nh, gate, out);
}

template <int HD>
void launch(const BatchMeta& b, const bf16* q, const bf16* gate, const bf16* kc, const bf16* vc,
            const AttnShape& s, int min_len, bf16* out, cudaStream_t stream) {
  constexpr size_t smem = PrefillLayout<HD>::bytes;
  cudaFuncSetAttribute(attn_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  const int tiles = (b.max_seq_len + kRows - 1) / kRows;
  attn_prefill_kernel<HD><<<dim3(s.nh, b.num_seqs, tiles), kThreads, smem, stream>>>(
      b, q, gate, kc, vc, s, min_len, out);
}

}  // namespace

bool attention_prefill_supported(const AttnShape& s) {
  return s.hd == 64 || s.hd == 128 || s.hd == 256;
}

void launch_attention_prefill(const BatchMeta& b, const bf16* q, const bf16* gate,
                              const bf16* k_cache, const bf16* v_cache, const AttnShape& s,
                              int min_len, bf16* out, cudaStream_t stream) {
  if (s.hd == 64) launch<64>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
  if (s.hd == 128) launch<128>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
  if (s.hd == 256) launch<256>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
}

}  // namespace deltaserve::cuda
