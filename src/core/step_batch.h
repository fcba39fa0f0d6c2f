// StepBatch: the one description of a step, built once by the scheduler (or a test, or a bench)
// and passed explicitly to the model runner, the model and every backend op. Immutable once built:
//   tokens    token ids and absolute positions of every row, sequences back to back;
//   sequences each with its rows, its start position, its state slot and where its GDN state comes
//             from (fresh / its slot / a snapshot: the seam for prefix caching), and the rows to
//             sample (one or more: the seam for speculative verification);
//   pages     a CSR page table: sequence i's KV pages are page_ids[page_offsets[i], [i+1]).
// Every batch gets a process-unique id, so a backend may keep one device copy per batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deltaserve {

// In-step snapshots lie on multiples of the delta rule's chunk (counted from the step's first
// token of the sequence), where the chunked form materializes the state anyway.
inline constexpr int32_t kSnapshotChunk = 64;

// Where a sequence's GDN conv + recurrent state comes from before its first token of the step.
enum class StateSource : uint8_t {
  kFresh,     // a new sequence at position 0: the slot is zeroed (never read)
  kSlot,      // continues from its own slot
  kSnapshot,  // resumes from snapshot slot `snapshot` (copied into its slot before the step)
};

struct StepSeq {
  uint64_t request_id = 0;
  int32_t token_begin = 0;  // first row in the batch
  int32_t num_tokens = 0;
  int32_t start_pos = 0;  // tokens already in the KV cache / state
  int32_t slot = 0;       // GDN state slot
  StateSource source = StateSource::kFresh;
  int32_t snapshot = -1;       // kSnapshot only
  int32_t save_snapshot = -1;  // >= 0: its state after the step is copied to this snapshot slot
  // >= 0: its state after its first mid_snapshot_at tokens of the step (a multiple of 64 inside
  // the step) is written to this snapshot slot by the GDN ops themselves.
  int32_t mid_snapshot = -1, mid_snapshot_at = 0;
  int32_t sample_begin = 0;  // index of its first entry in sample_rows()
  int32_t num_samples = 0;   // rows sampled (its last ones, unless given explicitly)
  bool fresh() const { return source == StateSource::kFresh; }
};

class StepBatch {
 public:
  StepBatch() = default;
  int32_t num_tokens() const { return static_cast<int32_t>(token_ids_.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(seqs_.size()); }
  bool empty() const { return seqs_.empty(); }
  uint64_t id() const { return id_; }
  int32_t page_size() const { return page_size_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  const std::vector<int32_t>& positions() const { return positions_; }
  const std::vector<StepSeq>& seqs() const { return seqs_; }
  const StepSeq& seq(size_t i) const { return seqs_[i]; }
  std::span<const int32_t> pages(size_t i) const {
    return {page_ids_.data() + page_offsets_[i],
            static_cast<size_t>(page_offsets_[i + 1] - page_offsets_[i])};
  }
  const std::vector<int32_t>& page_offsets() const { return page_offsets_; }
  const std::vector<int32_t>& page_ids() const { return page_ids_; }
  // Rows whose logits are computed and sampled, in sequence order.
  const std::vector<int32_t>& sample_rows() const { return sample_rows_; }
  // A decode step: one token per sequence, each sampled, rows in order.
  bool is_decode() const;
  // This batch plus `rows` padding sequences of one token each on `slot` and `page` (CUDA-graph
  // buckets), every padding row sampled.
  StepBatch padded(int32_t rows, int32_t slot, int32_t page) const;

 private:
  friend class StepBatchBuilder;
  uint64_t id_ = 0;
  int32_t page_size_ = 0;
  std::vector<int32_t> token_ids_, positions_;
  std::vector<StepSeq> seqs_;
  std::vector<int32_t> page_offsets_{0}, page_ids_;
  std::vector<int32_t> sample_rows_;
};

class StepBatchBuilder {
 public:
  explicit StepBatchBuilder(int32_t page_size) { b_.page_size_ = page_size; }
  // Room for `tokens` token rows, `seqs` sequences and `pages` page-table entries, so that adding
  // up to that much allocates once (a scheduler passes its previous step's sizes: a step's page
  // tables run to ~150k entries at 256 sequences of 9k tokens).
  StepBatchBuilder& reserve(int64_t tokens, int64_t seqs, int64_t pages);
  // Appends a sequence: its new tokens at positions [start_pos, start_pos + tokens.size()), its
  // KV pages (covering every position through the last new token) and its last `num_samples`
  // rows sampled. The state source is kFresh at position 0 and kSlot otherwise unless given.
  StepBatchBuilder& add(uint64_t request_id, std::span<const int32_t> tokens, int32_t start_pos,
                        int32_t slot, std::span<const int32_t> pages, int32_t num_samples,
                        StateSource source, int32_t snapshot = -1);
  StepBatchBuilder& add(uint64_t request_id, std::span<const int32_t> tokens, int32_t start_pos,
                        int32_t slot, std::span<const int32_t> pages, int32_t num_samples = 0) {
    return add(request_id, tokens, start_pos, slot, pages, num_samples,
               start_pos == 0 ? StateSource::kFresh : StateSource::kSlot);
  }
  // The same, sampling the rows at `sample_offsets` (ascending, within the sequence's tokens).
  StepBatchBuilder& add_rows(uint64_t request_id, std::span<const int32_t> tokens,
                             int32_t start_pos, int32_t slot, std::span<const int32_t> pages,
                             std::span<const int32_t> sample_offsets);
  // The last added sequence's state after the step is copied to snapshot slot `slot`.
  StepBatchBuilder& save_snapshot(int32_t slot);
  // The last added sequence's state after its first `at` tokens of the step (a positive multiple
  // of kSnapshotChunk below its token count) goes to snapshot slot `slot`.
  StepBatchBuilder& save_snapshot_at(int32_t at, int32_t slot);
  // Finishes the batch (gives it a fresh id).
  StepBatch build();

 private:
  StepBatch b_;
};

}  // namespace deltaserve
