// `deltaserve serve`: loads the model, tokenizer and chat template, starts the engine and the
// OpenAI-compatible HTTP server, and drains in-flight requests on SIGINT/SIGTERM.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/args.h"
#include "app/commands.h"
#include "app/runtime.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/gdn_workspace.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "server/http_server.h"
#include "server/openai_api.h"

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

}  // namespace

int cmd_serve(const std::vector<std::string>& argv) {
  Args a(argv, "serve",
         {"model", "tokenizer", "host", "port", "served-model-name", "tensor-parallel-size",
          "max-num-seqs", "max-model-len", "max-num-batched-tokens", "gpu-memory-utilization",
          "load-format", "api-key", "device", "kv-cache-gib", "max-pending", "max-body-bytes",
          "http-threads", "shutdown-timeout", "max-connections"},
         {"enforce-eager"});
  check_device(a);
  const int tp = static_cast<int>(a.get_int("tensor-parallel-size", 1, 1, 1024));
  const double util = a.get_double("gpu-memory-utilization", 0.9, 0, 1, true);
  const std::string model_dir = a.get("model", "");
  fs::path tok_dir =
      a.get("tokenizer", model_dir.empty() ? std::string(DS_DEFAULT_TOKENIZER_DIR) : model_dir);
  if (!fs::exists(tok_dir / "tokenizer.json"))
    throw Error((tok_dir / "tokenizer.json").string() + " not found: pass --tokenizer DIR" +
                (model_dir.empty()
                     ? " (make serve fetches the Qwen3 tokenizer with tools/fetch_tokenizer.sh)"
                     : ""));

  engine::EngineConfig ecfg;
  ecfg.max_num_seqs = static_cast<int32_t>(a.get_int("max-num-seqs", 64, 1, 65536));
  ecfg.enforce_eager = a.has("enforce-eager");
  ecfg.max_num_batched_tokens =
      static_cast<int32_t>(a.get_int("max-num-batched-tokens", 2048, 1, 1 << 24));
  server::HttpServerConfig hcfg;
  hcfg.host = a.get("host", "127.0.0.1");
  hcfg.port = static_cast<uint16_t>(a.get_int("port", 8000, 0, 65535));
  hcfg.max_body_bytes = static_cast<size_t>(a.get_int("max-body-bytes", 32 << 20, 1024, 1LL << 34));
  hcfg.threads = static_cast<int>(a.get_int("http-threads", 2, 1, 256));
  hcfg.worker_threads = hcfg.threads;
  hcfg.max_connections = static_cast<int>(a.get_int("max-connections", 0, 0, 1 << 20));
  const double shutdown_s = a.get_double("shutdown-timeout", 60, 0, 86400);
  server::ApiConfig acfg;
  acfg.api_key = a.get("api-key", "");
  acfg.max_pending = a.get_int("max-pending", 512, 1, 1 << 24);
  acfg.served_model_name =
      a.get("served-model-name", model_dir.empty() ? "deltaserve-default" : model_dir);
  const double kv_gib = a.get_double("kv-cache-gib", 2, 0, 1 << 20, true);

  std::fprintf(stderr, "deltaserve: loading %s\n",
               model_dir.empty() ? "the embedded default model" : model_dir.c_str());
  ModelRuntime rt = make_runtime(model_dir, model::parse_load_format(a.get("load-format", "auto")),
                                 tp, true, a.get("device", "cpu"));
  const model::ModelConfig& mc = rt.exec->config();  // rank-local shapes under TP
  ecfg.max_model_len = static_cast<int32_t>(
      a.get_int("max-model-len", std::min<int64_t>(mc.max_position_embeddings, 8192), 1,
                mc.max_position_embeddings));
  const int64_t act = static_cast<int64_t>(dtype_size(rt.act_dtype));
  const int64_t page_bytes = mc.num_layers_of(model::LayerType::kFullAttention) * 2 *
                             mc.num_kv_heads * mc.head_dim * ecfg.page_size * act;
  const int64_t per_request = (ecfg.max_model_len + ecfg.page_size - 1) / ecfg.page_size;
  size_t free_b = 0, total_b = 0;
  if (rt.exec->memory_info(free_b, total_b)) {
    // GPU memory plan (per rank, from the rank with the least free memory; all ranks hold the
    // same rank-local shapes): weights are loaded; then GDN state slots and step scratch; the rest
    // of --gpu-memory-utilization x total becomes KV pages. Fail closed if one request cannot fit.
    const double gib = 1 << 30;
    const int64_t slot_bytes = mc.num_layers_of(model::LayerType::kLinearAttention) *
                               (mc.lin_num_v_heads * mc.lin_k_dim * mc.lin_v_dim * 4 +
                                mc.conv_dim() * (mc.conv_kernel - 1) * act);
    const int64_t T = ecfg.max_num_batched_tokens;
    const int64_t scratch =
        T * act *
            (4 * mc.hidden_size + 5 * mc.num_heads * mc.head_dim + 2 * mc.conv_dim() +
             3 * mc.value_dim() + 3 * mc.intermediate_size) +
        static_cast<int64_t>(ecfg.max_num_seqs) * mc.vocab_size * act +
        // the chunked delta rule's workspace of a prefill step (f32, ~dv + 3 dk + 65 per token
        // and value head) and the split-KV attention partials (64 MiB), plus a margin
        T * mc.lin_num_v_heads *
            backend::gdn_chunk_floats_per_token(static_cast<int32_t>(mc.lin_k_dim),
                                                static_cast<int32_t>(mc.lin_v_dim)) *
            4 +
        (int64_t{64} << 20) + (int64_t{256} << 20);
    const int64_t used = static_cast<int64_t>(total_b - free_b);
    const int64_t budget = static_cast<int64_t>(util * static_cast<double>(total_b)) - used -
                           slot_bytes * (ecfg.max_num_seqs + 1) - scratch;
    // The model keeps one more slot and page of its own for padded graph rows.
    const int64_t pages = budget > 0 ? budget / page_bytes - 1 : 0;
    std::fprintf(stderr,
                 "deltaserve: GPU memory: %.2f GiB total, %.2f GiB in use after loading, %d state "
                 "slots %.2f GiB, "
                 "scratch %.2f GiB, KV pages %lld (%.2f GiB)\n",
                 static_cast<double>(total_b) / gib, static_cast<double>(used) / gib,
                 ecfg.max_num_seqs, static_cast<double>(slot_bytes * ecfg.max_num_seqs) / gib,
                 static_cast<double>(scratch) / gib, static_cast<long long>(pages),
                 static_cast<double>(pages * page_bytes) / gib);
    if (pages < per_request)
      throw Error("--gpu-memory-utilization " + std::to_string(util) + " leaves room for " +
                  std::to_string(pages) + " KV pages after the weights, " +
                  std::to_string(ecfg.max_num_seqs) +
                  " state slots and scratch; one request of max_model_len " +
                  std::to_string(ecfg.max_model_len) + " needs " + std::to_string(per_request) +
                  ": raise --gpu-memory-utilization or lower --max-model-len / --max-num-seqs");
    ecfg.num_pages =
        static_cast<int32_t>(std::min<int64_t>(pages, std::numeric_limits<int32_t>::max()));
  } else {
    // CPU: room for max_num_seqs requests of max_model_len within --kv-cache-gib per rank (all CPU
    // ranks hold the same shard sizes, so this is also the minimum across ranks).
    const int64_t budget_pages = page_bytes ? static_cast<int64_t>(kv_gib * (1 << 30)) / page_bytes
                                            : per_request * ecfg.max_num_seqs;
    ecfg.num_pages = static_cast<int32_t>(
        std::max<int64_t>(1, std::min(per_request * ecfg.max_num_seqs, budget_pages)));
  }

  std::fprintf(stderr, "deltaserve: loading tokenizer %s\n", tok_dir.c_str());
  const auto tok = tokenizer::Tokenizer::from_file(tok_dir / "tokenizer.json");
  std::unique_ptr<tokenizer::ChatTemplate> chat;
  if (fs::exists(tok_dir / "tokenizer_config.json")) {
    try {
      chat = tokenizer::ChatTemplate::from_config(tok_dir / "tokenizer_config.json");
    } catch (const Error& e) {
      std::fprintf(stderr,
                   "deltaserve: no chat template (%s); /v1/chat/completions will answer 400\n",
                   e.what());
    }
  }
  ecfg.eos_token_ids = eos_ids(mc, model_dir, tok_dir, *tok);
  engine::Engine eng(*rt.exec, ecfg, tok.get());
  server::OpenAiApi api(acfg, eng, *tok, chat.get());
  server::HttpServer http(hcfg, [&api](const server::Request& r) { return api.handle(r); });

  const std::string base = "http://" + hcfg.host + ":" + std::to_string(http.port());
  std::printf(
      "deltaserve: ready — serving '%s' on %s (device %s, tensor-parallel-size %d, max_model_len "
      "%d, %d KV pages)%s\n"
      "  try: curl %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
      "         -d '{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": "
      "\"Hello!\"}], \"max_tokens\": 32}'\n",
      acfg.served_model_name.c_str(), base.c_str(), a.get("device", "cpu").c_str(), tp,
      eng.config().max_model_len, eng.config().num_pages,
      model_dir.empty()
          ? " — the embedded default model has RANDOM weights: its text is meaningless"
          : "",
      base.c_str(), acfg.served_model_name.c_str());
  std::fflush(stdout);

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
