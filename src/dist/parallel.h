// The parallel layer: which shard of the model this rank computes, and the named points where
// ranks meet. The model calls these helpers instead of raw collectives, so a new parallel scheme
// (TPSP's reduce-scatter / all-gather, a vocabulary-parallel lm_head) changes this layer, not the
// layers of the model. The embedding and lm_head are vocabulary-parallel under TP
// (vocab_parallel.h).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "dist/communicator.h"

namespace deltaserve::dist {

// The tensor-parallel degree and this rank (shapes stay global in the config; a rank derives its
// shard from these).
struct ParallelConfig {
  int degree = 1;
  int rank = 0;
};

// TPSP: around the row-parallel projections, reduce-scatter -> residual add + RMSNorm on this
// rank's 1/N of the tokens -> all-gather before the next column-parallel input, in place of
// all-reduce -> the same add + norm on every rank (docs/tp.md). Steps of fewer tokens than the
// threshold, or whose token count the degree does not divide, run the conventional path.
struct TpspConfig {
  bool enabled = false;
  int64_t threshold_tokens = 1024;  // 0: every step it can run
  // The microchunk pipeline: a TPSP step's tokens in consecutive chunks of this many (a multiple
  // of the degree; the last may be shorter), the GEMMs of one chunk overlapping the collectives of
  // another on a second stream (model/microchunk_pipeline.h). 0: the whole step is one chunk.
  int64_t microchunk_tokens = 0;
  // false: the microchunks run one after another on the main stream (tests tell the two streams'
  // ordering apart from the chunking this way).
  bool overlap_streams = true;
};

// Rows [begin, end) of a step's tokens.
struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

class Parallel {
 public:
  Parallel() = default;
  // `comm` (null for one rank without collectives) must outlive this object.
  // Throws deltaserve::Error for a microchunk size the degree does not divide.
  Parallel(ParallelConfig cfg, Communicator* comm, TpspConfig tpsp = {}) : cfg_(cfg), comm_(comm) {
    set_tpsp(tpsp);
  }
  void set_tpsp(TpspConfig tpsp) {
    if (tpsp.microchunk_tokens < 0 || tpsp.microchunk_tokens % cfg_.degree != 0)
      throw Error("the TPSP microchunk size (" + std::to_string(tpsp.microchunk_tokens) +
                  " tokens) must be a multiple of the tensor-parallel size " +
                  std::to_string(cfg_.degree));
    tpsp_ = tpsp;
  }
  const TpspConfig& tpsp() const { return tpsp_; }

  // Whether a step of T tokens keeps the residual stream token-sharded (TPSP).
  bool token_sharded(int64_t T) const {
    return tpsp_.enabled && comm_ && cfg_.degree > 1 && T >= tpsp_.threshold_tokens &&
           T % cfg_.degree == 0;
  }
  // The microchunks of a step of T tokens: when it is token-sharded and the microchunk size is
  // below T, chunks of that many rows (the last may be shorter; each a multiple of the degree
  // since T and the size are); otherwise the whole step.
  std::vector<RowRange> microchunks(int64_t T) const {
    const int64_t m = tpsp_.microchunk_tokens;
    if (!token_sharded(T) || m <= 0 || m >= T) return {{0, T}};
    std::vector<RowRange> chunks;
    for (int64_t b = 0; b < T; b += m) chunks.push_back({b, std::min(b + m, T)});
    return chunks;
  }
  // This rank's token shard of microchunk c under TPSP: the rank's 1/N of c's rows, in rank order.
  // (Without microchunks c is the whole step: rows [rank * T / N, (rank + 1) * T / N).)
  RowRange shard(RowRange c) const {
    const int64_t n = c.size() / cfg_.degree;
    return {c.begin + cfg_.rank * n, c.begin + (cfg_.rank + 1) * n};
  }
  // The rows of `t` this rank adds and normalises in chunk c: its shard under TPSP, else all of c.
  Tensor own_rows(const Tensor& t, RowRange c, bool sharded) const {
    const RowRange r = sharded ? shard(c) : c;
    return t.rows(r.begin, r.end);
  }

  const ParallelConfig& config() const { return cfg_; }
  int degree() const { return cfg_.degree; }
  int rank() const { return cfg_.rank; }
  bool has_collectives() const { return comm_ != nullptr; }

  // A row-parallel projection (attention o_proj, GDN out_proj, MLP down_proj) leaves each rank a
  // partial sum of its output rows c of [T, H]: the full sum on every rank (all-reduce), or under
  // TPSP the full sums of this rank's shard of c (reduce-scatter, in place).
  void reduce_row_parallel_output(const Tensor& partial, RowRange c, bool token_sharded) const {
    const Tensor rows = partial.rows(c.begin, c.end);
    if (token_sharded)
      comm_->reduce_scatter_sum(rows, own_rows(partial, c, true));
    else if (comm_)
      comm_->all_reduce_sum(rows);
  }
  // The input rows c of [T, H] of a column-parallel projection: all of them on every rank —
  // already there when the stream is replicated, all-gathered from the token shards under TPSP.
  void column_parallel_input(const Tensor& x, RowRange c, bool token_sharded) const {
    if (token_sharded) comm_->all_gather(own_rows(x, c, true), x.rows(c.begin, c.end));
  }
  // The residual stream's rows c after each rank looked up the ids of its vocabulary slice (zeros
  // for the rest): the sum over ranks is the whole embedding (all-reduce; under TPSP only the
  // rank's shard of it is needed: reduce-scatter).
  void reduce_embedding(const Tensor& x, RowRange c, bool token_sharded) const {
    if (token_sharded || (comm_ && cfg_.degree > 1))
      reduce_row_parallel_output(x, c, token_sharded);
  }
  // Each rank's logits of its vocabulary slice [R, rows] -> every rank's, [degree * R, rows] in
  // rank order (all-gather; dist/vocab_parallel.h says how they become whole rows).
  void gather_vocab_shards(const Tensor& shard, const Tensor& gathered) const {
    if (comm_) comm_->all_gather(shard, gathered);
  }

 private:
  ParallelConfig cfg_;
  Communicator* comm_ = nullptr;
  TpspConfig tpsp_;
};

}  // namespace deltaserve::dist
