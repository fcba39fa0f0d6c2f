#include "engine/engine.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "engine/output_constraint.h"
#include "engine/tpsp_profile.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve::engine {

using clock = std::chrono::steady_clock;

namespace {

double seconds(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

runtime::PlanLimits plan_limits(const EngineConfig& c, bool fit_max_model_len = false);
runtime::MemoryPlan plan_of(Executor& exec, const EngineConfig& c, bool fit_max_model_len = false);

// max_num_seqs 0: from the memory plan when the budget is a device share, else the fallback.
int32_t default_max_num_seqs(Executor& exec, const EngineConfig& c, bool fit_max_model_len) {
  if (!c.budget || c.budget->kind != runtime::MemoryBudget::Kind::kDeviceShare)
    return runtime::kFallbackMaxNumSeqs;
  return runtime::auto_max_num_seqs([&](int32_t n) {
    EngineConfig with = c;
    with.max_num_seqs = n;
    return exec.plan_memory(plan_limits(with, fit_max_model_len), *c.budget);
  });
}

EngineConfig resolve(EngineConfig c, Executor& exec, const tokenizer::Tokenizer* tok) {
  const model::ModelConfig& mc = exec.config();
  const bool fit = c.max_model_len == kFitMaxModelLen;
  if (c.max_model_len < 0 && !fit)
    throw Error("max_model_len must be positive (0: the model's, -1: what fits)");
  if (c.max_model_len <= 0) c.max_model_len = static_cast<int32_t>(mc.max_position_embeddings);
  if (c.max_model_len > mc.max_position_embeddings)
    throw Error("max_model_len " + std::to_string(c.max_model_len) +
                " exceeds the model's max_position_embeddings " +
                std::to_string(mc.max_position_embeddings));
  if (c.page_size <= 0 || c.max_num_seqs < 0 || c.max_num_batched_tokens <= 0 ||
      c.admission_reserve_tokens < 0)
    throw Error(
        "page_size and max_num_batched_tokens must be positive, max_num_seqs and "
        "admission_reserve_tokens not negative");
  if (c.mamba_block_size <= 0 || c.mamba_block_size % c.page_size != 0)
    throw Error("mamba_block_size " + std::to_string(c.mamba_block_size) +
                " must be a positive multiple of the page size " + std::to_string(c.page_size));
  const int32_t model_vocab = static_cast<int32_t>(mc.vocab_size);
  if (c.sample_vocab <= 0)
    c.sample_vocab = tok ? std::min(tok->vocab_size(), model_vocab) : model_vocab;
  c.sample_vocab = std::min(c.sample_vocab, model_vocab);
  if (c.eos_token_ids.empty()) c.eos_token_ids = mc.eos_token_ids;
  if (c.ssm_state_dtype != DType::kF32 && c.ssm_state_dtype != DType::kBF16)
    throw Error("the GDN state dtype must be float32 or bfloat16");
  if (c.max_num_seqs == 0) c.max_num_seqs = default_max_num_seqs(exec, c, fit);
  if (fit) {  // what one request's pages hold, where that is less
    const runtime::MemoryPlan p = plan_of(exec, c, true);
    c.max_model_len = static_cast<int32_t>(
        std::min<int64_t>(c.max_model_len, int64_t{p.num_pages} * p.page_size));
  }
  return c;
}

runtime::PlanLimits plan_limits(const EngineConfig& c, bool fit_max_model_len) {
  runtime::PlanLimits l;
  l.fit_max_model_len = fit_max_model_len;
  l.max_num_seqs = c.max_num_seqs;
  l.max_num_batched_tokens = c.max_num_batched_tokens;
  l.max_model_len = c.max_model_len;
  l.page_size = c.page_size;
  l.num_snapshots = c.num_snapshots;
  l.state_dtype = c.ssm_state_dtype;
  l.kv_cache_fp8 = c.kv_cache_fp8;
  const std::vector<int32_t> buckets = decode_graph_sizes(c);
  l.max_graph_batch = c.enforce_eager || buckets.empty() ? 0 : buckets.back();
  return l;
}

runtime::MemoryPlan plan_of(Executor& exec, const EngineConfig& c, bool fit_max_model_len) {
  runtime::MemoryBudget budget;
  budget.kind = runtime::MemoryBudget::Kind::kPages;
  budget.pages = c.num_pages;
  return exec.plan_memory(plan_limits(c, fit_max_model_len), c.budget ? *c.budget : budget);
}

}  // namespace

Engine::Engine(model::Qwen35Model& model, EngineConfig cfg, const tokenizer::Tokenizer* tok)
    : Engine(std::make_unique<LocalExecutor>(model), nullptr, cfg, tok) {}

Engine::Engine(Executor& exec, EngineConfig cfg, const tokenizer::Tokenizer* tok)
    : Engine(nullptr, &exec, cfg, tok) {}

Engine::Engine(std::unique_ptr<LocalExecutor> owned, Executor* exec, EngineConfig cfg,
               const tokenizer::Tokenizer* tok)
    : owned_exec_(std::move(owned)),
      exec_(exec ? *exec : *owned_exec_),
      cfg_(resolve(cfg, exec_, tok)),
      tok_(tok),
      plan_(plan_of(exec_, cfg_)),
      cache_({plan_.num_pages, plan_.page_size, plan_.num_slots, plan_.num_snapshots,
              cfg_.enable_prefix_caching && plan_.num_snapshots > 0}),
      scheduler_({cfg_.max_num_seqs, cfg_.max_num_batched_tokens, cfg_.mamba_block_size,
                  cfg_.long_prefill_token_threshold, cfg_.admission_reserve_tokens},
                 cache_),
      output_(cfg_.eos_token_ids, cfg_.max_model_len) {
  cfg_.num_pages = plan_.num_pages;
  cfg_.num_snapshots = plan_.num_snapshots;
  cfg_.enable_prefix_caching = cache_.prefix_caching();
  exec_.configure(plan_);
  // Prefill steps that fill the step budget run on the GEMM algorithms timed fastest for them.
  exec_.tune_linears(
      static_cast<int32_t>(std::min<int64_t>(cfg_.max_num_batched_tokens, plan_.scratch_tokens)));
  if (cfg_.profile_tpsp && exec_.degree() > 1) {  // before graphs capture the path it picks
    tpsp_profile_ =
        describe_tpsp_profile(profile_tpsp(exec_, cfg_.max_num_batched_tokens, *cfg_.profile_tpsp));
  }
  if (!cfg_.enforce_eager)
    exec_.capture_decode_graphs(decode_graph_sizes(cfg_),
                                (cfg_.max_model_len + cfg_.page_size - 1) / cfg_.page_size);
  metrics_.update([this](MetricsSnapshot& s) { s.kv_pages_total = cfg_.num_pages; });
  thread_ = std::thread([this] { loop(); });
}

std::vector<int32_t> decode_graph_sizes(const EngineConfig& cfg) {
  const int32_t top = std::min(cfg.max_num_seqs, cfg.max_graph_batch);
  std::vector<int32_t> out;
  for (int32_t b = 1; b < top;) {
    out.push_back(b);
    b = b < 8 ? 2 * b : b < 64 ? b + 8 : b < 128 ? b + 16 : b + 32;
  }
  if (top >= 1) out.push_back(top);
  return out;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string Engine::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::shared_ptr<RequestStream> Engine::submit(GenerateRequest req) {
  if (const std::string f = failure(); !f.empty())
    throw EngineFailedError("the engine has failed: " + f);
  if (const std::string e = req.params.validate(); !e.empty()) throw Error(e);
  if (req.prompt_ids.empty()) throw Error("the prompt is empty");
  for (int32_t id : req.prompt_ids)
    if (id < 0 || id >= exec_.config().vocab_size)
      throw Error("prompt token id " + std::to_string(id) + " is outside the vocabulary");
  const int64_t total = static_cast<int64_t>(req.prompt_ids.size()) + req.params.max_tokens;
  if (total > cfg_.max_model_len)
    throw Error("prompt (" + std::to_string(req.prompt_ids.size()) + " tokens) + max_tokens (" +
                std::to_string(req.params.max_tokens) + ") exceeds max_model_len " +
                std::to_string(cfg_.max_model_len));
  if (!req.params.stop.empty() && !tok_) throw Error("stop strings need a tokenizer");
  if (req.params.json && !tok_) throw Error("a JSON response_format needs a tokenizer");

  auto r = std::make_unique<Request>();
  r->id = next_id_++;
  r->num_prompt = static_cast<int32_t>(req.prompt_ids.size());
  r->tokens = std::move(req.prompt_ids);
  r->params = std::move(req.params);
  r->prefill_leader = req.prefill_leader;
  r->seed = r->params.seed ? *r->params.seed
                           : (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                 std::random_device{}() ^ (r->id * 0x9E3779B97F4A7C15ull);
  r->stream = std::make_shared<RequestStream>(r->id);
  if (tok_)
    r->detok =
        std::make_unique<tokenizer::IncrementalDetokenizer>(*tok_, r->params.skip_special_tokens);
  if (r->params.json)
    r->json = std::make_unique<JsonOutput>(r->params.json, r->params.constrain_after);
  r->arrival = clock::now();
  auto stream = r->stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.added.push_back(std::move(r));
  }
  cv_.notify_all();
  return stream;
}

void Engine::abort(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.aborted.push_back(id);
  }
  cv_.notify_all();
}

void Engine::loop() {
  for (;;) {
    Inbox in;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] {
        return stop_ || !inbox_.added.empty() || !inbox_.aborted.empty() || !requests_.empty();
      });
      if (stop_) break;
      std::swap(in, inbox_);
    }
    const auto begun = clock::now();  // the engine thread's work on this step from here
    for (auto& r : in.added) {
      if (!failure().empty()) {  // arrived while failing: one error delta, nothing scheduled
        OutputDelta d;
        d.finished = true;
        d.finish_reason = FinishReason::kError;
        d.error = "the engine has failed: " + failure();
        d.prompt_tokens = r->num_prompt;
        r->stream->push(std::move(d));
        continue;
      }
      metrics_.update([&](MetricsSnapshot& s) { s.prompt_tokens += r->num_prompt; });
      scheduler_.add(r.get());
      const uint64_t id = r->id;
      requests_[id] = std::move(r);
    }
    for (uint64_t id : in.aborted) {
      const auto it = requests_.find(id);
      if (it != requests_.end()) finish(*it->second, FinishReason::kAbort, OutputDelta{});
    }
    const ScheduledStep plan = scheduler_.schedule();
    metrics_.update([&](MetricsSnapshot& s) {
      s.running = static_cast<int64_t>(scheduler_.num_running());
      s.waiting = static_cast<int64_t>(scheduler_.num_waiting());
      s.kv_pages_used = cache_.num_pages() - cache_.num_available_pages();
      s.preemptions += static_cast<int64_t>(plan.preempted.size());
      s.prefix_cache_queries += plan.prefix_queried;
      s.prefix_cache_hits += plan.prefix_hit;
      s.prefix_cache_blocks = cache_.num_cached_blocks();
    });
    if (!plan.empty()) {
      try {
        const double forward = run_step(plan);
        const double all = seconds(begun, clock::now());
        metrics_.update([&](MetricsSnapshot& s) {
          s.forward_seconds += forward;
          s.host_seconds += all - forward;
        });
      } catch (const std::exception& e) {  // a device, rank or allocation fault: fail-stop
        fail_all(e.what());
      }
    }
  }
  for (auto& [id, r] : requests_) {
    OutputDelta d;
    d.finished = true;
    d.finish_reason = FinishReason::kAbort;
    d.prompt_tokens = r->num_prompt;
    d.completion_tokens = r->num_outputs();
    r->stream->push(std::move(d));
  }
}

