// The deltaserve binary end to end: `logits` reproduces the HF goldens, `generate` runs, and bad
// flags fail with a clear message and exit code 1.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/safetensors.h"
#include "test_util.h"

namespace deltaserve {
namespace {

using deltaserve::testing::TempDir;
using deltaserve::testing::test_data;

struct Result {
  int code;
  std::string output;
};

Result run(const std::string& args) {
  const std::string cmd = std::string(DS_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// `logits` on a golden prompt of a test checkpoint with extra flags: max |error| over max |HF|.
float golden_logits_error(const std::string& name, const std::string& prompt,
                          const std::string& flags) {
  TempDir d;
  model::SafetensorsFile golden(test_data() / "goldens" / (name + ".safetensors"));
  const model::TensorInfo& ids_t = golden.tensors().at(prompt + ".ids");
  std::vector<int32_t> ids(static_cast<size_t>(ids_t.numel()));
  std::memcpy(ids.data(), ids_t.data, ids_t.nbytes);
  std::string list;
  for (int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  const auto out = d.path() / "l.safetensors";
  const Result r = run("logits --model " + (test_data() / name).string() + " --ids " + list +
                       " --out " + out.string() + flags);
  EXPECT_EQ(r.code, 0) << r.output;
  if (r.code != 0) return INFINITY;
  model::SafetensorsFile f(out);
  const model::TensorInfo& l = f.tensors().at("logits");
  const model::TensorInfo& ref = golden.tensors().at(prompt + ".logits");
  EXPECT_EQ(l.shape, ref.shape);
  if (l.shape != ref.shape) return INFINITY;
  const float* a = reinterpret_cast<const float*>(l.data);
  const float* b = reinterpret_cast<const float*>(ref.data);
  float err = 0, scale = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    err = std::max(err, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return err / scale;
}

TEST(Cli, LogitsMatchesHfGolden) {
  EXPECT_LE(golden_logits_error("tiny_odd", "prompt.1", ""), 1e-4f);
}

// TP2 with TPSP on every step (the 100-token prompt divides by 2) and the vocabulary-parallel
// lm_head: the same logits.
TEST(Cli, LogitsWithTpspMatchHfGolden) {
  EXPECT_LE(
      golden_logits_error("tiny_real", "prompt.4",
                          " --tensor-parallel-size 2 --enable-tpsp --tpsp-threshold-tokens 0"),
      1e-4f);
  // ... and in microchunks of 32 tokens (three of 32 and one of 4).
  EXPECT_LE(golden_logits_error("tiny_real", "prompt.4",
                                " --tensor-parallel-size 2 --enable-tpsp --tpsp-threshold-tokens 0"
                                " --tpsp-microchunk-tokens 32"),
            1e-4f);
}

TEST(Cli, GenerateRunsOnCheckpointAndDummy) {
  Result r = run("generate --model " + (test_data() / "tiny_real").string() +
                 " --ids 1,2,3 --max-tokens 5 --ignore-eos");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("tok/s"), std::string::npos) << r.output;
  r = run("generate --model " + (test_data() / "tiny_real").string() +
          " --load-format dummy --max-tokens 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("random weights"), std::string::npos) << r.output;
}

// As vLLM users type it: `serve --help`, `--version`, and a model given as a repository id whose
// snapshot `huggingface-cli download` left in the Hugging Face cache.
TEST(Cli, HelpVersionAndRepositoryIds) {
  for (const char* args : {"--help", "help", "serve --help", "serve -h", "bench offline --help"}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 0) << args;
    EXPECT_EQ(r.output.rfind("usage: deltaserve <command>", 0), 0u) << args << "\n" << r.output;
  }
  const Result v = run("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_EQ(v.output.rfind("deltaserve 0.", 0), 0u) << v.output;
  TempDir cache;  // Org/tiny at commit abc: tiny_real's files
  const std::filesystem::path repo = cache.path() / "models--Org--tiny";
  std::filesystem::create_directories(repo / "snapshots" / "abc");
  std::filesystem::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << "abc";
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json"})
    std::filesystem::copy_file(test_data() / "tiny_real" / f, repo / "snapshots" / "abc" / f);
  const char* old = std::getenv("HF_HUB_CACHE");
  const std::string saved = old ? old : "";
  setenv("HF_HUB_CACHE", cache.path().c_str(), 1);
  const Result found = run("generate --model Org/tiny --ids 1,2,3 --max-tokens 2 --ignore-eos");
  const Result absent = run("generate --model Org/absent --ids 1");
  if (old)
    setenv("HF_HUB_CACHE", saved.c_str(), 1);
  else
    unsetenv("HF_HUB_CACHE");
  EXPECT_EQ(found.code, 0) << found.output;
  EXPECT_NE(found.output.find("tok/s"), std::string::npos) << found.output;
  EXPECT_EQ(absent.code, 1);
  EXPECT_NE(absent.output.find("not in the Hugging Face cache"), std::string::npos)
      << absent.output;
}

TEST(Cli, TokenizeAndDetokenize) {
  const std::string tk = "--tokenizer " + deltaserve::testing::qwen3_tokenizer().string();
  Result r = run("tokenize " + tk + " --text '<|im_start|>Hello world'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "[151644, 9707, 1879]\n");
  r = run("detokenize " + tk + " --ids 151644,9707,1879");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "<|im_start|>Hello world\n");
  r = run("detokenize " + tk + " --ids 151644,9707,1879 --skip-special-tokens");
  EXPECT_EQ(r.output, "Hello world\n");
  r = run("detokenize " + tk + " --ids 999999");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("not a token id"), std::string::npos) << r.output;
  r = run("tokenize --tokenizer /nonexistent --text x");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("/nonexistent/tokenizer.json: cannot open"), std::string::npos)
      << r.output;
}

TEST(Cli, BenchOfflinePrintsOneJsonLine) {
  const Result r = run("bench offline --model " + (test_data() / "tiny_real").string() +
                       " --num-prompts 6 --input-len 20 --output-len 5 --max-num-seqs 4");
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t at = r.output.find("{\"bench\": \"offline\"");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  EXPECT_NE(line.find("\"num_prompts\": 6,"), std::string::npos) << line;
  EXPECT_NE(line.find("\"output_tok_per_s\""), std::string::npos);
  EXPECT_NE(line.find("\"ttft_ms\": {\"mean\""), std::string::npos);
  EXPECT_EQ(line.back(), '}');
  // The same workload on an fp8 KV cache completes every request (exit code 0).
  const Result f = run("bench offline --model " + (test_data() / "tiny_real").string() +
                       " --num-prompts 6 --input-len 20 --output-len 5 --max-num-seqs 4"
                       " --kv-cache-dtype fp8");
  ASSERT_EQ(f.code, 0) << f.output;
  EXPECT_NE(f.output.find("\"num_prompts\": 6,"), std::string::npos) << f.output;
}

TEST(Cli, BadInputFailsClearly) {
  const std::string m = "--model " + (test_data() / "tiny_real").string();
  struct Case {
    std::string args, message;
  } cases[] = {
      {"generate --bogus 1", "unknown flag --bogus"},
      {"generate " + m + " --ids 1,x,3", "'x' is not a token id"},
      {"generate " + m + " --ids 99999", "'99999' is not a token id in [0, 384)"},
      {"generate " + m + " --max-tokens -3", "--max-tokens must be an integer"},
      {"generate " + m + " --device tpu", "--device must be cpu or cuda"},
      {"logits " + m + " --ids 1 --out /tmp/x.safetensors --device cuda --tensor-parallel-size 2",
       "--device cuda"},
      {"generate " + m + " --load-format pt", "--load-format must be"},
      {"generate --model /nonexistent", "/nonexistent: no such checkpoint directory"},
      {"serve Org/a --model Org/b", "two models: 'Org/a' and --model Org/b"},
      {"logits " + m + " --ids 1", "needs --model DIR --ids 1,2,3 --out"},
      {"frobnicate", "unknown command 'frobnicate'"},
      {"bench online", "usage: deltaserve bench offline"},
      {"bench offline --num-prompts 0", "--num-prompts must be an integer"},
      {"logits " + m + " --ids 1 --out /tmp/x.safetensors --tpsp-threshold-tokens 8",
       "--tpsp-threshold-tokens needs --enable-tpsp"},
      {"logits " + m + " --ids 1 --out /tmp/x.safetensors --tpsp-microchunk-tokens 8",
       "--tpsp-microchunk-tokens needs --enable-tpsp"},
      {"logits " + m +
           " --ids 1 --out /tmp/x.safetensors --tensor-parallel-size 2 --enable-tpsp"
           " --tpsp-microchunk-tokens 33",
       "--tpsp-microchunk-tokens must be a multiple of --tensor-parallel-size (2)"},
  };
  for (const Case& c : cases) {
    const Result r = run(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

// Flags and configs that used to abort (uncaught std::invalid_argument, DS_CHECK on a failed
// allocation) end with exit code 1 and a message.
TEST(Cli, MalformedNumbersAndAbsurdConfigsExitWithAMessage) {
  TempDir d;
  const std::string tok = "--tokenizer " + deltaserve::testing::qwen3_tokenizer().string();
  // tiny_real's config with text_config fields replaced (the first occurrence of each name).
  using Fields = std::vector<std::pair<std::string, std::string>>;
  auto absurd = [&](const std::string& name, const Fields& fields) {
    std::ifstream in(test_data() / "tiny_real" / "config.json");
    std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const auto& [field, value] : fields) {
      const size_t at = cfg.find("\"" + field + "\"");
      EXPECT_NE(at, std::string::npos) << field;
      const size_t colon = cfg.find(':', at), end = cfg.find_first_of(",}\n", colon);
      cfg.replace(colon + 1, end - colon - 1, " " + value);
    }
    std::filesystem::create_directories(d.path() / name);
    std::ofstream(d.path() / name / "config.json") << cfg;
    return "--model " + (d.path() / name).string() + " --load-format dummy";
  };
  struct Case {
    std::string args, message;
  } cases[] = {
      {"serve " + tok + " --kv-cache-gib abc", "--kv-cache-gib must be a number"},
      {"serve " + tok + " --kv-cache-gib -1", "--kv-cache-gib must be a number"},
      {"serve " + tok + " --max-model-len 0", "--max-model-len must be an integer in [1, "},
      {"serve " + tok + " --max-model-len fit", "--max-model-len must be an integer in [1, "},
      {"serve " + tok + " --gpu-memory-utilization abc",
       "--gpu-memory-utilization must be a number"},
      {"serve " + tok + " --gpu-memory-utilization 1.5",
       "--gpu-memory-utilization must be a number"},
      {"serve " + tok + " --shutdown-timeout nan", "--shutdown-timeout must be a number"},
      {"serve " + tok + " --chat-template /no/such.jinja", "looks like a file path"},
      {"serve " + tok + " --limit-mm-per-prompt image=0", "--limit-mm-per-prompt takes a JSON"},
      {"serve " + tok + " --enable-auto-tool-choice --tool-call-parser hermes",
       "tool calling needs --enable-auto-tool-choice --tool-call-parser qwen3_coder"},
      {"serve " + tok + " --tool-call-parser qwen3_xml", "tool calling needs"},
      {"serve " + tok + " --default-chat-template-kwargs enable_thinking=false",
       "--default-chat-template-kwargs must be a JSON object"},
      {"serve " + tok + " --generation-config /no/such",
       "--generation-config /no/such: no generation_config.json"},
      {"serve " + tok + " --override-generation-config '{\"temperature\": -1}'",
       "\"temperature\" must be a number"},
      {"generate " + absurd("vocab", {{"vocab_size", "1000000000000"}}),
       "\"vocab_size\" must be a positive integer (at most 16777216)"},
      {"generate " + absurd("hidden", {{"hidden_size", "18446744073709551615"}}),
       "\"hidden_size\" must be a positive integer (at most 65536)"},
      {"generate " + absurd("huge", {{"vocab_size", "16000000"}, {"hidden_size", "65536"}}) +
           " --max-tokens 1",
       "GiB of weights per rank"},
      {"generate " + absurd("type", {{"rms_norm_eps", "\"x\""}}), "must be a number"},
      // vLLM's flags: accepted, or refused when deltaserve cannot honour the value.
      {"serve " + tok + " --dtype float16", "--dtype float16 is not supported"},
      {"serve " + tok + " --block-size 32", "--block-size 32 is not supported"},
      {"serve " + tok + " --kv-cache-dtype fp8_e5m2",
       "--kv-cache-dtype fp8_e5m2 is not supported: use auto (the activations' dtype) or fp8"},
      {"bench offline --kv-cache-dtype int8", "--kv-cache-dtype int8 is not supported"},
      {"serve " + tok + " --seed x", "--seed must be an integer"},
      {"serve " + tok + " --enable-prefix-caching --no-enable-prefix-caching",
       "contradict each other"},
      {"serve " + tok + " --mamba-block-size 100", "--mamba-block-size must be a multiple of 64"},
      {"serve " + tok + " --prefix-cache-snapshot-fraction 2", "--prefix-cache-snapshot-fraction"},
      {"serve " + tok + " --mamba-ssm-cache-dtype float16",
       "--mamba-ssm-cache-dtype must be auto, float32 or bfloat16, got 'float16'"},
      {"bench offline --mamba-ssm-cache-dtype fp8", "--mamba-ssm-cache-dtype must be auto"},
      {"serve " + tok + " --long-prefill-token-threshold -1",
       "--long-prefill-token-threshold must be an integer in [0, "},
      {"serve " + tok + " --admission-reserve-tokens -5",
       "--admission-reserve-tokens must be an integer in [0, "},
      {"bench offline --admission-reserve-tokens x",
       "--admission-reserve-tokens must be an integer"},
  };
  for (const Case& c : cases) {
    const Result r = run(c.args);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

// --host is resolved (a host name is fine) and bound before anything loads.
TEST(Cli, ServeChecksTheHostBeforeLoading) {
  const std::string tok = "--tokenizer " + deltaserve::testing::qwen3_tokenizer().string();
  const Result r = run("serve " + tok +
                       " --host no-such-host.invalid --trust-remote-code "
                       "--disable-log-requests --uvicorn-log-level info --dtype auto "
                       "--language-model-only --limit-mm-per-prompt '{\"image\": 0}' "
                       "--served-model-name qwen qwen-alias --enable-auto-tool-choice "
                       "--tool-call-parser qwen3_xml");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("neither an IP address nor a known host name"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("loading"), std::string::npos) << "checked before the model loads";
}

// A malformed --max-model-len stops serve before the model loads; one over the model's context
// is the engine's error, after it (the context is the config's).
TEST(Cli, ServeChecksMaxModelLenBeforeLoading) {
  const std::string tok = "--tokenizer " + deltaserve::testing::qwen3_tokenizer().string();
  const Result bad = run("serve " + tok + " --max-model-len 12x");
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("--max-model-len must be an integer"), std::string::npos) << bad.output;
  EXPECT_EQ(bad.output.find("loading"), std::string::npos) << "checked before the model loads";
  const Result over = run("serve " + tok + " --max-model-len 1G");
  EXPECT_EQ(over.code, 1) << over.output;
  EXPECT_NE(over.output.find("exceeds the model's max_position_embeddings"), std::string::npos)
      << over.output;
}

// A --chat-template that is a template itself (not a file) is accepted: the host check is what
// stops this command.
TEST(Cli, ServeAcceptsAChatTemplateGivenInline) {
  const std::string tok = "--tokenizer " + deltaserve::testing::qwen3_tokenizer().string();
  const Result r = run("serve " + tok +
                       " --chat-template '{{ messages[0].content }}' --host no-such-host.invalid");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("neither an IP address nor a known host name"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace deltaserve
