// Regression tests for the server faults found by trying bad input (one per defect): each sends
// the bytes of the original repro to a real server on a socket, checks the answer, then checks the
// server still answers /health.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <vector>

#include "server/json_body.h"
#include "server/prometheus.h"
#include "server_fixture.h"

namespace deltaserve::testing {
namespace {

using namespace std::chrono_literals;

bool healthy(uint16_t port) { return status_of(raw_exchange(port, get_request("/health"))) == 200; }

TEST(HttpRobustness, InvalidUtf8PathAnswers404AndTheServerLives) {
  TestServer s;
  const std::string out =
      raw_exchange(s.port(), "GET /\xff\xfe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status_of(out), 404) << out;
  // The same with an API key set: unauthenticated paths must not crash either.
  EXPECT_TRUE(healthy(s.port()));
}

TEST(HttpRobustness, DeepNestingIsRefusedWith400) {
  TestServer s;
  const std::string deep = std::string(60000, '[') + std::string(60000, ']');
  for (const char* path : {"/tokenize", "/v1/chat/completions", "/v1/completions"}) {
    const std::string out = raw_exchange(s.port(), post_request(path, deep));
    EXPECT_EQ(status_of(out), 400) << path << ": " << out.substr(0, 300);
    EXPECT_NE(out.find("deeper than"), std::string::npos) << out;
  }
  // Nesting inside an accepted field (tools rendered by the chat template).
  std::string tool = "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":";
  for (int i = 0; i < 5000; ++i) tool += "{\"a\":";
  tool += "1" + std::string(5000, '}') + "}}";
  const std::string chat =
      R"({"messages":[{"role":"user","content":"hi"}],"tools":[)" + tool + "]}";
  EXPECT_EQ(status_of(raw_exchange(s.port(), post_request("/tokenize", chat))), 400);
  EXPECT_TRUE(healthy(s.port()));
}

TEST(HttpRobustness, ContentPartWithANonStringTypeIs400) {
  TestServer s;
  const std::string out = raw_exchange(
      s.port(),
      post_request("/v1/chat/completions",
                   R"({"messages":[{"role":"user","content":[{"type":0,"text":"x"}]}]})"));
  EXPECT_EQ(status_of(out), 400) << out;
}

TEST(HttpRobustness, IntegersOutOfRangeAreRefusedNotWrapped) {
  TestServer s;
  std::string out =
      raw_exchange(s.port(), post_request("/detokenize", R"({"tokens":[4294967301]})"));
  EXPECT_EQ(status_of(out), 400) << out;
  out = raw_exchange(s.port(), post_request("/detokenize", R"({"tokens":[18446744073709551615]})"));
  EXPECT_EQ(status_of(out), 400) << out;
  out = raw_exchange(s.port(), post_request("/v1/completions",
                                            R"({"prompt":"hi","max_tokens":9223372036854775807})"));
  EXPECT_EQ(status_of(out), 400) << out;
  EXPECT_NE(out.find("maximum context length"), std::string::npos) << out;
  EXPECT_EQ(out.find("min_tokens"), std::string::npos) << out;
}

TEST(HttpRobustness, BadFramingGets400AndOversizedHeaders431) {
  TestServer s;
  EXPECT_EQ(status_of(raw_exchange(s.port(), "GARBAGE\r\n\r\n")), 400);
  EXPECT_EQ(
      status_of(raw_exchange(s.port(), "POST /tokenize HTTP/1.1\r\nContent-Length: x\r\n\r\n")),
      400);
  const std::string big = "GET /health HTTP/1.1\r\nX-Big: " + std::string(200000, 'a') + "\r\n\r\n";
  EXPECT_EQ(status_of(raw_exchange(s.port(), big)), 431);
  EXPECT_TRUE(healthy(s.port()));
}

TEST(HttpRobustness, HeadAnswersLikeGetWithoutABody) {
  TestServer s;
  const std::string out = raw_exchange(s.port(), get_request("/v1/models", "HEAD"));
  EXPECT_EQ(status_of(out), 200) << out;
  const size_t end = out.find("\r\n\r\n");
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(out.size(), end + 4) << "no body after the headers";
  EXPECT_EQ(out.find("Content-Length: 0"), std::string::npos) << "the GET body's length";
  EXPECT_EQ(status_of(raw_exchange(s.port(), get_request("/v1/nope"))), 404);
  EXPECT_EQ(status_of(raw_exchange(s.port(), get_request("/v1/completions"))), 405);
}

TEST(HttpRobustness, ExpectContinueGets100BeforeTheBody) {
  TestServer s;
  const std::string body = R"({"prompt": "Hello"})";
  const int fd = connect_to(s.port());
  ASSERT_GE(fd, 0);
  send_all(fd,
           "POST /tokenize HTTP/1.1\r\nHost: t\r\nConnection: close\r\nExpect: 100-continue\r\n"
           "Content-Length: " +
               std::to_string(body.size()) + "\r\n\r\n");
  const std::string interim = read_until_close(fd, 2000ms);
  EXPECT_EQ(interim.rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u) << interim;
  send_all(fd, body);
  const std::string out = read_until_close(fd, 10s);
  ::close(fd);
  EXPECT_EQ(status_of(out), 200) << out;
}

TEST(HttpRobustness, HalfClosedClientGetsItsReply) {
  TestServer s;
  const int fd = connect_to(s.port());
  ASSERT_GE(fd, 0);
  send_all(fd, post_request("/v1/completions", R"({"prompt":"hi","max_tokens":4})"));
  ::shutdown(fd, SHUT_WR);
  const std::string out = read_until_close(fd, 20s);
  ::close(fd);
  EXPECT_EQ(status_of(out), 200) << out;
  EXPECT_NE(out.find("\"completion_tokens\":4"), std::string::npos) << out;
}

TEST(HttpRobustness, ConnectionLimitAnswers503AndRecovers) {
  server::HttpServerConfig cfg;
  cfg.max_connections = 8;
  TestServer s(cfg);
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(connect_to(s.port()));
  std::this_thread::sleep_for(200ms);
  const std::string out = raw_exchange(s.port(), get_request("/health"));
  EXPECT_EQ(status_of(out), 503) << out;
  EXPECT_NE(out.find("Retry-After"), std::string::npos);
  for (int fd : idle) ::close(fd);
  bool ok = false;
  for (int i = 0; i < 50 && !ok; ++i) {
    ok = healthy(s.port());
    if (!ok) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(ok);
}

TEST(HttpRobustness, IdleConnectionsAreClosedAfterTheHeaderTimeout) {
  server::HttpServerConfig cfg;
  cfg.header_timeout = 300ms;
  TestServer s(cfg);
  const int fd = connect_to(s.port());
  ASSERT_GE(fd, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string out = read_until_close(fd, 5s);
  const auto waited = std::chrono::steady_clock::now() - t0;
  ::close(fd);
  EXPECT_TRUE(out.empty()) << out;
  EXPECT_LT(waited, 4s) << "the server closed the idle connection itself";
}

TEST(HttpRobustness, ConcurrentBodiesBeyondTheBudgetGet503) {
  server::HttpServerConfig cfg;
  cfg.max_body_bytes = 1 << 20;
  cfg.max_body_bytes_in_flight = 1 << 20;
  TestServer s(cfg);
  // A first upload announces most of the budget and sends only part of it: its bytes stay
  // reserved, so a second body does not fit.
  const int slow = connect_to(s.port());
  ASSERT_GE(slow, 0);
  send_all(slow,
           "POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Length: 1048000\r\n\r\n{\"prompt\":\"");
  std::this_thread::sleep_for(200ms);
  const std::string second = R"({"prompt":")" + std::string(1000, 'x') + "\"}";
  const std::string out = raw_exchange(s.port(), post_request("/tokenize", second));
  EXPECT_EQ(status_of(out), 503) << out;
  ::close(slow);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(status_of(raw_exchange(s.port(), post_request("/tokenize", R"({"prompt":"x"})"))), 200);
}

TEST(HttpRobustness, HealthAnswersWhileLargeBodiesAreParsed) {
  TestServer s;
  std::string body = "{";
  for (int i = 0; i < 200000; ++i) body += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
  body += ",\"prompt\":\"x\"}";
  std::vector<std::future<std::string>> uploads;
  for (int i = 0; i < 2; ++i)
    uploads.push_back(std::async(std::launch::async, [&] {
      return raw_exchange(s.port(), post_request("/tokenize", body), 60s);
    }));
  int ok = 0;
  for (int i = 0; i < 10; ++i) {
    const std::string out = raw_exchange(s.port(), get_request("/health"), 2s);
    ok += status_of(out) == 200;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(ok, 10);
  for (auto& u : uploads) EXPECT_EQ(status_of(u.get()), 200);
}

// Whole (non-streamed) completions keep the connection, as vLLM's do: two on one socket.
TEST(HttpRobustness, NonStreamedCompletionsKeepTheConnectionAlive) {
  TestServer s;
  const int fd = connect_to(s.port());
  ASSERT_GE(fd, 0);
  const std::string body = R"({"prompt":"Hi","max_tokens":3})";
  const std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
      "\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(send_all(fd, req));
    const std::string out = read_one_response(fd, 20s);
    EXPECT_EQ(status_of(out), 200) << "request " << i << ": " << out;
    EXPECT_EQ(out.find("Connection: close"), std::string::npos) << out;
    EXPECT_NE(out.find("\"completion_tokens\":3"), std::string::npos) << out;
  }
  ::close(fd);
}

TEST(HttpRobustness, VersionAndPingAnswerLikeVllm) {
  TestServer s;
  const std::string v = raw_exchange(s.port(), get_request("/version"));
  EXPECT_EQ(status_of(v), 200) << v;
  EXPECT_NE(v.find("\"version\":\""), std::string::npos) << v;
  EXPECT_EQ(status_of(raw_exchange(s.port(), get_request("/ping"))), 200);
  EXPECT_EQ(status_of(raw_exchange(s.port(), post_request("/ping", ""))), 200);
  EXPECT_EQ(status_of(raw_exchange(s.port(), post_request("/version", "{}"))), 405);
}

TEST(JsonBody, KeepsKeyOrderAndTheLastDuplicate) {
  server::json j;
  std::string err;
  std::string body = "{";
  for (int i = 0; i < 40; ++i)
    body += "\"k" + std::to_string(39 - i) + "\":" + std::to_string(i) + ",";
  body += "\"k5\":\"last\",\"z\":[1,{\"b\":2,\"a\":3}]}";
  ASSERT_TRUE(server::parse_json_body(body, j, err)) << err;
  ASSERT_EQ(j.size(), 41u);
  EXPECT_EQ(j.begin().key(), "k39");
  EXPECT_EQ(j["k5"], "last");
  EXPECT_EQ(server::dump_json(j["z"]), R"([1,{"b":2,"a":3}])");
  EXPECT_EQ(j, server::json::parse(body)) << "the same value nlohmann's own parser builds";
}

TEST(JsonBody, RefusesMalformedDeepAndOversizedInput) {
  server::json j;
  std::string err;
  EXPECT_FALSE(server::parse_json_body("{\"a\":", j, err));
  EXPECT_NE(err.find("Malformed"), std::string::npos);
  EXPECT_FALSE(server::parse_json_body(std::string(200, '[') + std::string(200, ']'), j, err));
  EXPECT_NE(err.find("deeper"), std::string::npos);
  EXPECT_TRUE(server::parse_json_body(std::string(100, '[') + std::string(100, ']'), j, err));
  server::JsonLimits small;
  small.max_values = 10;
  EXPECT_FALSE(server::parse_json_body("[1,2,3,4,5,6,7,8,9,10,11]", j, err, small));
  EXPECT_NE(err.find("more than 10"), std::string::npos);
}

TEST(JsonBody, DumpReplacesInvalidUtf8InsteadOfThrowing) {
  const server::json j = {{"m", std::string("a\xff")}};
  EXPECT_EQ(server::dump_json(j), "{\"m\":\"a\xef\xbf\xbd\"}");
}

TEST(Prometheus, LabelValuesAreEscaped) {
  EXPECT_EQ(server::prometheus_label_value("my\"model\\name\nx"), "my\\\"model\\\\name\\nx");
  engine::MetricsSnapshot m;
  const std::string text = server::prometheus_text(m, std::string(300, 'm'), 0);
  EXPECT_NE(text.find("deltaserve_e2e_request_latency_seconds_count{model_name=\"" +
                      std::string(300, 'm') + "\"} 0\n"),
            std::string::npos)
      << "a long model name must not cut the _count line";
}

}  // namespace
}  // namespace deltaserve::testing