double Engine::run_step(const ScheduledStep& step) {
  std::vector<backend::SampleSpec> specs;
  specs.reserve(step.batch.sample_rows().size());
  for (size_t i = 0; i < step.requests.size(); ++i)
    for (int32_t k = 0; k < step.batch.seq(i).num_samples; ++k)
      specs.push_back(sample_spec(*step.requests[i]));
  const auto forward_begun = clock::now();
  const std::vector<backend::Sampled> out =
      exec_.execute_sample(step.batch, cfg_.sample_vocab, specs);
  const double forward = seconds(forward_begun, clock::now());
  scheduler_.commit(step);
  metrics_.update([](MetricsSnapshot& s) { ++s.steps; });
  // Every request's tokens taken first, then every delta sent: the pushes (and the readers'
  // wake-ups their listeners cause) come together, not one between each request's output work.
  std::vector<SampledToken> tokens;
  std::vector<std::pair<Request*, ProcessedOutput>> outputs;
  outputs.reserve(step.requests.size());
  for (size_t i = 0; i < step.requests.size(); ++i) {
    const StepSeq& s = step.batch.seq(i);
    if (s.num_samples == 0) continue;
    tokens.clear();
    Request& r = *step.requests[i];
    for (int32_t k = 0; k < s.num_samples; ++k) {
      const backend::Sampled& o = out[static_cast<size_t>(s.sample_begin + k)];
      const int32_t token = constrained(r, tokens, scripted(r, k, o.token));
      tokens.push_back({token, TokenLogprob{token, o.logprob, o.top}});
    }
    outputs.emplace_back(step.requests[i], take_tokens(*step.requests[i], tokens));
  }
  for (auto& [r, output] : outputs) deliver(*r, std::move(output));
  return forward;
}

