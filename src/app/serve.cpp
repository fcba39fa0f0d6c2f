// `deltaserve serve`: loads the model, tokenizer and chat template, starts the engine and the
// OpenAI-compatible HTTP server, and drains in-flight requests on SIGINT/SIGTERM.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/args.h"
#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/runtime.h"
#include "app/scheduler_flags.h"
#include "app/tpsp_flags.h"
#include "app/vllm_flags.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/hub_cache.h"
#include "model/loader.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "tokenizer/chat_template_source.h"

namespace deltaserve::app {

namespace fs = std::filesystem;

namespace {

// EOS ids: the model config's, generation_config.json's and the tokenizer's eos_token.
std::vector<int32_t> eos_ids(const model::ModelConfig& cfg, const std::string& model_dir,
                             const fs::path& tok_dir, const tokenizer::Tokenizer& tok) {
  std::vector<int32_t> ids = cfg.eos_token_ids;
  auto add = [&ids](int64_t id) {
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end())
      ids.push_back(static_cast<int32_t>(id));
  };
  if (!model_dir.empty()) {
    std::ifstream in(fs::path(model_dir) / "generation_config.json");
    const nlohmann::json g = in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json();
    if (g.is_object() && g.contains("eos_token_id")) {
      const auto& e = g["eos_token_id"];
      if (e.is_number_integer()) add(e.get<int64_t>());
      if (e.is_array())
        for (const auto& x : e)
          if (x.is_number_integer()) add(x.get<int64_t>());
    }
  }
  std::ifstream in(tok_dir / "tokenizer_config.json");
  const nlohmann::json t = in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json();
  if (t.is_object() && t.contains("eos_token")) {
    const auto& e = t["eos_token"];
    const std::string s = e.is_string()   ? e.get<std::string>()
                          : e.is_object() ? e.value("content", "")
                                          : "";
    if (!s.empty()) add(tok.token_to_id(s));
  }
  return ids;
}

// Waits for the requests in flight up to `timeout_s` (or a second signal), then ends every reply
// still open with a final error event (streams) or a 503 (whole bodies), and stops the server.
void drain_then_stop(const server::OpenAiApi& api, server::HttpServer& http, double timeout_s,
                     const std::atomic<bool>& hurry) {
  using clock = std::chrono::steady_clock;
  const auto busy = [&] { return api.in_flight() > 0 || http.open_replies() > 0; };
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  while (busy() && !hurry && clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (busy()) {
    std::fprintf(stderr, "deltaserve: ending %lld open replies\n",
                 static_cast<long long>(http.open_replies()));
    http.cut_open_replies("the server is shutting down");
    const auto flush_deadline = clock::now() + std::chrono::seconds(2);
    while (http.open_replies() > 0 && clock::now() < flush_deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  http.stop();
}

server::HttpServerConfig http_config(const Args& a) {
  server::HttpServerConfig h;
  h.host = a.get("host", "127.0.0.1");
  h.port = static_cast<uint16_t>(a.get_int("port", 8000, 0, 65535));
  h.max_body_bytes = static_cast<size_t>(a.get_int("max-body-bytes", 32 << 20, 1024, 1LL << 34));
  h.threads = static_cast<int>(a.get_int("http-threads", 2, 1, 256));
  h.worker_threads = h.threads;
  h.max_connections = static_cast<int>(a.get_int("max-connections", 0, 0, 1 << 20));
  return h;
}

// --chat-template's template (an error if it cannot be read or parsed), else the checkpoint's, or
// null (with a note) when it has none usable.
std::unique_ptr<tokenizer::ChatTemplate> chat_template(const fs::path& tok_dir, const Args& a) {
  if (a.has("chat-template"))
    return tokenizer::load_chat_template(tok_dir, a.get("chat-template", ""));
  try {
    return tokenizer::load_chat_template(tok_dir);
  } catch (const Error& e) {
    std::fprintf(stderr,
                 "deltaserve: no chat template (%s); /v1/chat/completions will answer 400\n",
                 e.what());
    return nullptr;
  }
}

// The default sampling parameters (--generation-config, --override-generation-config), said
// when they are not OpenAI's.
server::GenerationDefaults sampling_defaults(const Args& a, const std::string& model_dir) {
  const std::string mode = a.get("generation-config", "auto");
  server::GenerationDefaults d =
      server::load_generation_defaults(mode, model_dir, a.get("override-generation-config", ""));
  if (!d.empty())
    std::fprintf(stderr,
                 "deltaserve: requests that leave them out get %s (the model's generation config, "
                 "as vLLM; --generation-config vllm: OpenAI's defaults)\n",
                 d.describe().c_str());
  return d;
}

// --default-chat-template-kwargs: a JSON object (e.g. {"enable_thinking": false}), or null.
server::json chat_template_kwargs(const Args& a) {
  if (!a.has("default-chat-template-kwargs")) return nullptr;
  const std::string v = a.get("default-chat-template-kwargs", "");
  server::json j = server::json::parse(v, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw Error("--default-chat-template-kwargs must be a JSON object, got '" + v + "'");
  return j;
}

// --max-model-len, checked before anything loads: a count (the engine refuses one over the
// model's context); `auto` / -1 or none: the model's context, lowered by the engine to what one
// request's KV pages fit (vLLM's `auto`; vLLM without the flag takes the model's context and
// refuses to start where it does not fit).
int32_t max_model_len_flag(const Args& a) {
  const std::string v = a.get("max-model-len", "auto");
  if (v == "auto" || v == "-1") return engine::kFitMaxModelLen;
  return static_cast<int32_t>(
      a.get_count("max-model-len", 0, 1, std::numeric_limits<int32_t>::max()));
}

// The context the engine settled on, where the memory lowered it from the model's.
void print_fitted_context(const engine::EngineConfig& ec, const model::ModelConfig& mc) {
  if (ec.max_model_len < mc.max_position_embeddings)
    std::fprintf(stderr,
                 "deltaserve: max_model_len %d: the KV pages hold no more for one request (the "
                 "model's context is %lld; --gpu-memory-utilization / --kv-cache-gib give them "
                 "more room)\n",
                 ec.max_model_len, static_cast<long long>(mc.max_position_embeddings));
}

void print_ready(const std::string& name, const std::string& base, const std::string& device,
                 int tp, const engine::EngineConfig& ec, bool embedded_default) {
  std::printf(
      "deltaserve: ready — serving '%s' on %s (device %s, tensor-parallel-size %d, max_model_len "
      "%d, %d KV pages, prefix caching %s)%s\n"
      "  try: curl %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
      "         -d '{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": "
      "\"Hello!\"}], \"max_tokens\": 32}'\n",
      name.c_str(), base.c_str(), device.c_str(), tp, ec.max_model_len, ec.num_pages,
      ec.enable_prefix_caching
          ? ("on, " + std::to_string(ec.num_snapshots) + " state snapshots").c_str()
          : "off",
      embedded_default ? " — the embedded default model has RANDOM weights: its text is meaningless"
                       : "",
      base.c_str(), name.c_str());
  std::fflush(stdout);
}

// serve's flags that take a value, and its switches: ours and vLLM's.
std::set<std::string> serve_value_flags() {
  std::set<std::string> flags = {"model",
                                 "tokenizer",
                                 "host",
                                 "port",
                                 "tensor-parallel-size",
                                 "max-num-seqs",
                                 "max-model-len",
                                 "max-num-batched-tokens",
                                 "long-prefill-token-threshold",
                                 "admission-reserve-tokens",
                                 "gpu-memory-utilization",
                                 "load-format",
                                 "api-key",
                                 "device",
                                 "kv-cache-gib",
                                 "max-pending",
                                 "max-body-bytes",
                                 "http-threads",
                                 "shutdown-timeout",
                                 "max-connections",
                                 "reasoning-parser",
                                 "debug-output-script",
                                 "tool-call-parser",
                                 "chat-template",
                                 "revision",
                                 "download-dir",
                                 "generation-config",
                                 "override-generation-config",
                                 "default-chat-template-kwargs"};
  flags.insert(vllm_value_flags().begin(), vllm_value_flags().end());
  flags.insert(cache_value_flags().begin(), cache_value_flags().end());
  flags.insert(tpsp_value_flags().begin(), tpsp_value_flags().end());
  return flags;
}
std::set<std::string> serve_switches() {
  std::set<std::string> switches = {"enforce-eager", "enable-auto-tool-choice"};
  switches.insert(tpsp_switches().begin(), tpsp_switches().end());
  switches.insert(vllm_switches().begin(), vllm_switches().end());
  switches.insert(cache_switches().begin(), cache_switches().end());
  return switches;
}

// The model as given (vLLM's `vllm serve MODEL`: a first argument that is not a flag, or
// --model), and argv without it.
std::pair<std::string, Args> model_and_flags(const std::vector<std::string>& argv) {
  const bool positional = !argv.empty() && !argv[0].empty() && argv[0][0] != '-';
  Args a(std::vector<std::string>(argv.begin() + (positional ? 1 : 0), argv.end()), "serve",
         serve_value_flags(), serve_switches(), {"served-model-name"});
  if (!positional) return {a.get("model", ""), a};
  if (a.has("model") && a.get("model", "") != argv[0])
    throw Error("deltaserve serve: two models: '" + argv[0] + "' and --model " +
                a.get("model", ""));
  return {argv[0], a};
}

// --tokenizer (a directory or a cached repository id), else the model's directory, else the
// embedded model's Qwen3 tokenizer; it must hold tokenizer.json.
fs::path tokenizer_dir(const Args& a, const std::string& model_dir) {
  const fs::path dir = a.has("tokenizer")  ? model::resolve_model_dir(a.get("tokenizer", ""), "",
                                                                      a.get("download-dir", ""))
                       : model_dir.empty() ? std::string(DS_DEFAULT_TOKENIZER_DIR)
                                           : model_dir;
  if (!fs::exists(dir / "tokenizer.json"))
    throw Error((dir / "tokenizer.json").string() + " not found: pass --tokenizer DIR" +
                (model_dir.empty()
                     ? " (make serve fetches the Qwen3 tokenizer with tools/fetch_tokenizer.sh)"
                     : ""));
  return dir;
}

}  // namespace

int cmd_serve(const std::vector<std::string>& argv) {
  const auto [model_name, a] = model_and_flags(argv);
  check_device(a);
  check_vllm_flags(a);
  const int tp = static_cast<int>(a.get_int("tensor-parallel-size", 1, 1, 1024));
  const dist::TpspConfig tpsp = parse_tpsp_flags(a);  // checked before anything loads
  const double util = a.get_double("gpu-memory-utilization", 0.9, 0, 1, true);
  const std::string model_dir =
      model::resolve_model_dir(model_name, a.get("revision", ""), a.get("download-dir", ""));
  const fs::path tok_dir = tokenizer_dir(a, model_dir);

  engine::EngineConfig ecfg;
  // Without the flag: sized from the memory plan on a GPU, 64 on the CPU (EngineConfig).
  ecfg.max_num_seqs = static_cast<int32_t>(a.get_int("max-num-seqs", 0, 1, 65536));
  ecfg.enforce_eager = a.has("enforce-eager");
  ecfg.max_model_len = max_model_len_flag(a);
  const double snapshot_fraction = apply_cache_flags(a, ecfg);
  const SchedulerFlags sched = scheduler_flags(a, 2048);
  ecfg.max_num_batched_tokens = sched.max_num_batched_tokens;
  ecfg.long_prefill_token_threshold = sched.long_prefill_token_threshold;
  ecfg.admission_reserve_tokens = sched.admission_reserve_tokens;
  const server::HttpServerConfig hcfg = http_config(a);
  const double shutdown_s = a.get_double("shutdown-timeout", 60, 0, 86400);
  server::ApiConfig acfg;
  // As vLLM: --api-key, else the VLLM_API_KEY environment variable.
  const char* env_key = std::getenv("VLLM_API_KEY");
  acfg.api_key = a.get("api-key", env_key ? env_key : "");
  acfg.max_pending = a.get_int("max-pending", acfg.max_pending, 1, 1 << 24);
  // vLLM's --served-model-name A B ...: requests may name any; replies name the first.
  const std::vector<std::string> names = a.get_list("served-model-name");
  acfg.served_model_name = !names.empty()       ? names[0]
                           : model_name.empty() ? "deltaserve-default"
                                                : model_name;
  if (names.size() > 1) acfg.model_aliases.assign(names.begin() + 1, names.end());
  if (a.has("reasoning-parser")) {
    if (a.get("reasoning-parser", "") != "qwen3")
      throw Error("--reasoning-parser must be qwen3 (Qwen3.5's <think> format), got '" +
                  a.get("reasoning-parser", "") + "'");
    acfg.reasoning_parser = true;
  }
  if (a.has("tool-call-parser") || a.has("enable-auto-tool-choice")) {
    // vLLM's two parsers of that format: qwen3_coder and qwen3_xml.
    const std::string parser = a.get("tool-call-parser", "");
    if ((parser != "qwen3_coder" && parser != "qwen3_xml") || !a.has("enable-auto-tool-choice"))
      throw Error(
          "tool calling needs --enable-auto-tool-choice --tool-call-parser qwen3_coder (or "
          "qwen3_xml: Qwen3.5's <tool_call><function=...> format)");
    acfg.tool_call_parser = true;
  }
  acfg.defaults = sampling_defaults(a, model_dir);
  acfg.chat_template_kwargs = chat_template_kwargs(a);
  const double kv_gib = a.get_double("kv-cache-gib", 2, 0, 1 << 20, true);
  const std::unique_ptr<tokenizer::ChatTemplate> chat = chat_template(tok_dir, a);

  // Bound (host name resolved, port taken) before anything loads; requests wait in the backlog
  // until the server runs.
  server::OpenAiApi* api_ptr = nullptr;
  server::HttpServer http(hcfg,
                          [&api_ptr](const server::Request& r) { return api_ptr->handle(r); });

  std::fprintf(stderr, "deltaserve: loading %s\n",
               model_dir.empty() ? "the embedded default model" : model_dir.c_str());
  ModelRuntime rt = make_runtime(model_dir, model::parse_load_format(a.get("load-format", "auto")),
                                 tp, true, a.get("device", "cpu"), tpsp);
  const model::ModelConfig& mc = rt.exec->config();
  // The memory plan (runtime::MemoryPlan, made by the engine): on a GPU, what is left of
  // --gpu-memory-utilization x total after the weights, state slots, step buffers and the
  // backend's workspace becomes KV pages; on the CPU, --kv-cache-gib of pages, at most room for
  // max_num_seqs requests of max_model_len. Fails closed when one request cannot fit.
  runtime::MemoryBudget budget;
  size_t free_b = 0, total_b = 0;
  if (rt.exec->memory_info(free_b, total_b)) {
    budget.kind = runtime::MemoryBudget::Kind::kDeviceShare;
    budget.utilization = util;
  } else {
    budget.kind = runtime::MemoryBudget::Kind::kHostBytes;
    budget.kv_bytes = static_cast<int64_t>(kv_gib * (1 << 30));
  }
  budget.snapshot_fraction = snapshot_fraction;
  ecfg.budget = budget;

  std::fprintf(stderr, "deltaserve: loading tokenizer %s\n", tok_dir.c_str());
  const auto tok = tokenizer::Tokenizer::from_file(tok_dir / "tokenizer.json");
  ecfg.eos_token_ids = eos_ids(mc, model_dir, tok_dir, *tok);
  if (a.has("debug-output-script")) {
    ecfg.debug_output_script = tok->encode(a.get("debug-output-script", ""));
    std::fprintf(stderr, "deltaserve: --debug-output-script: every reply is the same %zu tokens\n",
                 ecfg.debug_output_script.size());
  }
  ecfg.profile_tpsp = tpsp_profile_request(a, tpsp);
  engine::Engine eng(*rt.exec, ecfg, tok.get());
  if (!eng.tpsp_profile().empty())
    std::fprintf(stderr, "deltaserve: %s\n", eng.tpsp_profile().c_str());
  std::fprintf(stderr, "deltaserve: memory plan per rank: %s\n",
               eng.memory_plan().describe().c_str());
  if (ecfg.max_model_len == engine::kFitMaxModelLen) print_fitted_context(eng.config(), mc);
  std::fprintf(stderr,
               "deltaserve: KV room for %.1f requests of max_model_len %d tokens at once, %d state "
               "slots (--max-num-seqs); requests beyond either wait\n",
               eng.memory_plan().max_concurrency(eng.config().max_model_len),
               eng.config().max_model_len, eng.config().max_num_seqs);
  server::OpenAiApi api(acfg, eng, *tok, chat.get());
  api_ptr = &api;

  print_ready(acfg.served_model_name, "http://" + hcfg.host + ":" + std::to_string(http.port()),
              a.get("device", "cpu"), tp, eng.config(), model_dir.empty());

  std::thread drainer;
  std::atomic<bool> hurry{false};
  http.run([&](int nth) {
    if (nth > 1) {  // a second signal: stop waiting for the streams
      std::fprintf(stderr, "deltaserve: second signal, cutting open streams now\n");
      hurry = true;
      return;
    }
    std::fprintf(stderr, "deltaserve: signal received, draining %lld in-flight requests (%.0f s)\n",
                 static_cast<long long>(api.in_flight()), shutdown_s);
    api.set_draining();
    drainer = std::thread([&] { drain_then_stop(api, http, shutdown_s, hurry); });
  });
  if (drainer.joinable()) drainer.join();
  std::fprintf(stderr, "deltaserve: stopped\n");
  return 0;
}

}  // namespace deltaserve::app
