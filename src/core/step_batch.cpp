#include "core/step_batch.h"

#include <algorithm>
#include <atomic>

#include "core/error.h"

namespace deltaserve {

namespace {
std::atomic<uint64_t> next_batch_id{1};
}

bool StepBatch::is_decode() const {
  if (sample_rows_.size() != token_ids_.size() || seqs_.size() != token_ids_.size()) return false;
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (seqs_[i].num_tokens != 1 || seqs_[i].token_begin != static_cast<int32_t>(i) ||
        sample_rows_[i] != static_cast<int32_t>(i))
      return false;
  return true;
}

StepBatch StepBatch::padded(int32_t rows, int32_t slot, int32_t page) const {
  StepBatchBuilder b(page_size_);
  for (size_t i = 0; i < seqs_.size(); ++i) {
    const StepSeq& s = seqs_[i];
    b.add(s.request_id,
          std::span<const int32_t>(token_ids_.data() + s.token_begin,
                                   static_cast<size_t>(s.num_tokens)),
          s.start_pos, s.slot, pages(i), s.num_samples, s.source, s.snapshot);
    if (s.save_snapshot >= 0) b.save_snapshot(s.save_snapshot);
    if (s.mid_snapshot >= 0) b.save_snapshot_at(s.mid_snapshot_at, s.mid_snapshot);
  }
  const int32_t zero = 0;
  for (int32_t r = 0; r < rows; ++r) b.add(0, {&zero, 1}, 0, slot, {&page, 1}, 1);
  return b.build();
}

StepBatchBuilder& StepBatchBuilder::add(uint64_t request_id, std::span<const int32_t> tokens,
                                        int32_t start_pos, int32_t slot,
                                        std::span<const int32_t> pages, int32_t num_samples,
                                        StateSource source, int32_t snapshot) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  DS_CHECK(n > 0, "a sequence of a step has at least one token");
  DS_CHECK(num_samples >= 0 && num_samples <= n, "sampled rows out of range");
  DS_CHECK(start_pos >= 0 && slot >= 0, "negative position or slot");
  DS_CHECK((source == StateSource::kFresh) == (start_pos == 0),
           "a fresh state is exactly a sequence at position 0");
  DS_CHECK(source != StateSource::kSnapshot || snapshot >= 0, "snapshot source without a snapshot");
  DS_CHECK(b_.page_size_ <= 0 ||
               static_cast<int64_t>(pages.size()) * b_.page_size_ >= int64_t{start_pos} + n,
           "page table too short");
  StepSeq s;
  s.request_id = request_id;
  s.token_begin = b_.num_tokens();
  s.num_tokens = n;
  s.start_pos = start_pos;
  s.slot = slot;
  s.source = source;
  s.snapshot = snapshot;
  s.sample_begin = static_cast<int32_t>(b_.sample_rows_.size());
  s.num_samples = num_samples;
  for (int32_t i = 0; i < n; ++i) {
    b_.token_ids_.push_back(tokens[static_cast<size_t>(i)]);
    b_.positions_.push_back(start_pos + i);
  }
  for (int32_t i = n - num_samples; i < n; ++i) b_.sample_rows_.push_back(s.token_begin + i);
  b_.page_ids_.insert(b_.page_ids_.end(), pages.begin(), pages.end());
  b_.page_offsets_.push_back(static_cast<int32_t>(b_.page_ids_.size()));
  b_.seqs_.push_back(s);
  return *this;
}

StepBatchBuilder& StepBatchBuilder::save_snapshot(int32_t slot) {
  DS_CHECK(!b_.seqs_.empty() && slot >= 0, "save_snapshot: no sequence or a negative slot");
  b_.seqs_.back().save_snapshot = slot;
  return *this;
}

StepBatchBuilder& StepBatchBuilder::save_snapshot_at(int32_t at, int32_t slot) {
  DS_CHECK(!b_.seqs_.empty() && slot >= 0, "save_snapshot_at: no sequence or a negative slot");
  StepSeq& s = b_.seqs_.back();
  DS_CHECK(at > 0 && at < s.num_tokens && at % kSnapshotChunk == 0,
           "an in-step snapshot lies on a 64-token boundary inside the step");
  s.mid_snapshot = slot;
  s.mid_snapshot_at = at;
  return *this;
}

StepBatchBuilder& StepBatchBuilder::add_rows(uint64_t request_id, std::span<const int32_t> tokens,
                                             int32_t start_pos, int32_t slot,
                                             std::span<const int32_t> pages,
                                             std::span<const int32_t> sample_offsets) {
  add(request_id, tokens, start_pos, slot, pages, 0);
  StepSeq& s = b_.seqs_.back();
  int32_t prev = -1;
  for (int32_t off : sample_offsets) {
    DS_CHECK(off > prev && off < s.num_tokens, "sample rows ascending within the sequence");
    b_.sample_rows_.push_back(s.token_begin + off);
    prev = off;
  }
  s.num_samples = static_cast<int32_t>(sample_offsets.size());
  return *this;
}

StepBatchBuilder& StepBatchBuilder::reserve(int64_t tokens, int64_t seqs, int64_t pages) {
  const auto n = [](int64_t v) { return static_cast<size_t>(std::max<int64_t>(v, 0)); };
  b_.token_ids_.reserve(n(tokens));
  b_.positions_.reserve(n(tokens));
  b_.seqs_.reserve(n(seqs));
  b_.page_offsets_.reserve(n(seqs) + 1);
  b_.page_ids_.reserve(n(pages));
  b_.sample_rows_.reserve(n(seqs));
  return *this;
}

StepBatch StepBatchBuilder::build() {
  b_.id_ = next_batch_id.fetch_add(1);
  StepBatch out = std::move(b_);
  b_ = StepBatch();
  b_.page_size_ = out.page_size_;
  return out;
}

}  // namespace deltaserve
