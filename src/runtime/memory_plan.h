// MemoryPlan: every byte a rank's model runner allocates, decided once from the model config, the
// engine limits and the backend's own workspace query, before anything is allocated. `serve`
// prints it, the engine sizes its page and slot pools from it, the runner allocates exactly it.
//   KV pages     num_pages usable + 1 for padded graph rows (the pad page)
//   state slots  num_slots for requests, num_snapshots for prefix-cache snapshots, + 1 pad slot
//   scratch      the step buffers for scratch_tokens rows and scratch_rows logits rows
//   workspace    what the backend allocates for itself (chunked delta rule, split-KV attention,
//                GEMM workspace)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace deltaserve::runtime {

struct PlanLimits {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 8192;
  int32_t page_size = 16;
  int32_t num_snapshots = 0;        // prefix-cache snapshot slots
  int32_t max_graph_batch = 0;      // the largest decode-graph bucket (0: no graphs)
  DType state_dtype = DType::kF32;  // the GDN recurrent state (--mamba-ssm-cache-dtype)
  bool kv_cache_fp8 = false;        // KV pages in fp8 e4m3 (--kv-cache-dtype fp8)
  // Where one request of max_model_len does not fit the pages, no error as long as one page is
  // left: the caller lowers max_model_len to what they hold (--max-model-len auto).
  bool fit_max_model_len = false;
};

// How many KV pages: a fixed number, room for a number of full-length requests, what a host byte
// budget holds, or what is left of a share of the device's memory once everything else is placed.
struct MemoryBudget {
  enum class Kind { kPages, kRequests, kHostBytes, kDeviceShare } kind = Kind::kPages;
  int32_t pages = 0;         // kPages (0: room for min(max_num_seqs, 4) requests of max_model_len)
  int32_t requests = 0;      // kRequests: requests of max_model_len
  int64_t kv_bytes = 0;      // kHostBytes
  double utilization = 0.9;  // kDeviceShare
  int64_t device_free = 0, device_total = 0;  // kDeviceShare: after the weights are loaded
  // kDeviceShare / kHostBytes: this share of the cache memory (KV pages + snapshots) becomes
  // GDN state snapshot slots for the prefix cache, on top of PlanLimits::num_snapshots.
  double snapshot_fraction = 0;
};

struct MemoryPlan {
  int32_t page_size = 0, num_pages = 0, num_slots = 0, num_snapshots = 0;
  DType state_dtype = DType::kF32;  // the GDN recurrent state's
  DType kv_dtype = DType::kF32;     // the KV pages' (the activations' or fp8 e4m3)
  int64_t scratch_tokens = 0, scratch_rows = 0;
  int64_t page_bytes = 0, slot_bytes = 0, scratch_bytes = 0, workspace_bytes = 0;
  int64_t device_total = 0, device_used = 0;  // device plans only
  // Device plans: kept free for CUDA graphs, sampling buffers and allocator slack.
  int64_t reserve_bytes = 0;
  static constexpr int64_t kDeviceReserve = int64_t{256} << 20;

  int32_t pad_page() const { return num_pages; }
  int32_t pad_slot() const { return num_slots + num_snapshots; }
  int32_t snapshot_slot(int32_t i) const { return num_slots + i; }
  int64_t kv_bytes() const { return (int64_t{num_pages} + 1) * page_bytes; }
  int64_t state_bytes() const { return (int64_t{num_slots} + num_snapshots + 1) * slot_bytes; }
  // What the runner allocates through Backend::alloc (the workspace is the backend's own).
  int64_t runner_bytes() const { return kv_bytes() + state_bytes() + scratch_bytes; }
  // How many requests of `tokens` positions the KV pages hold at once (vLLM's "maximum
  // concurrency"): beyond it, and beyond num_slots, requests wait.
  double max_concurrency(int64_t tokens) const;
  std::string describe() const;
};

// One step buffer of the runner: its dtype and shape for `tokens` token rows / `rows` logits rows.
struct ScratchBuffer {
  const char* name;
  DType dtype;
  std::vector<int64_t> dims;
};
// The step buffers a rank with shapes `local` needs (the runner allocates exactly these, one after
// another in this order, each taking scratch_buffer_bytes).
std::vector<ScratchBuffer> scratch_buffers(const model::ModelConfig& local, DType act,
                                           int64_t tokens, int64_t rows);
int64_t scratch_buffer_bytes(const ScratchBuffer& s);  // its bytes, rounded up to 256
int64_t scratch_bytes(const model::ModelConfig& local, DType act, int64_t tokens, int64_t rows);
// One KV page (K and V in `kv`) of every full-attention layer; one GDN state slot (conv in `act` +
// the recurrent state in `state`) of every GDN layer.
int64_t page_bytes(const model::ModelConfig& local, DType kv, int32_t page_size);
int64_t slot_bytes(const model::ModelConfig& local, DType act, DType state = DType::kF32);

// max_num_seqs when the user gives none, on a device: the most requests of 1024, 512, 256 and 128
// whose state slots take at most a quarter of the cache memory of the plan made for that many (KV
// pages, slots, snapshots) — a GDN state slot is large (48 MiB for the 4B shape), so slots are
// traded against KV room —, else kFallbackMaxNumSeqs. `plan_for(n)` makes the plan with n request
// slots (it may throw when one request cannot fit; that n is passed over).
constexpr int32_t kFallbackMaxNumSeqs = 64;
int32_t auto_max_num_seqs(const std::function<MemoryPlan(int32_t)>& plan_for);

// Throws deltaserve::Error when one request of max_model_len cannot fit (with
// fit_max_model_len: when not one page is left).
MemoryPlan plan_memory(const model::ModelConfig& local, DType act, const PlanLimits& limits,
                       const MemoryBudget& budget, int64_t workspace_bytes);

}  // namespace deltaserve::runtime
