// TPSP's microchunk pipeline (docs/tp.md): a stretch of a step — from a mixer's row-parallel
// projection through the MLP to the next mixer's input projections — run as stages over the
// step's microchunks, alternating between compute on the backend's main stream (GEMMs, add + norm)
// and collectives on its side stream (reduce-scatter, all-gather). Stages are issued breadth first
// (every chunk of one stage, then the next stage); chunk c of a stage waits only for chunk c of the
// stage before it, so the GEMM of chunk c + 1 runs while chunk c's collective is in flight.
// Events come in two slots (the previous stage's and the current stage's, one per chunk); a stage
// re-records the slot of the stage before last once its waits on it are enqueued.
// With one chunk (no pipeline, or a step that is not token-sharded) every stage runs its op once on
// the main stream with no events: the conventional path, unchanged.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "dist/parallel.h"

namespace deltaserve::model {

class MicrochunkPipeline {
 public:
  // `overlap`: stages on the two streams (with more than one chunk); else everything in order on
  // the main stream.
  MicrochunkPipeline(backend::Backend& be, std::vector<dist::RowRange> chunks, bool overlap = true)
      : be_(be), chunks_(std::move(chunks)), overlap_(overlap && chunks_.size() > 1) {}
  // Joins if the stages did not (an op threw): back on the main stream, errors swallowed (the
  // step fails with the op's error).
  ~MicrochunkPipeline() {
    try {
      be_.use_side_stream(false);
      join();
    } catch (...) {
    }
  }
  MicrochunkPipeline(const MicrochunkPipeline&) = delete;
  MicrochunkPipeline& operator=(const MicrochunkPipeline&) = delete;

  // op(chunk) for every chunk on the main stream (compute).
  template <class Op>
  void compute(Op&& op) {
    stage(false, op);
  }
  // op(chunk) for every chunk on the side stream (collectives).
  template <class Op>
  void communicate(Op&& op) {
    stage(true, op);
  }
  // The main stream waits for everything the pipeline enqueued (before ops on the whole step, and
  // before a captured graph ends: the side stream joins the main one).
  void join() {
    if (overlap_ && started_ && last_side_) be_.wait_event(event(parity_ ^ 1, chunks_.size() - 1));
    started_ = false;
  }

 private:
  // Event of chunk c in slot p (0 / 1); number 0 is the start mark.
  int event(int p, size_t c) const {
    return 1 + p * static_cast<int>(chunks_.size()) + static_cast<int>(c);
  }

  template <class Op>
  void stage(bool side, Op& op) {
    if (!overlap_) {
      for (const dist::RowRange& c : chunks_) op(c);
      return;
    }
    if (!started_ && side) be_.record_event(0);  // where the main stream is now
    be_.use_side_stream(side);
    for (size_t c = 0; c < chunks_.size(); ++c) {
      if (!started_) {
        if (side && c == 0) be_.wait_event(0);
      } else if (side != last_side_) {
        be_.wait_event(event(parity_ ^ 1, c));  // chunk c of the previous stage (other stream)
      }
      op(chunks_[c]);
      be_.record_event(event(parity_, c));
    }
    be_.use_side_stream(false);
    started_ = true;
    last_side_ = side;
    parity_ ^= 1;
  }

  backend::Backend& be_;
  std::vector<dist::RowRange> chunks_;
  bool overlap_;
  bool started_ = false;  // a stage ran since the last join
  bool last_side_ = false;
  int parity_ = 0;  // the slot the next stage records into
};

}  // namespace deltaserve::model
