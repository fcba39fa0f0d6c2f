// A real server in the test process: the embedded default model (dummy weights) on the CPU, the
// Qwen3 tokenizer and chat template, the OpenAI routes and the HTTP server on an ephemeral port,
// served on a thread of its own; plus a blocking raw-socket client for byte-exact requests.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "test_util.h"
#include "tokenizer/chat_template_source.h"

namespace deltaserve::testing {

class TestServer {
 public:
  explicit TestServer(server::HttpServerConfig hcfg = {}, server::ApiConfig acfg = {},
                      int32_t max_num_seqs = 16) {
    model_ = model::load_model("", model::LoadFormat::kDummy, backend_, false);
    tok_ = tokenizer::Tokenizer::from_file(qwen3_tokenizer() / "tokenizer.json");
    chat_ = tokenizer::load_chat_template(qwen3_tokenizer());
    engine::EngineConfig ecfg;
    ecfg.max_model_len = 1024;
    ecfg.max_num_seqs = max_num_seqs;
    // Room for 512 tokens a sequence: the server tests meet the server, not the scheduler's
    // admission under KV pressure.
    ecfg.num_pages = max_num_seqs * 512 / ecfg.page_size;
    engine_ = std::make_unique<engine::Engine>(*model_, ecfg, tok_.get());
    api_ = std::make_unique<server::OpenAiApi>(acfg, *engine_, *tok_, chat_.get());
    hcfg.port = 0;
    http_ = std::make_unique<server::HttpServer>(
        hcfg, [this](const server::Request& r) { return api_->handle(r); });
    thread_ = std::thread([this] { http_->run(nullptr); });
  }
  ~TestServer() {
    http_->stop();
    thread_.join();
    http_.reset();
    api_.reset();
    engine_.reset();
  }
  uint16_t port() const { return http_->port(); }
  server::HttpServer& http() { return *http_; }
  engine::Engine& engine() { return *engine_; }

 private:
  backend::CpuBackend backend_;
  std::unique_ptr<model::Qwen35Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<tokenizer::ChatTemplate> chat_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<server::OpenAiApi> api_;
  std::unique_ptr<server::HttpServer> http_;
  std::thread thread_;
};

// A connected socket (-1 when connecting failed, e.g. out of file descriptors).
inline int connect_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the peer closes or `timeout` passes without a byte.
inline std::string read_until_close(int fd, std::chrono::milliseconds timeout) {
  std::string out;
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Sends raw request bytes on a new connection and returns everything the server sent back
// before closing (requests should carry `Connection: close`).
inline std::string raw_exchange(uint16_t port, const std::string& bytes,
                                std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const int fd = connect_to(port);
  if (fd < 0) return "";
  send_all(fd, bytes);
  std::string out = read_until_close(fd, timeout);
  ::close(fd);
  return out;
}

// Reads exactly one response with a Content-Length body ("" on timeout or close before it).
inline std::string read_one_response(int fd, std::chrono::milliseconds timeout) {
  std::string got;
  char buf[4096];
  for (;;) {
    const size_t end = got.find("\r\n\r\n");
    if (end != std::string::npos) {
      const size_t at = got.find("Content-Length: ");
      if (at == std::string::npos || at > end) return got.substr(0, end + 4);
      const size_t len = std::stoul(got.substr(at + 16));
      if (got.size() >= end + 4 + len) return got.substr(0, end + 4 + len);
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return "";
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return "";
    got.append(buf, static_cast<size_t>(n));
  }
}

inline std::string post_request(const std::string& path, const std::string& body) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n"
         "Content-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

inline std::string get_request(const std::string& path, const std::string& method = "GET") {
  return method + " " + path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
}

// The status code of a raw HTTP response (0 when there is none).
inline int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

}  // namespace deltaserve::testing
