// Causal flash attention of prefill sequences over a bf16 paged KV, warp-specialized (sm_90a):
// a block (query head, sequence, 128-query tile) of three warpgroups. Warpgroup 0 only copies: the
// Q tile, then K_0, K_1, V_0, K_2, V_1, ... by cp.async (page lookups and addresses on its own
// threads) into two K slots and two V slots, each slot with a "full" barrier (all 128 copying
// threads arrive once their copies of it landed and were fenced for the async proxy) and an
// "empty" one (each consumer warp arrives once its MMAs read it). Warpgroups 1 and 2 hold 64 query
// rows each and only compute, as the single-role kernel (attention_prefill.cu) does: iteration j
// issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} as two wgmma groups and runs S_j's online softmax
// under the second. The copying warpgroup gives up registers to the computing ones (setmaxnreg).
// The two roles no longer share a block barrier an iteration, and the computing warps issue no
// copy instructions (in the single-role kernel ~460 of a warp's ~819 instructions an iteration).
// The computing warps keep the first steps of their Q rows in registers (kQueryRegSteps), so that
// those score MMAs read only K from shared memory, which bounds the kernel (the copies' writes
// and the MMAs' operand reads: bench/results/h200_2026-12-04f.md).
#include "backend/cuda/kernels/attention_prefill_ops.cuh"
#include "backend/cuda/kernels/attention_prefill_ws.cuh"
#include "backend/cuda/kernels/tma.cuh"

namespace deltaserve::cuda {
namespace {

using namespace attn_prefill;  // NOLINT: the kernel pieces
constexpr int kCopyThreads = 128, kThreads = kCopyThreads + 2 * 128;
// The register split: 128 x 40 + 256 x 232 = 384 x 168 (setmaxnreg.inc waits for good past it).
constexpr int kCopyRegs = 40, kMathRegs = 232;

// The 16-column steps of the scores whose Q comes from registers (the rest from shared memory).
// H200, attn_bench at head dim 256 (ms a layer, 1 x 8192 / 1 x 32768, two rounds): 4 steps
// 1.068, 1.061 / 16.11, 16.10; none 1.078, 1.090 / 16.40, 16.40; 6 steps 1.115, 1.105 / 16.75,
// 16.72; 7 (a 16-byte spill) 1.109, 1.110; 8 spill and serialise the wgmma. Head dims 64 / 128
// (no Qwen3.5 model has them) take half the steps: tested (cuda_ops_test), not timed.
template <int HD>
constexpr int kQueryRegSteps = HD == 256 ? 4 : HD / 32;

struct Barriers {
  uint64_t q_full, k_full[2], v_full[2], k_empty[2], v_empty[2];
};

template <int HD>
struct WsLayout {
  static constexpr uint32_t q_bytes = kRows * HD * 2, kv_bytes = kKeys * HD * 2;
  static constexpr size_t bytes =
      q_bytes + 4 * kv_bytes + sizeof(Barriers) + wgmma::kAtomBytes;  // + alignment
};

// The copying warpgroup: each copy group is committed, and the one before it is waited for,
// fenced and announced on its full barrier once the next is issued (so two are in flight). A slot
// is reused once both computing warpgroups released its previous tile; if that has not happened
// yet, the copy in flight is announced first.
template <int HD>
struct Copier {
  const Tile& t;
  const AttnShape& s;
  unsigned char *ks, *vs;
  Barriers& bar;
  int tid;
  uint64_t* pending = nullptr;  // the full barrier of the committed copy not yet announced

