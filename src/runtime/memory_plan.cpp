#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace deltaserve::runtime {

using model::LayerType;
using model::ModelConfig;

std::vector<ScratchBuffer> scratch_buffers(const ModelConfig& c, DType act, int64_t n, int64_t r) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  std::vector<ScratchBuffer> b = {
      {"ids", DType::kI32, {n}}, {"x", act, {n, H}}, {"h", act, {n, H}}, {"mix", act, {n, H}}};
  if (c.num_layers_of(LayerType::kFullAttention) > 0) {
    const int64_t nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
    b.insert(b.end(), {{"qg", act, {n, nh * 2 * hd}},
                       {"k", act, {n, nkv * hd}},
                       {"v", act, {n, nkv * hd}},
                       {"q", act, {n, nh * hd}},
                       {"attn", act, {n, nh * hd}}});
  }
  if (c.num_layers_of(LayerType::kLinearAttention) > 0) {
    b.insert(b.end(), {{"u", act, {n, c.conv_dim()}},
                       {"y", act, {n, c.conv_dim()}},
                       {"z", act, {n, c.value_dim()}},
                       {"b", act, {n, c.lin_num_v_heads}},
                       {"a", act, {n, c.lin_num_v_heads}},
                       {"o", act, {n, c.lin_num_v_heads, c.lin_v_dim}}});
  }
  b.insert(b.end(), {{"mlp_gate_up", act, {n, 2 * I}},
                     {"mlp_act", act, {n, I}},
                     {"row_ids", DType::kI32, {r}},
                     {"hr", act, {r, H}},
                     {"out", act, {r, c.vocab_shards * c.vocab_size}}});
  if (c.vocab_shards > 1)
    b.insert(b.end(), {{"out_shard", act, {r, c.vocab_size}},
                       {"gathered", act, {c.vocab_shards * r, c.vocab_size}},
                       {"vocab_order", DType::kI32, {c.vocab_shards * r}}});
  return b;
}

int64_t scratch_buffer_bytes(const ScratchBuffer& s) {
  constexpr int64_t kAlign = 256;
  int64_t n = static_cast<int64_t>(dtype_size(s.dtype));
  for (int64_t d : s.dims) n *= d;
  return (n + kAlign - 1) / kAlign * kAlign;
}

int64_t scratch_bytes(const ModelConfig& c, DType act, int64_t tokens, int64_t rows) {
  int64_t total = 0;
  for (const ScratchBuffer& s : scratch_buffers(c, act, tokens, rows))
    total += scratch_buffer_bytes(s);
  return total;
}

int64_t page_bytes(const ModelConfig& c, DType kv, int32_t page_size) {
  return c.num_layers_of(LayerType::kFullAttention) * 2 * page_size * c.num_kv_heads * c.head_dim *
         static_cast<int64_t>(dtype_size(kv));
}

int64_t slot_bytes(const ModelConfig& c, DType act, DType state) {
  return c.num_layers_of(LayerType::kLinearAttention) *
         (c.conv_dim() * (c.conv_kernel - 1) * static_cast<int64_t>(dtype_size(act)) +
          c.lin_num_v_heads * c.lin_k_dim * c.lin_v_dim * static_cast<int64_t>(dtype_size(state)));
}

namespace {

int32_t pages_from_budget(const MemoryPlan& p, const PlanLimits& l, const MemoryBudget& b,
                          int32_t per_request) {
  switch (b.kind) {
    case MemoryBudget::Kind::kPages:
      return b.pages > 0 ? b.pages : per_request * std::min(l.max_num_seqs, 4);
    case MemoryBudget::Kind::kRequests:
      return static_cast<int32_t>(std::min<int64_t>(int64_t{per_request} * b.requests,
                                                    std::numeric_limits<int32_t>::max()));
    case MemoryBudget::Kind::kHostBytes: {
      const int64_t fit =
          p.page_bytes ? b.kv_bytes / p.page_bytes : int64_t{per_request} * l.max_num_seqs;
      return static_cast<int32_t>(
          std::clamp<int64_t>(std::min<int64_t>(fit, int64_t{per_request} * l.max_num_seqs), 1,
                              std::numeric_limits<int32_t>::max()));
    }
    case MemoryBudget::Kind::kDeviceShare: {
      const int64_t share =
          static_cast<int64_t>(b.utilization * static_cast<double>(b.device_total));
      const int64_t rest = share - p.device_used - p.state_bytes() - p.scratch_bytes -
                           p.workspace_bytes - p.reserve_bytes - p.page_bytes;  // the pad page
      const int64_t fit = rest > 0 && p.page_bytes ? rest / p.page_bytes : 0;
      return static_cast<int32_t>(std::min<int64_t>(fit, std::numeric_limits<int32_t>::max()));
    }
  }
  return 0;
}

}  // namespace

