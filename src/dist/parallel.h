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

class Parallel {
 public:
  Parallel() = default;
  // `comm` (null for one rank without collectives) must outlive this object.
  Parallel(ParallelConfig cfg, Communicator* comm) : cfg_(cfg), comm_(comm) {}

  const ParallelConfig& config() const { return cfg_; }
  int degree() const { return cfg_.degree; }
  int rank() const { return cfg_.rank; }
  bool has_collectives() const { return comm_ != nullptr; }

  // A row-parallel projection (attention o_proj, GDN out_proj, MLP down_proj) leaves each rank a
  // partial sum of its output [T, H]; this makes it the full sum on every rank (all-reduce).
  void reduce_row_parallel_output(const Tensor& partial) const {
    if (comm_) comm_->all_reduce_sum(partial);
  }
  // The input [T, H] of a column-parallel projection: every rank already holds the whole
  // (replicated) residual stream, so there is nothing to do — the TPSP seam, where it would be
  // all-gathered from token shards.
  void column_parallel_input(const Tensor& x) const { (void)x; }
  // The residual stream [T, H] after each rank looked up the ids of its vocabulary slice (zeros
  // for the rest): the sum over ranks is the whole embedding (all-reduce).
  void reduce_embedding(const Tensor& x) const {
    if (comm_) comm_->all_reduce_sum(x);
  }
  // Each rank's logits of its vocabulary slice [R, rows] -> every rank's, [degree * R, rows] in
  // rank order (all-gather; dist/vocab_parallel.h says how they become whole rows).
  void gather_vocab_shards(const Tensor& shard, const Tensor& gathered) const {
    if (comm_) comm_->all_gather(shard, gathered);
  }

 private:
  ParallelConfig cfg_;
  Communicator* comm_ = nullptr;
};

}  // namespace deltaserve::dist
