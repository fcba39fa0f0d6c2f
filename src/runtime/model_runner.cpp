#include "runtime/model_runner.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "dist/vocab_parallel.h"

namespace deltaserve::runtime {

using model::LayerType;

// The step buffers, in one allocation in the plan's order (so that the outputs of projections a
// backend runs as one batched GEMM lie in their weights' order).
struct ModelRunner::Scratch {
  int64_t tokens = 0, rows = 0;
  Buffer arena;
  std::map<std::string, Tensor> buffers;
  const Tensor& get(const std::string& name) const {
    static const Tensor none;
    const auto it = buffers.find(name);
    return it == buffers.end() ? none : it->second;
  }
};

MemoryPlan plan_for(const model::Qwen35Model& model, const PlanLimits& limits,
                    MemoryBudget budget) {
  backend::Backend& be = model.backend();
  if (budget.kind == MemoryBudget::Kind::kDeviceShare) {
    size_t free_b = 0, total_b = 0;
    DS_CHECK(be.memory_info(free_b, total_b), "a device-share budget on a backend without one");
    budget.device_free = static_cast<int64_t>(free_b);
    budget.device_total = static_cast<int64_t>(total_b);
  }
  const model::ModelConfig& c = model.rank_config();
  const backend::GdnDims gdn{static_cast<int32_t>(c.lin_num_k_heads),
                             static_cast<int32_t>(c.lin_num_v_heads),
                             static_cast<int32_t>(c.lin_k_dim), static_cast<int32_t>(c.lin_v_dim),
                             static_cast<int32_t>(c.conv_kernel)};
  const int64_t tokens = std::max(limits.max_num_batched_tokens, limits.max_graph_batch);
  return plan_memory(c, be.act_dtype(), limits, budget, be.workspace_bytes(tokens, gdn));
}

ModelRunner::ModelRunner(model::Qwen35Model& model, const MemoryPlan& plan)
    : model_(model), be_(model.backend()), plan_(plan) {
  DS_CHECK(plan.num_pages > 0 && plan.page_size > 0 && plan.num_slots > 0, "empty cache plan");
  const model::ModelConfig& c = model.rank_config();
  const DType act = be_.act_dtype();
  const int64_t pages = int64_t{plan.num_pages} + 1;
  const int64_t slots = int64_t{plan.pad_slot()} + 1;
  cache_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    model::LayerCache& lc = cache_[static_cast<size_t>(i)];
    auto keep = [this](Buffer b) {
      cache_buffers_.push_back(std::move(b));
      return cache_buffers_.back().tensor();
    };
    if (c.layer_types[static_cast<size_t>(i)] == LayerType::kFullAttention) {
      lc.k = keep(be_.alloc(plan.kv_dtype, {pages, plan.page_size, c.num_kv_heads, c.head_dim}));
      lc.v = keep(be_.alloc(plan.kv_dtype, {pages, plan.page_size, c.num_kv_heads, c.head_dim}));
    } else {
      lc.conv = keep(be_.alloc(act, {slots, c.conv_dim(), c.conv_kernel - 1}));
      lc.state =
          keep(be_.alloc(plan.state_dtype, {slots, c.lin_num_v_heads, c.lin_k_dim, c.lin_v_dim}));
    }
  }
  ensure_scratch(plan.scratch_tokens, plan.scratch_rows);
}

ModelRunner::~ModelRunner() {
  if (!graphs_.empty()) be_.drop_graphs();
}

void ModelRunner::ensure_scratch(int64_t T, int64_t R) {
  if (!scratch_) scratch_ = std::make_unique<Scratch>();
  Scratch& s = *scratch_;
  if (T <= s.tokens && R <= s.rows) return;
  if (!graphs_.empty()) {  // they point at the buffers being replaced
    be_.drop_graphs();
    graphs_.clear();
  }
  // Each dimension grows on its own (doubling past the plan, so growth stays rare).
  const int64_t tokens = T > s.tokens ? std::max(T, 2 * s.tokens) : s.tokens;
  const int64_t rows = R > s.rows ? std::max(R, 2 * s.rows) : s.rows;
  s.buffers.clear();
  s.arena = Buffer();  // the old arena freed before the new one is allocated
  const model::ModelConfig& local = model_.rank_config();
  const std::vector<ScratchBuffer> list = scratch_buffers(local, be_.act_dtype(), tokens, rows);
  // Bytes as 4-byte words: every buffer takes a multiple of 256 bytes (scratch_buffer_bytes).
  s.arena = be_.alloc(DType::kI32, {scratch_bytes(local, be_.act_dtype(), tokens, rows) / 4});
  auto* next = static_cast<std::byte*>(s.arena.tensor().data);
  for (const ScratchBuffer& b : list) {
    Tensor t(next, b.dtype, {1}, s.arena.tensor().device);
    t.ndim = static_cast<int>(b.dims.size());
    std::copy(b.dims.begin(), b.dims.end(), t.shape.begin());
    s.buffers.emplace(b.name, t);
    next += scratch_buffer_bytes(b);
  }
  s.tokens = tokens;
  s.rows = rows;
}

