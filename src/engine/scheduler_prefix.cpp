// The scheduler's prefix-cache half: resuming admitted requests from the cache, where prefills
// must end a chunk so a snapshot lands there, which steps save snapshots, and indexing what a
// step computed.
#include <algorithm>

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

Scheduler::ChunkPlan Scheduler::plan_chunk(Request* r, int32_t n) {
  ChunkPlan plan{n, 0};
  if (!cache_.prefix_caching()) return plan;
  const int32_t from = r->num_computed;
  // A long chunk cut short by the budget ends on a chunk multiple, so that the next one starts on
  // the grid and the snapshot points inside it can be in-step snapshots (no extra step).
  const int32_t end = from + n;
  if (end < static_cast<int32_t>(r->tokens.size()) && n >= 4 * kSnapshotChunk &&
      end % kSnapshotChunk != 0)
    n = plan.tokens = end / kSnapshotChunk * kSnapshotChunk - from;
  std::vector<int32_t> inside;  // snapshot points strictly inside the chunk still worth taking
  for (const int32_t cut : r->snapshot_cuts)
    if (cut > from && cut < from + n && !snapshot_exists(r, cut)) inside.push_back(cut);
  if (inside.empty()) return plan;
  if (inside.size() == 1 && (inside[0] - from) % kSnapshotChunk == 0)
    plan.mid_at = inside[0] - from;
  else
    plan.tokens = inside[0] - from;
  return plan;
}

bool Scheduler::snapshot_exists(Request* r, int32_t end) {
  cache::extend_block_hashes(r->block_hashes, r->tokens, cache_.page_size());
  return cache_.has_snapshot(r->block_hashes[static_cast<size_t>(end / cache_.page_size() - 1)]);
}

int32_t Scheduler::snapshot_slot_at(Request* r, int32_t end) {
  if (!cache_.prefix_caching() || end % cfg_.snapshot_every != 0 || snapshot_exists(r, end))
    return -1;
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
  if (s.mid_snapshot >= 0)
    cache_.file_snapshot(
        r->block_hashes[static_cast<size_t>((s.start_pos + s.mid_snapshot_at) / P - 1)],
        s.mid_snapshot);
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
