// deltaserve: the command-line entry point (generate, logits, tokenize, detokenize, bench).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "app/args.h"
#include "app/commands.h"
#include "app/runtime.h"
#include "app/tpsp_flags.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve::app {
namespace {

constexpr const char* kUsage = R"(usage: deltaserve <command> [flags]

commands:
  serve     the OpenAI-compatible HTTP server (without a model: the embedded random model)
            [MODEL | --model MODEL]  (a checkpoint directory, or a Hugging Face repository id
            such as Qwen/Qwen3.5-4B whose snapshot is in the local cache — $HF_HUB_CACHE,
            $HF_HOME/hub or ~/.cache/huggingface/hub, or --download-dir DIR —, at [--revision
            main]; nothing is downloaded)
            [--tokenizer DIR] [--chat-template FILE|TEMPLATE]  (default: the checkpoint's
            chat_template.jinja, tokenizer_config.json's or chat_template.json's)
            [--default-chat-template-kwargs JSON]  (e.g. '{"enable_thinking": false}'; each
            request's chat_template_kwargs over it)
            [--generation-config auto|vllm|DIR]  (default sampling parameters: the model's
            generation_config.json, as vLLM; vllm: OpenAI's) [--override-generation-config JSON]
            [--host 127.0.0.1] [--port 8000]
            [--served-model-name NAME [ALIAS...]] [--max-num-seqs N] [--max-model-len L|auto]
            (default auto: the model's context, or what one request's KV pages fit; L and B as
            vLLM takes them too: 32k = 32,000, 32K = 32,768)
            [--max-num-batched-tokens B (2048)] [--long-prefill-token-threshold 0]
            [--admission-reserve-tokens 4096]  (a request is admitted while the KV pages cover
            the prompts and up to this many outputs of it and of every running request; 0: the
            prompts only, decode growth preempts)
            [--api-key KEY (or VLLM_API_KEY)] [--load-format auto|safetensors|dummy]
            [--device cpu] [--tensor-parallel-size 1] [--gpu-memory-utilization 0.9]
            [--kv-cache-gib 2] [--max-pending 4096] [--max-body-bytes N] [--http-threads 2]
            [--max-connections N] [--shutdown-timeout 60] [--enforce-eager]  (no decode CUDA
            graphs) [--kv-cache-dtype auto|fp8|fp8_e4m3] [--reasoning-parser qwen3]
            [--enable-auto-tool-choice --tool-call-parser qwen3_coder]
            [--no-enable-prefix-caching] [--mamba-block-size 64]
            [--prefix-cache-snapshot-fraction 0.25] [--mamba-ssm-cache-dtype auto|float32|bfloat16]
            [--enable-tpsp] [--tpsp-threshold-tokens N] [--tpsp-microchunk-tokens M]  (TP:
            sequence parallelism from N tokens a step, in microchunks of M tokens whose GEMMs
            overlap the collectives; without N a startup profile picks N, and M unless given)
            (without --max-num-seqs: on a GPU 1024, 512, 256 or 128 — the most whose GDN state
            slots take at most a quarter of the cache memory —, on the CPU 64)
            vLLM's --dtype auto|bfloat16, --block-size 16, --tokenizer-mode auto|hf, --seed,
            --swap-space, --max-log-len, --uvicorn-log-level, --trust-remote-code,
            --disable-log-requests, --disable-log-stats, --enable-chunked-prefill,
            --disable-frontend-multiprocessing, --language-model-only and --limit-mm-per-prompt
            are accepted (other values refused; deltaserve serves text only)
  generate  greedy generation from token ids, printing the tokens and tokens/s
            --model MODEL (default: the embedded random model)  --ids 1,2,3  --max-tokens N
            --load-format auto|safetensors|dummy  --device cpu  --ignore-eos
  logits    write the f32 logits of a full prefill (tensor "logits", [tokens, vocab])
            --model DIR --ids 1,2,3 --out FILE.safetensors  [--load-format ...] [--device cpu]
            [--tensor-parallel-size N]  (N CPU ranks)  [--enable-tpsp [--tpsp-threshold-tokens 1024]
            [--tpsp-microchunk-tokens 0]]
  tokenize  print the token ids of a text as one JSON array
            --tokenizer DIR (holding tokenizer.json) --text STR  [--no-special]
  detokenize  print the text of token ids
            --tokenizer DIR --ids 1,2,3  [--skip-special-tokens]
  bench offline  N random requests through the engine; one JSON line of throughput and latency
            [--model DIR] [--load-format ...] --num-prompts N --input-len I --output-len O
            [--max-concurrency C]
            [--max-num-seqs S] [--max-num-batched-tokens B] [--max-model-len L] [--num-pages P]
            [--long-prefill-token-threshold T] [--admission-reserve-tokens R]
            [--seed X] [--device cpu|cuda] [--enforce-eager]
            [--enable-prefix-caching [--num-snapshots N]]  (random prompts: nothing ever hits)
            [--mamba-ssm-cache-dtype auto|float32|bfloat16]
  bench serve  a streaming load client against a running server (like `vllm bench serve`)
            [--generation-config auto|vllm|DIR]  (default sampling parameters: the model's
            generation_config.json, as vLLM; vllm: OpenAI's) [--override-generation-config JSON]
            [--host 127.0.0.1] [--port 8000] [--model NAME] [--api-key KEY] --num-prompts N
            --input-len I --output-len O [--max-concurrency C | --request-rate R] [--vocab V]
            or --workload multi-turn [--num-clients 16] [--turns 4] [--system-len 512]
            [--turn-len 128] [--output-len 64]  (chats: prefix-cache hit rate and TTFT)

deltaserve <command> --help prints this; deltaserve --version the version.
)";

bool is_command(const std::string& cmd) {
  for (const char* c : {"serve", "generate", "logits", "tokenize", "detokenize", "bench"})
    if (cmd == c) return true;
  return false;
}

constexpr int32_t kPageSize = 64;

int32_t pages_for(int64_t tokens) {
  return static_cast<int32_t>((tokens + kPageSize - 1) / kPageSize);
}

// One sequence on slot 0 with pages 0.. (generate and logits run one request).
StepBatch one_sequence(const std::vector<int32_t>& ids, int32_t start_pos, bool all_logits) {
  const int32_t n = static_cast<int32_t>(ids.size());
  std::vector<int32_t> pages(static_cast<size_t>(pages_for(start_pos + n)));
  for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(p);
  return StepBatchBuilder(kPageSize).add(0, ids, start_pos, 0, pages, all_logits ? n : 1).build();
}

// Plans and builds the runner of one request of `tokens` positions whose longest step has
// `step_tokens` tokens.
void configure_one_request(engine::Executor& exec, int64_t tokens, int64_t step_tokens) {
  runtime::PlanLimits limits;
  limits.max_num_seqs = 1;
  limits.max_num_batched_tokens = static_cast<int32_t>(step_tokens);
  limits.max_model_len = static_cast<int32_t>(tokens);
  limits.page_size = kPageSize;
  runtime::MemoryBudget budget;
  budget.pages = pages_for(tokens);
  exec.configure(exec.plan_memory(limits, budget));
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

int cmd_generate(const std::vector<std::string>& argv) {
  Args a(argv, "generate", {"model", "ids", "max-tokens", "load-format", "device"}, {"ignore-eos"});
  check_device(a);
  ModelRuntime rt =
      make_runtime(a.get("model", ""), model::parse_load_format(a.get("load-format", "auto")), 1,
                   true, a.get("device", "cpu"));
  engine::Executor* m = rt.exec.get();
  const model::ModelConfig& cfg = m->config();
  std::vector<int32_t> ids = parse_ids(a.get("ids", "1,2,3,4,5,6,7,8"), cfg.vocab_size);
  const long long max_tokens = a.get_int("max-tokens", 16, 1, cfg.max_position_embeddings);
  if (static_cast<long long>(ids.size()) + max_tokens > cfg.max_position_embeddings)
    throw Error("prompt + --max-tokens exceeds max_position_embeddings");
  configure_one_request(*m, static_cast<int64_t>(ids.size()) + max_tokens,
                        static_cast<int64_t>(ids.size()));

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  std::vector<float> logits = m->execute(one_sequence(ids, 0, false));
  const auto t1 = clock::now();
  std::vector<int32_t> out{argmax(logits.data(), cfg.vocab_size)};
  std::printf("prompt (%zu tokens): %s\ngenerated:", ids.size(),
              a.get("ids", "1,2,3,4,5,6,7,8").c_str());
  std::printf(" %d", out.back());
  std::fflush(stdout);
  const bool ignore_eos = a.has("ignore-eos");
  auto is_eos = [&](int32_t t) {
    for (int32_t e : cfg.eos_token_ids)
      if (e == t) return !ignore_eos;
    return false;
  };
  while (static_cast<long long>(out.size()) < max_tokens && !is_eos(out.back())) {
    const int32_t pos = static_cast<int32_t>(ids.size() + out.size() - 1);
    logits = m->execute(one_sequence({out.back()}, pos, false));
    out.push_back(argmax(logits.data(), cfg.vocab_size));
    std::printf(" %d", out.back());
    std::fflush(stdout);
  }
  const auto t2 = clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf(
      "\nprefill: %zu tokens in %.3f s (%.1f tok/s); decode: %zu tokens in %.3f s (%.1f tok/s)\n",
      ids.size(), prefill_s, static_cast<double>(ids.size()) / prefill_s, out.size() - 1, decode_s,
      out.size() > 1 ? static_cast<double>(out.size() - 1) / decode_s : 0.0);
  return 0;
}

int cmd_logits(const std::vector<std::string>& argv) {
  Args a(argv, "logits",
         {"model", "ids", "out", "load-format", "device", "tensor-parallel-size",
          "tpsp-threshold-tokens", "tpsp-microchunk-tokens"},
         tpsp_switches());
  check_device(a);
  if (!a.has("model") || !a.has("ids") || !a.has("out"))
    throw Error("deltaserve logits needs --model DIR --ids 1,2,3 --out FILE.safetensors");
  const int tp = static_cast<int>(a.get_int("tensor-parallel-size", 1, 1, 1024));
  ModelRuntime rt =
      make_runtime(a.get("model", ""), model::parse_load_format(a.get("load-format", "auto")), tp,
                   true, a.get("device", "cpu"), parse_tpsp_flags(a));
  const std::vector<int32_t> ids = parse_ids(a.get("ids", ""), rt.exec->config().vocab_size);
  configure_one_request(*rt.exec, static_cast<int64_t>(ids.size()),
                        static_cast<int64_t>(ids.size()));
  const std::vector<float> logits = rt.exec->execute(one_sequence(ids, 0, true));
  const auto* m = &rt.exec->config();
  model::write_safetensors(
      a.get("out", ""),
      {{"logits", DType::kF32, {static_cast<int64_t>(ids.size()), m->vocab_size}, logits.data()}});
  std::fprintf(stderr, "wrote logits [%zu, %lld] to %s\n", ids.size(),
               static_cast<long long>(m->vocab_size), a.get("out", "").c_str());
  return 0;
}

std::unique_ptr<tokenizer::Tokenizer> load_tokenizer(const Args& a) {
  if (!a.has("tokenizer"))
    throw Error("--tokenizer DIR is required (the directory holding tokenizer.json)");
  return tokenizer::Tokenizer::from_file(std::filesystem::path(a.get("tokenizer", "")) /
                                         "tokenizer.json");
}

int cmd_tokenize(const std::vector<std::string>& argv) {
  Args a(argv, "tokenize", {"tokenizer", "text"}, {"no-special"});
  if (!a.has("text")) throw Error("deltaserve tokenize needs --text STR");
  const auto tok = load_tokenizer(a);
  const std::vector<int32_t> ids = tok->encode(a.get("text", ""), !a.has("no-special"));
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  std::printf("%s]\n", out.c_str());
  return 0;
}

int cmd_detokenize(const std::vector<std::string>& argv) {
  Args a(argv, "detokenize", {"tokenizer", "ids"}, {"skip-special-tokens"});
  if (!a.has("ids")) throw Error("deltaserve detokenize needs --ids 1,2,3");
  const auto tok = load_tokenizer(a);
  const std::vector<int32_t> ids = parse_ids(a.get("ids", ""), tok->vocab_size());
  std::printf("%s\n", tok->decode(ids, a.has("skip-special-tokens")).c_str());
  return 0;
}

}  // namespace
}  // namespace deltaserve::app

int main(int argc, char** argv) {
  using namespace deltaserve;
  if (argc < 2) {
    std::fputs(app::kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (cmd == "--version" || cmd == "version") {
    std::printf("deltaserve %s\n", DS_VERSION);
    return 0;
  }
  // `deltaserve --help`, `deltaserve help`, and `deltaserve serve --help` as vLLM users type it.
  const auto is_help = [](const std::string& a) { return a == "--help" || a == "-h"; };
  if (is_help(cmd) || cmd == "help" ||
      (app::is_command(cmd) && std::any_of(rest.begin(), rest.end(), is_help))) {
    std::fputs(app::kUsage, stdout);
    return 0;
  }
  try {
    if (cmd == "generate") return app::cmd_generate(rest);
    if (cmd == "logits") return app::cmd_logits(rest);
    if (cmd == "tokenize") return app::cmd_tokenize(rest);
    if (cmd == "detokenize") return app::cmd_detokenize(rest);
    if (cmd == "bench") return app::cmd_bench(rest);
    if (cmd == "serve") return app::cmd_serve(rest);
    std::fprintf(stderr, "deltaserve: unknown command '%s'\n\n%s", cmd.c_str(), app::kUsage);
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {  // a bug: still a message and an exit code, not an abort
    std::fprintf(stderr, "error: internal error: %s\n", e.what());
    return 1;
  }
}