MemoryPlan plan_memory(const ModelConfig& local, DType act, const PlanLimits& l,
                       const MemoryBudget& budget, int64_t workspace_bytes) {
  if (l.page_size <= 0 || l.max_num_seqs <= 0 || l.max_num_batched_tokens <= 0 ||
      l.max_model_len <= 0 || l.num_snapshots < 0)
    throw Error(
        "page_size, max_num_seqs, max_num_batched_tokens and max_model_len must be positive");
  MemoryPlan p;
  p.page_size = l.page_size;
  p.num_slots = l.max_num_seqs;
  p.num_snapshots = l.num_snapshots;
  p.scratch_tokens = std::max(l.max_num_batched_tokens, l.max_graph_batch);
  p.scratch_rows = std::max(l.max_num_seqs, l.max_graph_batch);
  p.kv_dtype = l.kv_cache_fp8 ? DType::kFP8E4M3 : act;
  p.page_bytes = page_bytes(local, p.kv_dtype, l.page_size);
  p.state_dtype = l.state_dtype;
  p.slot_bytes = slot_bytes(local, act, l.state_dtype);
  p.scratch_bytes = scratch_bytes(local, act, p.scratch_tokens, p.scratch_rows);
  p.workspace_bytes = workspace_bytes;
  if (budget.kind == MemoryBudget::Kind::kDeviceShare) {
    p.device_total = budget.device_total;
    p.device_used = budget.device_total - budget.device_free;
    p.reserve_bytes = MemoryPlan::kDeviceReserve;
  }
  const int32_t per_request = (l.max_model_len + l.page_size - 1) / l.page_size;
  p.num_pages = pages_from_budget(p, l, budget, per_request);
  const bool shared = budget.kind == MemoryBudget::Kind::kDeviceShare ||
                      budget.kind == MemoryBudget::Kind::kHostBytes;
  if (shared && budget.snapshot_fraction > 0 && p.slot_bytes > 0) {
    if (budget.snapshot_fraction >= 1) throw Error("the snapshot share must be below 1");
    const double cache_bytes = static_cast<double>(p.num_pages) * static_cast<double>(p.page_bytes);
    const int64_t snaps = static_cast<int64_t>(budget.snapshot_fraction * cache_bytes /
                                               static_cast<double>(p.slot_bytes));
    p.num_snapshots += static_cast<int32_t>(std::min<int64_t>(snaps, 1 << 20));
    MemoryBudget rest = budget;
    rest.kv_bytes -= int64_t{p.num_snapshots - l.num_snapshots} * p.slot_bytes;
    p.num_pages = pages_from_budget(p, l, rest, per_request);
  }
  if (p.num_pages < per_request && !(l.fit_max_model_len && p.num_pages >= 1))
    throw Error("the memory plan leaves room for " + std::to_string(p.num_pages) +
                " KV pages after the weights, " + std::to_string(l.max_num_seqs) +
                " state slots and the step buffers; one request of max_model_len " +
                std::to_string(l.max_model_len) + " needs " + std::to_string(per_request) +
                ": give more memory (--gpu-memory-utilization, --kv-cache-gib) or lower "
                "--max-model-len / --max-num-seqs");
  return p;
}

int32_t auto_max_num_seqs(const std::function<MemoryPlan(int32_t)>& plan_for) {
  for (const int32_t n : {1024, 512, 256, 128}) {
    try {
      const MemoryPlan p = plan_for(n);
      if (4 * int64_t{p.num_slots} * p.slot_bytes <= p.kv_bytes() + p.state_bytes()) return n;
    } catch (const Error&) {
      // No room for one request beside n slots: fewer.
    }
  }
  return kFallbackMaxNumSeqs;
}

double MemoryPlan::max_concurrency(int64_t tokens) const {
  const int64_t pages =
      page_size > 0 ? (std::max<int64_t>(tokens, 1) + page_size - 1) / page_size : 0;
  return pages > 0 ? static_cast<double>(num_pages) / static_cast<double>(pages) : 0.0;
}

std::string MemoryPlan::describe() const {
  const double gib = 1 << 30;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "KV pages %d x %d tokens (%s, %.2f GiB), state slots %d + %d snapshots (%.2f GiB), "
                "step buffers %lld tokens / %lld logits rows (%.2f GiB), backend workspace "
                "%.2f GiB",
                num_pages, page_size, std::string(dtype_name(kv_dtype)).c_str(),
                static_cast<double>(kv_bytes()) / gib, num_slots, num_snapshots,
                static_cast<double>(state_bytes()) / gib, static_cast<long long>(scratch_tokens),
                static_cast<long long>(scratch_rows), static_cast<double>(scratch_bytes) / gib,
                static_cast<double>(workspace_bytes) / gib);
  std::string out = buf;
  if (device_total > 0) {
    std::snprintf(buf, sizeof buf,
                  "; device %.2f GiB, %.2f GiB in use after loading, %.2f GiB kept free",
                  static_cast<double>(device_total) / gib, static_cast<double>(device_used) / gib,
                  static_cast<double>(reserve_bytes) / gib);
    out += buf;
  }
  return out;
}

}  // namespace deltaserve::runtime
