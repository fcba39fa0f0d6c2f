// ModelRunner: runs a Qwen35Model's steps on one rank. It owns what a step needs besides the
// weights: the KV pages and GDN state slots (snapshot slots included), the step buffers and the
// decode CUDA graphs — all allocated from one MemoryPlan. A decode step (one token per sequence,
// every row sampled) of S sequences replays the smallest captured graph >= S, padded with rows on
// the plan's pad slot and pad page; other steps run eagerly.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/step_batch.h"
#include "model/qwen35.h"
#include "runtime/memory_plan.h"

namespace deltaserve::runtime {

// The plan for `model`'s rank shapes on its backend: the backend's workspace for the limits'
// step size and, for a device share, its memory after the weights were loaded.
MemoryPlan plan_for(const model::Qwen35Model& model, const PlanLimits& limits, MemoryBudget budget);

class ModelRunner {
 public:
  // Allocates the plan's caches and step buffers on the model's backend.
  ModelRunner(model::Qwen35Model& model, const MemoryPlan& plan);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs one step and returns the logits of its sampled rows [rows, vocab], f32 row-major.
  // Preconditions: every sequence's pages cover its positions; slots are distinct; ids < vocab.
  std::vector<float> forward(const StepBatch& batch);
  // The same step, its logits left on the backend (ranks whose logits nobody reads); returns the
  // number of logits rows.
  int64_t compute(const StepBatch& batch);
  // The same step, then one token per sampled row drawn on the backend (specs[i] for row i).
  std::vector<backend::Sampled> forward_sample(const StepBatch& batch, int32_t vocab,
                                               const std::vector<backend::SampleSpec>& specs);

  // Captures decode graphs for the batch sizes `buckets` (up to the plan's step buffers) on
  // backends that have graphs, for page tables of up to `max_pages_per_seq` pages.
  void capture_decode_graphs(std::vector<int32_t> buckets, int32_t max_pages_per_seq);
  // One eager step of `tokens` padding rows through the layers (no logits), waited for: what the
  // TPSP startup profile times. Needs tokens <= the plan's scratch tokens.
  void run_padding_step(int32_t tokens);
  // One padding step of `tokens` rows with the backend's GEMM tuning on
  // (Backend::set_linear_tuning): the GEMM shapes of steps of that many tokens keep their fastest
  // algorithm. For start-up, before graphs are captured; nothing where the backend has nothing to
  // tune or for fewer than Backend::kMinTunedRows tokens.
  void tune_linears(int32_t tokens);
  // Graph buckets currently usable (empty when none were captured or they were dropped).
  std::vector<int32_t> graph_buckets() const;
  // Turns graph replay off (true) or back on for steps that follow.
  void set_eager(bool eager) { eager_ = eager; }

  // Copies GDN state slot `src` to `dst` in every GDN layer (a snapshot, or a resume from one).
  void copy_state(int32_t src, int32_t dst);

  const MemoryPlan& plan() const { return plan_; }
  model::Qwen35Model& model() const { return model_; }

 private:
  struct Scratch;
  // Grows the step buffers to hold `tokens` rows and `rows` logits rows (beyond the plan only for
  // steps larger than it; every graph is dropped then).
  void ensure_scratch(int64_t tokens, int64_t rows);
  model::StepBuffers views(int64_t tokens, int64_t rows) const;
  // The step's token ids (as this rank looks them up) and, vocabulary-parallel, the gather order
  // of `rows` logits rows.
  void upload_inputs(std::span<const int32_t> ids, int64_t rows, const model::StepBuffers& v);
  // A batch of B padding rows (the pad slot and page).
  StepBatch padding_batch(int32_t B) const;
  // Stages the padding decode batch `pad` of B rows (zero ids, B logits rows); its buffers.
  model::StepBuffers stage_padding_decode(const StepBatch& pad, int32_t B);
  // Decode graphs of B >= Backend::min_tuned_decode_rows() rows run cuBLASLt GEMMs of B rows
  // (the weight-streaming GEMM takes the narrow projections only up to 8 rows and stops at 64):
  // an eager padding decode step of each such bucket, with the backend's tuning on, keeps their
  // fastest algorithms before the graphs capture them.
  void tune_decode_linears(const std::vector<int32_t>& buckets);
  // The GDN states (every layer) of each move's src slot copied to its dst slot, in one operation.
  void move_states(std::span<const backend::SlotMove> moves);
  // Resumes sequences whose state comes from a snapshot: copies it into their slots.
  void restore_snapshots(const StepBatch& batch);
  // Copies the state of sequences that asked for it into their snapshot slots (after the step).
  void save_snapshots(const StepBatch& batch);
  int find_graph(const StepBatch& batch, int32_t& bucket) const;
  // No snapshot (-1) or a snapshot slot of the plan.
  bool snapshot_slot_ok(int32_t slot) const {
    return slot < 0 || (slot >= plan_.num_slots && slot < plan_.pad_slot());
  }

  model::Qwen35Model& model_;
  backend::Backend& be_;
  MemoryPlan plan_;
  std::vector<Buffer> cache_buffers_;
  std::vector<model::LayerCache> cache_;
  std::unique_ptr<Scratch> scratch_;
  std::vector<std::pair<int32_t, int>> graphs_;  // (batch size, backend graph id), ascending
  bool eager_ = false;
};

}  // namespace deltaserve::runtime