  __device__ void announce_pending() {
    if (pending == nullptr) return;
    mma::cp_async_wait<0>();
    wgmma::fence_shared_for_async();
    tma::arrive(pending);
    pending = nullptr;
  }
  // The group just committed completes on `full`; the one before it is announced.
  __device__ void committed(uint64_t* full) {
    if (pending != nullptr) {
      mma::cp_async_wait<1>();
      wgmma::fence_shared_for_async();
      tma::arrive(pending);
    }
    pending = full;
  }
  // Tile j of the cache (K or V) into slot j % 2.
  __device__ void load(bool is_v, int j, const bf16* cache) {
    uint64_t* empty = (is_v ? bar.v_empty : bar.k_empty) + j % 2;
    if (j >= 2) {
      const uint32_t parity = ((j - 2) / 2) & 1;
      if (!tma::phase_done(empty, parity)) {
        announce_pending();
        tma::wait(empty, parity);
      }
    }
    load_rows<HD, kCopyThreads>((is_v ? vs : ks) + (j % 2) * WsLayout<HD>::kv_bytes, cache, t,
                                j * kKeys, s.nkv, tid);
    mma::cp_async_commit();
    committed((is_v ? bar.v_full : bar.k_full) + j % 2);
  }
};

template <int HD>
__device__ void copy_tiles(const Tile& t, const AttnShape& s, const bf16* q, const bf16* kc,
                           const bf16* vc, unsigned char* qs, unsigned char* ks, unsigned char* vs,
                           Barriers& bar, int tiles) {
  Copier<HD> c{t, s, ks, vs, bar, static_cast<int>(threadIdx.x)};
  load_queries<HD, kCopyThreads>(qs, q, t, s.nh, c.tid);
  mma::cp_async_commit();
  c.committed(&bar.q_full);
  c.load(false, 0, kc);
  for (int j = 1; j < tiles; ++j) {
    c.load(false, j, kc);
    c.load(true, j - 1, vc);
  }
  c.load(true, tiles - 1, vc);
  c.announce_pending();
}

// A computing warp is done reading a slot.
__device__ void release(uint64_t* empty) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) tma::arrive(empty);
}