int32_t Engine::scripted(const Request& r, int32_t k, int32_t sampled) const {
  const auto& script = cfg_.debug_output_script;
  if (script.empty()) return sampled;
  const size_t at = static_cast<size_t>(r.num_outputs() + k);
  return at < script.size() ? script[at] : cfg_.eos_token_ids.at(0);
}

int32_t Engine::constrained(Request& r, std::span<const SampledToken> earlier, int32_t token) {
  if (r.json) {
    const std::vector<int32_t> ends = end_tokens(r);
    token = r.json->choose(vocab_trie(), ends, token);
    if (std::find(ends.begin(), ends.end(), token) == ends.end())
      r.json->take(token, tok_->token_bytes(token));
    return token;
  }
  if (r.params.forced_prefixes.empty()) return token;
  std::vector<int32_t> outputs(r.tokens.begin() + r.num_prompt, r.tokens.end());
  for (const SampledToken& t : earlier) outputs.push_back(t.token);
  return constrain_token(r.params, outputs, token);
}

std::vector<int32_t> Engine::end_tokens(const Request& r) const {
  std::vector<int32_t> e = cfg_.eos_token_ids;
  e.insert(e.end(), r.params.stop_token_ids.begin(), r.params.stop_token_ids.end());
  return e;
}

const structured::VocabTrie& Engine::vocab_trie() const {
  if (!vocab_trie_) {
    std::vector<std::string> bytes(static_cast<size_t>(tok_->vocab_size()));
    for (int32_t t = 0; t < tok_->vocab_size(); ++t)
      if (!tok_->is_special(t)) bytes[static_cast<size_t>(t)] = tok_->token_bytes(t);
    vocab_trie_ = std::make_unique<structured::VocabTrie>(bytes);
  }
  return *vocab_trie_;
}

