// CudaBackend::sample: the step's sampling parameters and penalty entries staged on the host and
// uploaded, the sampling kernels (kernels/sampling.cuh), the tokens and logprobs downloaded.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_detail.h"
#include "backend/cuda/kernels/sampling.cuh"

namespace deltaserve::backend {

using cuda_detail::bf;
using cuda_detail::check;

std::vector<Sampled> CudaBackend::sample(const Tensor& logits, int32_t vocab,
                                         const std::vector<SampleSpec>& specs) {
  OpTimer timer(*this, "sample");
  const int R = static_cast<int>(specs.size());
  DS_CHECK(logits.ndim == 2 && logits.dim(0) == R && vocab >= 1 && vocab <= logits.dim(1),
           "sample: logits [R, V] with one spec per row");
  std::vector<Sampled> out(static_cast<size_t>(R));
  if (R == 0) return out;
  // Host staging: row parameters, then every row's penalty entries sorted by token.
  std::vector<cuda::SampleRowParams> params(static_cast<size_t>(R));
  std::vector<cuda::SampleAdj> adj;
  struct Event {
    int32_t token, kind;  // 0 prompt, 1 output, 2 banned, 3 bias
    float bias;
    bool operator<(const Event& o) const { return token < o.token; }
  };
  std::vector<Event> ev;
  for (int r = 0; r < R; ++r) {
    const SampleSpec& s = specs[static_cast<size_t>(r)];
    DS_CHECK(s.num_logprobs <= kMaxTopLogprobs, "at most 20 top logprobs");
    ev.clear();
    if (s.repetition_penalty != 1.0f)
      for (int32_t t : s.prompt_tokens) ev.push_back({t, 0, 0.0f});
    for (int32_t t : s.output_tokens) ev.push_back({t, 1, 0.0f});
    for (int32_t t : s.banned) ev.push_back({t, 2, 0.0f});
    for (const auto& [t, b] : s.bias) ev.push_back({t, 3, b});
    std::stable_sort(ev.begin(), ev.end());
    const int32_t begin = static_cast<int32_t>(adj.size());
    for (const Event& e : ev) {
      if (e.token < 0 || e.token >= vocab) continue;
      if (adj.size() == static_cast<size_t>(begin) || adj.back().token != e.token)
        adj.push_back({e.token, 0, 0, 0.0f});
      if (e.kind == 0) adj.back().flags |= cuda::kAdjInPrompt;
      if (e.kind == 1) ++adj.back().out_count;
      if (e.kind == 2) adj.back().flags |= cuda::kAdjBanned;
      if (e.kind == 3) adj.back().bias += e.bias;
    }
    params[static_cast<size_t>(r)] = {s.temperature,
                                      s.top_p,
                                      s.min_p,
                                      s.repetition_penalty,
                                      s.presence_penalty,
                                      s.frequency_penalty,
                                      sample_uniform(s.seed, s.counter),
                                      s.top_k,
                                      s.num_logprobs,
                                      begin,
                                      static_cast<int32_t>(adj.size()) - begin};
  }
  const size_t pbytes = params.size() * sizeof(cuda::SampleRowParams);
  const size_t in_bytes = pbytes + std::max<size_t>(adj.size(), 1) * sizeof(cuda::SampleAdj);
  char* host_in = sample_host_in_.reserve(in_bytes);
  std::memcpy(host_in, params.data(), pbytes);
  if (!adj.empty()) std::memcpy(host_in + pbytes, adj.data(), adj.size() * sizeof(cuda::SampleAdj));
  const size_t kOutPerRow = 2 + 2 * cuda::kSampleMaxTop;  // token, logprob, top ids, top lps
  const size_t out_bytes = static_cast<size_t>(R) * kOutPerRow * 4;
  // Brought back: the tokens and logprobs, and the top lists only when a row asks for them.
  const bool tops = std::any_of(specs.begin(), specs.end(),
                                [](const SampleSpec& s) { return s.num_logprobs > 0; });
  const size_t back_bytes = tops ? out_bytes : static_cast<size_t>(R) * 8;
  auto grow = [](void*& buf, size_t& cap, size_t need) {
    if (need <= cap) return;
    if (buf) cudaFree(buf);
    cap = std::max(need, 2 * cap);
    check(cudaMalloc(&buf, cap), "cudaMalloc (sampling)");
  };
  // The row statistics' workspace follows the uploaded parameters, 16-byte aligned.
  const size_t stats_at = (in_bytes + 15) / 16 * 16;
  grow(sample_in_, sample_in_cap_,
       stats_at +
           static_cast<size_t>(R) * cuda::sample_slices(vocab) * sizeof(cuda::SampleRowStats));
  grow(sample_out_, sample_out_cap_, out_bytes);
  check(cudaMemcpyAsync(sample_in_, host_in, in_bytes, cudaMemcpyHostToDevice, stream_),
        "sample upload");
  char* o = static_cast<char*>(sample_out_);
  auto* tok = reinterpret_cast<int32_t*>(o);
  auto* lp = reinterpret_cast<float*>(o + static_cast<size_t>(R) * 4);
  auto* top_ids = reinterpret_cast<int32_t*>(o + static_cast<size_t>(R) * 8);
  auto* top_lp =
      reinterpret_cast<float*>(o + static_cast<size_t>(R) * (8 + 4 * cuda::kSampleMaxTop));
  cuda::launch_sample(
      bf(logits), logits.dim(1), vocab, R, static_cast<const cuda::SampleRowParams*>(sample_in_),
      reinterpret_cast<const cuda::SampleAdj*>(static_cast<char*>(sample_in_) + pbytes),
      reinterpret_cast<cuda::SampleRowStats*>(static_cast<char*>(sample_in_) + stats_at), tok, lp,
      top_ids, top_lp, stream_);
  check(cudaGetLastError(), "sample launch");
  char* h = sample_host_out_.reserve(out_bytes);
  check(cudaMemcpyAsync(h, o, back_bytes, cudaMemcpyDeviceToHost, stream_), "sample download");
  check(cudaStreamSynchronize(stream_), "sample sync");
  const auto* ht = reinterpret_cast<const int32_t*>(h);
  const auto* hl = reinterpret_cast<const float*>(h + static_cast<size_t>(R) * 4);
  const auto* hti = reinterpret_cast<const int32_t*>(h + static_cast<size_t>(R) * 8);
  const auto* htl =
      reinterpret_cast<const float*>(h + static_cast<size_t>(R) * (8 + 4 * cuda::kSampleMaxTop));
  for (int r = 0; r < R; ++r) {
    Sampled& s = out[static_cast<size_t>(r)];
    s.token = ht[r];
    const int n = specs[static_cast<size_t>(r)].num_logprobs;
    if (n < 0) continue;
    s.logprob = hl[r];
    for (int k = 0; k < n; ++k)
      s.top.emplace_back(hti[r * cuda::kSampleMaxTop + k], htl[r * cuda::kSampleMaxTop + k]);
  }
  return out;
}

}  // namespace deltaserve::backend
