// The OpenAI routes when the engine fails (fail-stop): a tensor-parallel rank faults mid-step on
// CPU ranks; the request in flight gets an error naming the fault, /health and new requests answer
// 503.
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

}  // namespace
}  // namespace deltaserve::server
