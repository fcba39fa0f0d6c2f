// The scheduler's prefix-cache half: resuming admitted requests from the cache, where prefills
// must end a chunk so a snapshot lands there, which steps save snapshots, and indexing what a
// step computed.
#include <algorithm>
#include <limits>

#include "core/error.h"
#include "engine/scheduler.h"

namespace deltaserve::engine {

void Scheduler::resume_from_cache(Request* r) {
  r->snapshot_cuts.clear();
  if (!cache_.prefix_caching()) return;
  const int32_t P = cache_.page_size(), S = cfg_.snapshot_every;
  const int32_t L = static_cast<int32_t>(r->tokens.size());
  cache::extend_block_hashes(r->block_hashes, r->tokens, P);
  const cache::PrefixHit hit = cache_.lookup(r->block_hashes, r->tokens, L - 1, S);
  if (hit.tokens > 0) {
    cache_.adopt(hit, r->block_hashes, r->pages);
    r->restore_block = r->block_hashes[static_cast<size_t>(hit.tokens / P - 1)];
    r->restore_snapshot = hit.snapshot;
    r->num_computed = hit.tokens;
    r->num_indexed = hit.tokens / P;
  }
  // Snapshot points: where this prompt's KV leaves the cache (the next request sharing that
  // prefix resumes there) and the last grid point before the prompt's end (a repeat of this
  // prompt resumes there).
  const int32_t junction = std::min(hit.kv_tokens, L - 1) / S * S;
  const int32_t prompt_end = (L - 1) / S * S;
  for (const int32_t cut : {junction, prompt_end})
    if (cut > hit.tokens && (r->snapshot_cuts.empty() || r->snapshot_cuts.back() < cut))
      r->snapshot_cuts.push_back(cut);
}

void Scheduler::forget_resume(Request* r) {
  if (r->num_computed == 0 || r->status != RequestStatus::kWaiting) return;
  release_restore(r);
  cache_.release_pages(r->pages);
  r->num_computed = 0;
  r->num_indexed = 0;
  r->snapshot_cuts.clear();
}

void Scheduler::release_restore(Request* r) {
  if (r->restore_snapshot < 0) return;
  cache_.release_hit(r->restore_block);
  r->restore_snapshot = -1;
  r->restore_block = 0;
}

int32_t Scheduler::tokens_to_cut(const Request* r) const {
  for (const int32_t cut : r->snapshot_cuts)
    if (cut > r->num_computed) return cut - r->num_computed;
  return std::numeric_limits<int32_t>::max();
}

int32_t Scheduler::snapshot_slot_at(Request* r, int32_t end) {
  if (!cache_.prefix_caching() || end % cfg_.snapshot_every != 0) return -1;
  cache::extend_block_hashes(r->block_hashes, r->tokens, cache_.page_size());
  const uint64_t block = r->block_hashes[static_cast<size_t>(end / cache_.page_size() - 1)];
  if (cache_.has_snapshot(block)) return -1;
  return cache_.take_snapshot_slot();
}

void Scheduler::commit_prefix(Request* r, const StepSeq& s) {
  release_restore(r);
  if (!cache_.prefix_caching()) return;
  const int32_t P = cache_.page_size();
  cache::extend_block_hashes(r->block_hashes, r->tokens, P);
  const int32_t full = std::min(r->num_computed / P, static_cast<int32_t>(r->block_hashes.size()));
  cache_.index_blocks(r->block_hashes, r->tokens, r->pages, r->num_indexed, full);
  r->num_indexed = std::max(r->num_indexed, full);
  if (s.save_snapshot < 0) return;
  const uint64_t block = r->block_hashes[static_cast<size_t>(r->num_computed / P - 1)];
  cache_.file_snapshot(block, s.save_snapshot);
  if (r->num_computed > r->num_prompt) {  // a decode snapshot: only the latest is kept
    if (r->decode_snapshot_block != 0 && r->decode_snapshot_block != block)
      cache_.drop_snapshot(r->decode_snapshot_block);
    r->decode_snapshot_block = block;
  }
}

}  // namespace deltaserve::engine