model::StepBuffers ModelRunner::views(int64_t T, int64_t R) const {
  const Scratch& s = *scratch_;
  const int64_t shards = model_.rank_config().vocab_shards;
  auto rows = [&](const char* name, int64_t n) {
    const Tensor& t = s.get(name);
    return t.empty() ? Tensor{} : t.rows(0, n);
  };
  return {rows("ids", T),
          rows("x", T),
          rows("h", T),
          rows("mix", T),
          rows("qg", T),
          rows("k", T),
          rows("v", T),
          rows("q", T),
          rows("attn", T),
          rows("u", T),
          rows("y", T),
          rows("z", T),
          rows("a", T),
          rows("b", T),
          rows("o", T),
          rows("mlp_gate_up", T),
          rows("mlp_act", T),
          rows("row_ids", R),
          rows("hr", R),
          rows("out", R),
          rows("out_shard", R),
          rows("gathered", shards * R),
          rows("vocab_order", shards * R)};
}

void ModelRunner::upload_inputs(std::span<const int32_t> ids, int64_t rows,
                                const model::StepBuffers& v) {
  const model::ModelConfig& local = model_.rank_config();
  if (local.vocab_shards == 1) return be_.upload_i32(ids.data(), v.ids);
  const int rank = model_.parallel().rank(), shards = static_cast<int>(local.vocab_shards);
  be_.upload_i32(dist::local_token_ids(ids, rank, local.vocab_size).data(), v.ids);
  if (rows > 0)
    be_.upload_i32(dist::vocab_gather_order(rows, shards).data(),
                   v.vocab_order.rows(0, shards * rows));
}

void ModelRunner::copy_state(int32_t src, int32_t dst) {
  const backend::SlotMove move{src, dst};
  move_states({&move, 1});
}

void ModelRunner::move_states(std::span<const backend::SlotMove> moves) {
  if (moves.empty()) return;
  for (const backend::SlotMove& m : moves)
    DS_CHECK(m.src >= 0 && m.dst >= 0 && m.src <= plan_.pad_slot() && m.dst <= plan_.pad_slot(),
             "state slot out of range");
  std::vector<Tensor> states;
  for (const model::LayerCache& c : cache_)
    if (!c.state.empty()) states.insert(states.end(), {c.conv, c.state});
  be_.copy_state_rows(states, moves);
}

void ModelRunner::restore_snapshots(const StepBatch& batch) {
  std::vector<backend::SlotMove> moves;
  for (const StepSeq& s : batch.seqs())
    if (s.source == StateSource::kSnapshot) moves.push_back({s.snapshot, s.slot});
  move_states(moves);
}

void ModelRunner::save_snapshots(const StepBatch& batch) {
  std::vector<backend::SlotMove> moves;
  for (const StepSeq& s : batch.seqs())
    if (s.save_snapshot >= 0) moves.push_back({s.slot, s.save_snapshot});
  move_states(moves);
}

std::vector<int32_t> ModelRunner::graph_buckets() const {
  std::vector<int32_t> b;
  for (const auto& [size, id] : graphs_)
    if (be_.graph_valid(id)) b.push_back(size);
  return b;
}

void ModelRunner::capture_decode_graphs(std::vector<int32_t> buckets, int32_t max_pages_per_seq) {
  graphs_.clear();
  if (!be_.graphs_supported() || buckets.empty()) return;
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  DS_CHECK(buckets.front() >= 1, "graph batch sizes must be >= 1");
  const int64_t top = buckets.back();
  const int64_t max_seqs = std::max<int64_t>(plan_.num_slots, top);
  ensure_scratch(std::max(plan_.scratch_tokens, top), std::max(plan_.scratch_rows, top));
  be_.reserve_batch(std::max(scratch_->tokens, top), max_seqs,
                    max_seqs * std::max(max_pages_per_seq, 1));
  tune_decode_linears(buckets);
  for (const int32_t B : buckets) {
    // Capture over padding rows only (the pad slot and page); replays bring their own batch.
    const StepBatch pad = padding_batch(B);
    const model::StepBuffers v = stage_padding_decode(pad, B);
    be_.begin_capture();
    try {
      model_.forward(pad, v, cache_, B, true);
    } catch (...) {
      try {
        be_.end_capture();
      } catch (...) {
      }
      throw;
    }
    const int id = be_.end_capture();
    be_.replay(id);  // warm up
    graphs_.emplace_back(B, id);
  }
  be_.synchronize();
}

StepBatch ModelRunner::padding_batch(int32_t B) const {
  return StepBatchBuilder(plan_.page_size).build().padded(B, plan_.pad_slot(), plan_.pad_page());
}

