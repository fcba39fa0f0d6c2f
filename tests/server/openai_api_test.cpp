// The OpenAI routes when the engine fails (fail-stop): a tensor-parallel rank faults mid-step on
// CPU ranks; the request in flight gets an error naming the fault, /health and new requests answer
// 503. And the served model names: every one listed and accepted, replies naming the first.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "dist/faulty_comm.h"
#include "engine/executor.h"
#include "model/loader.h"
#include "test_util.h"

namespace deltaserve::server {
namespace {

Request make_request(http::verb verb, const std::string& target, const std::string& body = "") {
  Request r{verb, target, 11};
  r.set(http::field::content_type, "application/json");
  r.body() = body;
  r.prepare_payload();
  return r;
}

TEST(OpenAiApiFailStop, RankFaultFailsTheRequestAndTheServerReportsUnhealthy) {
  std::unique_ptr<deltaserve::testing::FaultyComm> fault;
  engine::TpExecutor exec(
      2, [](int) { return std::make_unique<backend::CpuBackend>(); },
      [&](int rank, backend::Backend& be, dist::Communicator* comm) {
        if (rank == 1) {  // its first all-reduce throws
          fault = std::make_unique<deltaserve::testing::FaultyComm>(comm, 1);
          comm = fault.get();
        }
        return model::load_model("", model::LoadFormat::kDummy, be, false, {2, rank}, comm);
      },
      std::chrono::seconds(20));
  const auto tok =
      tokenizer::Tokenizer::from_file(deltaserve::testing::qwen3_tokenizer() / "tokenizer.json");
  engine::EngineConfig cfg;
  cfg.max_model_len = 256;
  engine::Engine e(exec, cfg, tok.get());
  OpenAiApi api({}, e, *tok, nullptr);

  auto health = [&] {
    const Reply r = api.handle(make_request(http::verb::get, "/health"));
    return std::get<Response>(r).result();
  };
  EXPECT_EQ(health(), http::status::ok);

  const std::string body = R"({"model": "deltaserve", "prompt": "Hello there", "max_tokens": 8})";
  Reply r = api.handle(make_request(http::verb::post, "/v1/completions", body));
  ASSERT_TRUE(std::holds_alternative<AsyncReply>(r));
  AsyncReply& a = std::get<AsyncReply>(r);
  engine::OutputDelta d;
  int finals = 0;
  while (a.stream->next(d, std::chrono::seconds(30))) {
    a.on_delta(d);
    if (d.finished) {
      ++finals;
      break;
    }
  }
  ASSERT_EQ(finals, 1) << "the request must end (with an error), not hang";
  const std::string out = a.on_finish();
  ASSERT_TRUE(a.final_status);
  EXPECT_EQ(a.final_status(), http::status::internal_server_error);
  EXPECT_NE(out.find("injected fault"), std::string::npos) << out;

  EXPECT_EQ(health(), http::status::service_unavailable);
  const Reply again = api.handle(make_request(http::verb::post, "/v1/completions", body));
  ASSERT_TRUE(std::holds_alternative<Response>(again));
  EXPECT_EQ(std::get<Response>(again).result(), http::status::service_unavailable);
  EXPECT_NE(std::get<Response>(again).body().find("injected fault"), std::string::npos);
}

// vLLM's --served-model-name A B: /v1/models lists every name, requests may use any of them, and
// replies name the first.
TEST(OpenAiApiModels, EveryServedNameIsListedAndAccepted) {
  backend::CpuBackend be;
  const auto model = model::load_model("", model::LoadFormat::kDummy, be, false);
  const auto tok =
      tokenizer::Tokenizer::from_file(deltaserve::testing::qwen3_tokenizer() / "tokenizer.json");
  engine::EngineConfig cfg;
  cfg.max_model_len = 256;
  engine::Engine e(*model, cfg, tok.get());
  ApiConfig acfg;
  acfg.served_model_name = "qwen";
  acfg.model_aliases = {"qwen-alias"};
  OpenAiApi api(acfg, e, *tok, nullptr);
  const json models = json::parse(
      std::get<Response>(api.handle(make_request(http::verb::get, "/v1/models"))).body());
  ASSERT_EQ(models["data"].size(), 2u) << models.dump();
  EXPECT_EQ(models["data"][0]["id"], "qwen");
  EXPECT_EQ(models["data"][1]["id"], "qwen-alias");
  const auto complete = [&](const std::string& name) {
    return api.handle(
        make_request(http::verb::post, "/v1/completions",
                     R"({"model": ")" + name + R"(", "prompt": "Hi", "max_tokens": 2})"));
  };
  Reply r = complete("qwen-alias");
  ASSERT_TRUE(std::holds_alternative<AsyncReply>(r));
  AsyncReply& a = std::get<AsyncReply>(r);
  engine::OutputDelta d;
  while (a.stream->next(d, std::chrono::seconds(30))) {
    a.on_delta(d);
    if (d.finished) break;
  }
  EXPECT_EQ(json::parse(a.on_finish())["model"], "qwen");
  const Reply other = complete("other");
  ASSERT_TRUE(std::holds_alternative<Response>(other));
  EXPECT_EQ(std::get<Response>(other).result(), http::status::not_found);
}

}  // namespace
}  // namespace deltaserve::server