backend::SampleSpec Engine::sample_spec(const Request& r) const {
  const SamplingParams& p = r.params;
  backend::SampleSpec s;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.repetition_penalty = p.repetition_penalty;
  s.presence_penalty = p.presence_penalty;
  s.frequency_penalty = p.frequency_penalty;
  s.seed = r.seed;
  s.counter = static_cast<uint64_t>(r.num_outputs());
  s.num_logprobs = p.logprobs || p.top_logprobs > 0 ? p.top_logprobs : -1;
  const auto prompt_end = r.tokens.begin() + r.num_prompt;
  if (p.repetition_penalty != 1.0f) s.prompt_tokens.assign(r.tokens.begin(), prompt_end);
  if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    s.output_tokens.assign(prompt_end, r.tokens.end());
  s.banned = banned_tokens(r);
  s.bias = p.logit_bias;
  for (const int32_t t : allowed_next_tokens(p, std::span(r.tokens).subspan(r.num_prompt)))
    s.bias.emplace_back(t, kForcedBias);
  if (r.json) r.json->restrict(vocab_trie(), end_tokens(r), s);
  return s;
}

std::vector<int32_t> Engine::banned_tokens(const Request& r) const {
  if (r.num_outputs() >= r.params.min_tokens) return {};
  return r.params.ignore_eos ? r.params.stop_token_ids : end_tokens(r);
}

ProcessedOutput Engine::take_tokens(Request& r, std::span<const SampledToken> tokens) {
  ProcessedOutput out = output_.process(r, tokens);
  const auto now = clock::now();
  metrics_.update([&](MetricsSnapshot& s) {
    s.generation_tokens += out.tokens_taken;
    if (!r.has_first_token)
      s.ttft.observe(seconds(r.arrival, now));
    else
      s.itl.observe(seconds(r.last_token, now));
  });
  r.has_first_token = true;
  r.last_token = now;
  return out;
}

void Engine::deliver(Request& r, ProcessedOutput out) {
  if (out.finish != FinishReason::kNone) return finish(r, out.finish, std::move(out.delta));
  r.stream->push(std::move(out.delta));
}

void Engine::fail_all(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) failure_ = why;
  }
  std::fprintf(stderr, "deltaserve: engine step failed, failing %zu requests: %s\n",
               requests_.size(), why.c_str());
  while (!requests_.empty()) {
    OutputDelta d;
    d.error = why;
    finish(*requests_.begin()->second, FinishReason::kError, std::move(d));
  }
}

void Engine::finish(Request& r, FinishReason why, OutputDelta d) {
  d.finished = true;
  d.finish_reason = why;
  d.prompt_tokens = r.num_prompt;
  d.cached_tokens = r.num_cached_tokens;
  d.completion_tokens = r.num_outputs();
  const auto now = clock::now();
  if (why == FinishReason::kStop || why == FinishReason::kLength)
    scheduler_.record_output_length(r.num_outputs());
  scheduler_.remove(&r);
  // Gauges first, so a client that sees the final delta also sees the freed pages.
  metrics_.update([&](MetricsSnapshot& s) {
    if (why == FinishReason::kAbort)
      ++s.requests_aborted;
    else
      ++s.requests_finished;
    s.e2e.observe(seconds(r.arrival, now));
    s.running = static_cast<int64_t>(scheduler_.num_running());
    s.waiting = static_cast<int64_t>(scheduler_.num_waiting());
    s.kv_pages_used = cache_.num_pages() - cache_.num_available_pages();
    s.prefix_cache_blocks = cache_.num_cached_blocks();
  });
  r.stream->push(std::move(d));
  requests_.erase(r.id);
}

}  // namespace deltaserve::engine