void ModelRunner::run_padding_step(int32_t tokens) {
  DS_CHECK(tokens >= 1 && tokens <= plan_.scratch_tokens, "padding step beyond the plan");
  ensure_scratch(plan_.scratch_tokens, plan_.scratch_rows);
  const StepBatch pad = padding_batch(tokens);
  be_.stage_batch(pad);
  const model::StepBuffers v = views(tokens, 0);
  upload_inputs(std::vector<int32_t>(static_cast<size_t>(tokens), 0), 0, v);
  model_.forward(pad, v, cache_, 0, true);
  be_.synchronize();
}

void ModelRunner::tune_linears(int32_t tokens) {
  if (!be_.tunes_linears() || tokens < backend::Backend::kMinTunedRows) return;
  be_.set_linear_tuning(backend::Backend::kMinTunedRows);
  try {
    run_padding_step(tokens);
  } catch (...) {
    be_.set_linear_tuning(0);
    throw;
  }
  be_.set_linear_tuning(0);
}

void ModelRunner::tune_decode_linears(const std::vector<int32_t>& buckets) {
  if (!be_.tunes_linears()) return;
  const int64_t min_rows = be_.min_tuned_decode_rows();
  be_.set_linear_tuning(min_rows);
  try {
    for (const int32_t B : buckets) {
      if (B < min_rows) continue;
      const StepBatch pad = padding_batch(B);
      model_.forward(pad, stage_padding_decode(pad, B), cache_, B, true);
    }
    be_.synchronize();
  } catch (...) {
    be_.set_linear_tuning(0);
    throw;
  }
  be_.set_linear_tuning(0);
}

model::StepBuffers ModelRunner::stage_padding_decode(const StepBatch& pad, int32_t B) {
  be_.stage_batch(pad);
  const model::StepBuffers v = views(B, B);
  upload_inputs(std::vector<int32_t>(static_cast<size_t>(B), 0), B, v);
  return v;
}

// A decode-only step replays the smallest graph that fits; -1 when none does.
int ModelRunner::find_graph(const StepBatch& batch, int32_t& bucket) const {
  if (eager_ || graphs_.empty() || !batch.is_decode()) return -1;
  for (const auto& [size, id] : graphs_)
    if (size >= batch.num_tokens() && be_.graph_valid(id)) {
      bucket = size;
      return id;
    }
  return -1;
}

int64_t ModelRunner::compute(const StepBatch& batch) {
  DS_CHECK(batch.num_tokens() > 0, "empty batch");
  for (const StepSeq& s : batch.seqs())
    DS_CHECK(s.slot >= 0 && s.slot < plan_.num_slots && snapshot_slot_ok(s.save_snapshot) &&
                 snapshot_slot_ok(s.mid_snapshot),
             "slot out of range");
  const int64_t R = static_cast<int64_t>(batch.sample_rows().size());
  restore_snapshots(batch);
  int32_t B = batch.num_tokens();
  int graph = find_graph(batch, B);
  ensure_scratch(B, R);
  if (graph >= 0 && !be_.graph_valid(graph)) graph = -1;  // the buffers had to grow
  if (graph < 0) B = batch.num_tokens();
  const StepBatch padded = B > batch.num_tokens() ? batch.padded(B - batch.num_tokens(),
                                                                 plan_.pad_slot(), plan_.pad_page())
                                                  : StepBatch();
  const StepBatch& step = B > batch.num_tokens() ? padded : batch;
  be_.stage_batch(step);
  if (graph >= 0 && !be_.graph_valid(graph)) graph = -1;  // staging had to grow its buffer
  const model::StepBuffers v = views(B, R);
  // A graph computes logits for all of its B rows (the gather order of B rows is what it reads).
  upload_inputs(step.token_ids(), graph >= 0 ? B : R, v);
  if (graph >= 0) {
    be_.replay(graph);
  } else {
    if (R > 0) be_.upload_i32(batch.sample_rows().data(), v.row_ids);
    model_.forward(step, v, cache_, R, false);
  }
  save_snapshots(batch);
  return R;
}

std::vector<float> ModelRunner::forward(const StepBatch& batch) {
  const int64_t R = compute(batch);
  const int64_t V = model_.config().vocab_size;
  const Tensor out = views(0, R).out;  // [R, >= V]: vocabulary-parallel rows are padded
  std::vector<float> logits(static_cast<size_t>(R * out.dim(1)));
  if (R > 0) be_.download_f32(out, logits.data());
  for (int64_t r = 1; r < R && out.dim(1) > V; ++r)
    std::copy_n(logits.begin() + r * out.dim(1), V, logits.begin() + r * V);
  logits.resize(static_cast<size_t>(R * V));
  return logits;
}

std::vector<backend::Sampled> ModelRunner::forward_sample(
    const StepBatch& batch, int32_t vocab, const std::vector<backend::SampleSpec>& specs) {
  DS_CHECK(specs.size() == batch.sample_rows().size(), "one sampling spec per sampled row");
  DS_CHECK(vocab > 0 && vocab <= model_.config().vocab_size, "sampling vocabulary");
  const int64_t R = compute(batch);
  if (R == 0) return {};
  return be_.sample(views(0, R).out, vocab, specs);
}

}  // namespace deltaserve::runtime
