// Qwen35Model: the Qwen3.5 text forward, written once against backend::Backend. One call runs one
// step: a batch of sequences, each a prefill chunk or a decode token at its own position with its
// own KV pages and state slot.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "dist/communicator.h"
#include "model/config.h"
#include "model/weights.h"

namespace deltaserve::model {

struct ForwardBatch {
  std::vector<int32_t> token_ids;      // [T], the sequences' new tokens back to back
  std::vector<backend::SeqDesc> seqs;  // token_begin/num_tokens index token_ids
  std::vector<int32_t> logits_rows;    // rows of token_ids whose logits are returned
};

class Qwen35Model {
 public:
  // `cfg` is the config the weights have (rank-local under tensor parallelism); `comm` (null for
  // one rank) all-reduces the outputs of the row-parallel projections o_proj, GDN out_proj and
  // down_proj — the only collectives of a layer.
  Qwen35Model(const ModelConfig& cfg, backend::Backend& be, ModelWeights weights,
              dist::Communicator* comm = nullptr);
  ~Qwen35Model();

  // Allocates the paged KV cache of the full-attention layers and the GDN state slots (plus one
  // page and one slot of its own, which padded graph rows write to).
  void allocate_cache(int32_t num_pages, int32_t page_size, int32_t num_slots);

  // Captures decode graphs for the batch sizes `buckets` on backends that have graphs (else does
  // nothing). Steps of up to `max_tokens` tokens and `max_seqs` sequences with page tables of up to
  // `max_pages_per_seq` pages keep every buffer a graph uses in place. A later decode-only step
  // (one token per sequence, logits for every row in order) of S sequences replays the smallest
  // bucket >= S with padding rows; other steps run eagerly. Needs allocate_cache first.
  void capture_decode_graphs(std::vector<int32_t> buckets, int64_t max_tokens, int32_t max_seqs,
                             int32_t max_pages_per_seq);
  // Graph buckets currently usable (empty when none were captured or they were dropped).
  std::vector<int32_t> graph_buckets() const;
  // Turns graph replay off (true) or back on for steps that follow.
  void set_eager(bool eager) { eager_ = eager; }

  // Runs one step. Preconditions: allocate_cache was called; every sequence's pages cover
  // [0, start_pos + num_tokens); slots are distinct; ids < vocab. Returns logits
  // [logits_rows.size(), vocab] in f32, row-major.
  std::vector<float> forward(const ForwardBatch& batch);
  // The same step, its logits left on the backend (for ranks whose logits nobody reads); returns
  // the number of logits rows.
  int64_t compute(const ForwardBatch& batch);
  // The same step, then one token per logits row sampled on the backend (specs[i] for
  // logits_rows[i]; ids < vocab).
  std::vector<backend::Sampled> forward_sample(const ForwardBatch& batch, int32_t vocab,
                                               const std::vector<backend::SampleSpec>& specs);

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  backend::Backend& backend() const { return be_; }
  int32_t page_size() const { return page_size_; }
  int32_t num_pages() const { return num_pages_; }
  int32_t num_slots() const { return num_slots_; }

 private:
  struct LayerCache {
    Buffer k, v;         // full attention: [pages, page_size, nkv, hd]
    Buffer conv, state;  // GDN: [slots, conv_dim, K-1], [slots, nv, dk, dv]
  };
  struct Scratch;
  struct StepViews;
  // Grows the step buffers to hold `tokens` rows and `rows` logits rows (kept between steps).
  void ensure_scratch(int64_t tokens, int64_t rows);

  // Runs the layers and lm_head for a prepared step of T tokens whose R logits rows are in
  // scratch out[0, R) (gathered from rows row_ids unless `identity_rows`).
  void run_step(int64_t T, int64_t R, bool identity_rows);

  void full_attention(int64_t i, const Tensor& h, const StepViews& s, const Tensor& out);
  void gated_deltanet(int64_t i, const Tensor& h, const StepViews& s, const Tensor& out);

  ModelConfig cfg_;
  backend::Backend& be_;
  ModelWeights w_;
  dist::Communicator* comm_;
  backend::AttnDims attn_dims_{};
  backend::GdnDims gdn_dims_{};
  std::vector<LayerCache> cache_;
  std::unique_ptr<Scratch> scratch_;
  int32_t page_size_ = 0, num_pages_ = 0, num_slots_ = 0;
  std::vector<std::pair<int32_t, int>> graphs_;  // (batch size, backend graph id), ascending
  bool eager_ = false;
};

}  // namespace deltaserve::model
