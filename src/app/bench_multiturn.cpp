// `deltaserve bench serve --workload multi-turn`: N clients chat in turns over one shared system
// prompt. Each turn sends the client's whole history (system prompt, then its earlier user
// messages and the model's answers, as token ids) plus a new random user message, streams the
// answer (return_token_ids) and appends it. Reports TTFT and the prefix-cache hit rate: cached
// prompt tokens over cacheable ones (a prefix the server was given before: the previous turn's
// prompt and answer, or the system prompt when another client's first turn was sent earlier).
#include "app/bench_multiturn.h"

#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "app/bench_client.h"
#include "app/bench_stats.h"

namespace deltaserve::app {

namespace {

using clock = std::chrono::steady_clock;

struct MultiTurnConfig {
  std::string host, port, key, model;
  int clients = 16, turns = 4, system_len = 512, turn_len = 128, out_len = 64, vocab = 100000;
  uint32_t seed = 0;
};

struct Turn {
  Outcome outcome;
  int64_t prompt_tokens = 0, cacheable = 0;
};

std::vector<int32_t> random_ids(std::mt19937& g, int n, int vocab) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return v;
}

std::vector<Turn> run_client(const MultiTurnConfig& c, int id, const std::vector<int32_t>& system,
                             std::atomic<int>& first_turns_sent) {
  std::mt19937 g(c.seed * 7919u + static_cast<uint32_t>(id) + 1);
  std::vector<int32_t> history = system;
  std::vector<Turn> out;
  int64_t computed = 0;  // positions of `history` the server was given in earlier turns
  for (int t = 0; t < c.turns; ++t) {
    const std::vector<int32_t> user = random_ids(g, c.turn_len, c.vocab);
    history.insert(history.end(), user.begin(), user.end());
    nlohmann::json body = {{"prompt", history},
                           {"max_tokens", c.out_len},
                           {"temperature", 0},
                           {"ignore_eos", true},
                           {"stream", true},
                           {"return_token_ids", true},
                           {"stream_options", {{"include_usage", true}}}};
    if (!c.model.empty()) body["model"] = c.model;
    Turn turn;
    turn.prompt_tokens = static_cast<int64_t>(history.size());
    turn.cacheable =
        t > 0 ? computed : (first_turns_sent++ > 0 ? static_cast<int64_t>(system.size()) : 0);
    turn.outcome = stream_completion(c.host, c.port, body.dump(), c.key);
    const bool ok = turn.outcome.ok;
    const std::vector<int32_t>& answer = turn.outcome.token_ids;
    computed = static_cast<int64_t>(history.size() + answer.size()) - 1;
    history.insert(history.end(), answer.begin(), answer.end());
    out.push_back(std::move(turn));
    if (!ok) break;
  }
  return out;
}

}  // namespace

int run_multi_turn(const Args& a) {
  MultiTurnConfig c;
  c.host = a.get("host", "127.0.0.1");
  c.port = a.get("port", "8000");
  c.key = a.get("api-key", "");
  c.model = a.get("model", "");
  c.clients = static_cast<int>(a.get_int("num-clients", 16, 1, 100000));
  c.turns = static_cast<int>(a.get_int("turns", 4, 1, 1000));
  c.system_len = static_cast<int>(a.get_int("system-len", 512, 0, 1 << 20));
  c.turn_len = static_cast<int>(a.get_int("turn-len", 128, 1, 1 << 20));
  c.out_len = static_cast<int>(a.get_int("output-len", 64, 1, 1 << 20));
  c.vocab = static_cast<int>(a.get_int("vocab", 100000, 2, 1 << 30));
  c.seed = static_cast<uint32_t>(a.get_int("seed", 0, 0, 1LL << 32));
  std::mt19937 g(c.seed);
  const std::vector<int32_t> system = random_ids(g, c.system_len, c.vocab);
  std::atomic<int> first_turns_sent{0};
  std::vector<std::vector<Turn>> turns(static_cast<size_t>(c.clients));
  const auto t0 = clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < c.clients; ++i)
    threads.emplace_back(
        [&, i] { turns[static_cast<size_t>(i)] = run_client(c, i, system, first_turns_sent); });
  for (auto& t : threads) t.join();
  const double dur = std::chrono::duration<double>(clock::now() - t0).count();

  std::vector<Outcome> all, later;  // every turn; turns after the first
  int64_t prompt = 0, cached = 0, cacheable = 0;
  for (const auto& client : turns)
    for (size_t t = 0; t < client.size(); ++t) {
      all.push_back(client[t].outcome);
      if (t > 0) later.push_back(client[t].outcome);
      if (!client[t].outcome.ok) continue;
      prompt += client[t].prompt_tokens;
      cached += client[t].outcome.cached_tokens;
      cacheable += client[t].cacheable;
    }
  const Summary sum = summarize(all), sum_later = summarize(later);
  std::vector<double> later_ttft;
  for (const Outcome& o : later)
    if (o.ok) later_ttft.push_back(o.ttft);
  std::printf(
      "{\"bench\": \"serve\", \"workload\": \"multi-turn\", \"num_clients\": %d, \"turns\": %d, "
      "\"system_len\": %d, \"turn_len\": %d, \"output_len\": %d, \"completed\": %d, "
      "\"duration_s\": %.3f, \"prompt_tokens\": %lld, \"cached_tokens\": %lld, "
      "\"cacheable_tokens\": %lld, \"hit_rate\": %.4f, \"cached_share_of_prompt\": %.4f, "
      "\"total_tok_per_s\": %.1f, %s, \"later_turns\": {%s}%s}\n",
      c.clients, c.turns, c.system_len, c.turn_len, c.out_len, sum.completed, dur,
      static_cast<long long>(prompt), static_cast<long long>(cached),
      static_cast<long long>(cacheable),
      cacheable ? static_cast<double>(cached) / static_cast<double>(cacheable) : 0.0,
      prompt ? static_cast<double>(cached) / static_cast<double>(prompt) : 0.0,
      (static_cast<double>(prompt) + static_cast<double>(sum.output_tokens)) / dur,
      sum.latency_json.c_str(), stats_json("ttft_ms", later_ttft).c_str(),
      sum.first_error.empty()
          ? ""
          : (", \"first_error\": " + nlohmann::json(sum.first_error).dump()).c_str());
  return sum.completed == static_cast<int>(all.size()) ? 0 : 1;
}

}  // namespace deltaserve::app