// A computing warpgroup (wg 0 or 1: query rows 64 wg ..): the single-role kernel's loop, with
// waits on the slots' barriers instead of block barriers. The wgmma issues stay out of branches
// (ptxas serialises wgmma in divergent paths): the first and last iterations are peeled.
template <int HD>
__device__ void compute_tiles(const Tile& t, const AttnShape& s, const bf16* gate, bf16* out,
                              const unsigned char* q_tile, uint32_t qs, uint32_t ks, uint32_t vs,
                              Barriers& bar, int tiles) {
  constexpr uint32_t kSlot = WsLayout<HD>::kv_bytes;
  const int tid = static_cast<int>(threadIdx.x) - kCopyThreads, wg = tid / 128;
  const int qpos0 = t.start + t.q0 + 16 * (tid / 32) + (tid % 32) / 4;  // the thread's row g
  const int first_masked = t.start + t.q0;  // tiles ending before it need no mask
  const float scale_log2 = rsqrtf(static_cast<float>(HD)) * kLog2e;
  float o[HD / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t p[kKeys / 16][4];  // P_{j-1}
  float sc[8][4], corr[2];
  tma::wait(&bar.q_full, 0);
  uint32_t qa[kQueryRegSteps<HD>][4];  // Q's A fragments of the first steps
  load_query_frags(qa, q_tile, wg, (tid / 32) % 4);
  tma::wait(&bar.k_full[0], 0);
  wgmma::fence();
  issue_scores<HD, false, kQueryRegSteps<HD>>(qs, ks, sc, wg, qa);
  wgmma::wait<0>();
  release(&bar.k_empty[0]);
  online_softmax(sc, m, l, corr, 0, qpos0, kKeys - 1 > first_masked, scale_log2);
  pack_probs<false>(sc, p);  // O is still zero: no rescale
  for (int j = 1; j < tiles; ++j) {
    tma::wait(&bar.k_full[j % 2], (j / 2) & 1);
    tma::wait(&bar.v_full[(j - 1) % 2], ((j - 1) / 2) & 1);
    wgmma::fence();
    issue_scores<HD, false, kQueryRegSteps<HD>>(qs, ks + (j % 2) * kSlot, sc, wg, qa);
    issue_pv<HD, false>(p, vs + ((j - 1) % 2) * kSlot, o);
    wgmma::wait<1>();  // S_j done, P_{j-1} V_{j-1} in flight during the softmax
    release(&bar.k_empty[j % 2]);
    const int k0 = j * kKeys;
    online_softmax(sc, m, l, corr, k0, qpos0, k0 + kKeys - 1 > first_masked, scale_log2);
    wgmma::wait<0>();
    release(&bar.v_empty[(j - 1) % 2]);
    rescale<HD>(o, corr);
    pack_probs<false>(sc, p);
  }
  tma::wait(&bar.v_full[(tiles - 1) % 2], ((tiles - 1) / 2) & 1);
  wgmma::fence();
  issue_pv<HD, false>(p, vs + ((tiles - 1) % 2) * kSlot, o);
  wgmma::wait<0>();
  write_out<HD>(o, l, t, s.nh, gate, s.gate_stride, out, tid);
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_ws_kernel(BatchMeta b, const bf16* __restrict__ q, const bf16* __restrict__ gate,
                           const bf16* __restrict__ kc, const bf16* __restrict__ vc, AttnShape s,
                           int min_len, bf16* __restrict__ out) {
  using Lay = WsLayout<HD>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* qs = wgmma::atom_aligned<unsigned char>(smem_raw);
  unsigned char* ks = qs + Lay::q_bytes;       // K slot i at ks + i kv_bytes
  unsigned char* vs = ks + 2 * Lay::kv_bytes;  // V slot i at vs + i kv_bytes
  Barriers& bar = *reinterpret_cast<Barriers*>(vs + 2 * Lay::kv_bytes);
  Tile t;
  if (!block_tile(b, s, min_len, t)) return;
  const int tiles = t.last_key / kKeys + 1;
  if (threadIdx.x == 0) {
    tma::barrier_init(&bar.q_full, kCopyThreads);
    for (int i = 0; i < 2; ++i) {
      tma::barrier_init(&bar.k_full[i], kCopyThreads);
      tma::barrier_init(&bar.v_full[i], kCopyThreads);
      tma::barrier_init(&bar.k_empty[i], 8);  // the computing warps
      tma::barrier_init(&bar.v_empty[i], 8);
    }
    tma::barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < kCopyThreads) {
    wgmma::regs_dec<kCopyRegs>();
    copy_tiles<HD>(t, s, q, kc, vc, qs, ks, vs, bar, tiles);
    return;
  }
  wgmma::regs_inc<kMathRegs>();
  compute_tiles<HD>(t, s, gate, out, qs, mma::smem_u32(qs), mma::smem_u32(ks), mma::smem_u32(vs),
                    bar, tiles);
}

template <int HD>
void launch(const BatchMeta& b, const bf16* q, const bf16* gate, const bf16* kc, const bf16* vc,
            const AttnShape& s, int min_len, bf16* out, cudaStream_t stream) {
  constexpr size_t smem = WsLayout<HD>::bytes;
  cudaFuncSetAttribute(attn_prefill_ws_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  const int tiles = (b.max_seq_len + kRows - 1) / kRows;
  attn_prefill_ws_kernel<HD><<<dim3(s.nh, b.num_seqs, tiles), kThreads, smem, stream>>>(
      b, q, gate, kc, vc, s, min_len, out);
}

}  // namespace

void launch_attention_prefill_ws(const BatchMeta& b, const bf16* q, const bf16* gate,
                                 const bf16* k_cache, const bf16* v_cache, const AttnShape& s,
                                 int min_len, bf16* out, cudaStream_t stream) {
  if (s.hd == 64) launch<64>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
  if (s.hd == 128) launch<128>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
  if (s.hd == 256) launch<256>(b, q, gate, k_cache, v_cache, s, min_len, out, stream);
}

}  // namespace deltaserve::cuda
