// The parallel layer: which shard of the model this rank computes, and the named points where
// ranks meet. The model calls these helpers instead of raw collectives, so a new parallel scheme
// (TPSP's reduce-scatter / all-gather, a vocabulary-parallel lm_head) changes this layer, not the
// layers of the model. The embedding and lm_head are vocabulary-parallel under TP
// (vocab_parallel.h).
#pragma once

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
};

class Parallel {
 public:
  Parallel() = default;
  // `comm` (null for one rank without collectives) must outlive this object.
  Parallel(ParallelConfig cfg, Communicator* comm, TpspConfig tpsp = {})
      : cfg_(cfg), comm_(comm), tpsp_(tpsp) {}
  void set_tpsp(TpspConfig tpsp) { tpsp_ = tpsp; }

  // Whether a step of T tokens keeps the residual stream token-sharded (TPSP).
  bool token_sharded(int64_t T) const {
    return tpsp_.enabled && comm_ && cfg_.degree > 1 && T >= tpsp_.threshold_tokens &&
           T % cfg_.degree == 0;
  }
  // This rank's rows of a [T, ...] tensor under TPSP: [rank * T / N, (rank + 1) * T / N).
  Tensor token_shard(const Tensor& t) const {
    const int64_t rows = t.dim(0) / cfg_.degree;
    return t.rows(cfg_.rank * rows, (cfg_.rank + 1) * rows);
  }
  // TPSP: the partial sums [T, H] of a row-parallel projection -> the full sums of this rank's
  // token shard (in place: token_shard(partial); reduce-scatter).
  void scatter_row_parallel_output(const Tensor& partial) const {
    comm_->reduce_scatter_sum(partial, token_shard(partial));
  }
  // TPSP: every rank's token shard of `full` [T, H] into all of it (in place; all-gather).
  void gather_token_shards(const Tensor& full) const { comm_->all_gather(token_shard(full), full); }

  const ParallelConfig& config() const { return cfg_; }
  int degree() const { return cfg_.degree; }
  int rank() const { return cfg_.rank; }
  bool has_collectives() const { return comm_ != nullptr; }

  // A row-parallel projection (attention o_proj, GDN out_proj, MLP down_proj) leaves each rank a
  // partial sum of its output [T, H]; this makes it the full sum on every rank (all-reduce).
  void reduce_row_parallel_output(const Tensor& partial) const {
    if (comm_) comm_->all_reduce_sum(partial);
  }
  // The input [T, H] of a column-parallel projection: the whole of it on every rank — already
  // there when the stream is replicated, all-gathered from the token shards under TPSP.
  void column_parallel_input(const Tensor& x, bool token_sharded) const {
    if (token_sharded) gather_token_shards(x);
  }
  // The residual stream [T, H] after each rank looked up the ids of its vocabulary slice (zeros
  // for the rest): the sum over ranks is the whole embedding (all-reduce; under TPSP only the
  // rank's token shard of it is needed: reduce-scatter).
  void reduce_embedding(const Tensor& x, bool token_sharded) const {
    if (token_sharded)
      scatter_row_parallel_output(x);
    else if (comm_ && cfg_.degree > 1)
      comm_->all_reduce_sum(x);
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
