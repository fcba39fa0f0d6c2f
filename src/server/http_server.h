// HttpServer: an asynchronous HTTP/1.1 server on Boost.Beast/Asio. Connections cost no thread:
// a few io threads do all socket I/O and answer cheap GET routes (/health, /metrics) inline; every
// other request is handled on a worker pool, so parsing a large body never delays a health probe.
// A route answers with a complete response, or with an AsyncReply fed by an engine RequestStream
// (SSE streaming or one JSON body at the end).
//
// Limits that keep one client from taking the server down: a connection cap (answered 503), a
// header-read and a keep-alive idle timeout, a body cap (413), header cap (431), and a budget of
// body bytes held at once across all connections (503 + Retry-After above it). Accepting re-arms
// with back-off when the process runs out of file descriptors.
#pragma once

// NOTE: Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
// clang-format off
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>
// clang-format on

#include "engine/request.h"
#include "server/drain_batcher.h"

namespace deltaserve::server {

namespace http = boost::beast::http;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// A reply produced from an engine stream.
struct AsyncReply {
  std::shared_ptr<engine::RequestStream> stream;
  bool sse = false;  // text/event-stream: bytes are sent as deltas arrive
  // Bytes to send for a delta (SSE events); for non-SSE replies, accumulate and return "".
  std::function<std::string(const engine::OutputDelta&)> on_delta;
  // After the final delta: the closing SSE events, or the whole JSON body.
  std::function<std::string()> on_finish;
  std::function<void()> abort;  // the client went away, or the reply was cut
  // Non-SSE replies: the status of the final response (called after on_finish); null = 200.
  std::function<http::status()> final_status;
  // The reply is cut before it finished (shutdown deadline): the closing SSE events (an error
  // event naming `reason`), or the JSON error body of a 503. abort() runs too.
  std::function<std::string(const std::string& reason)> on_cut;
};

using Reply = std::variant<Response, AsyncReply>;
using Handler = std::function<Reply(const Request&)>;

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  size_t max_body_bytes = 32 << 20;
  size_t max_header_bytes = 64 << 10;
  // Request bodies held in memory at once, across connections (chunked bodies count at
  // max_body_bytes). 0: 2 x max_body_bytes.
  size_t max_body_bytes_in_flight = 0;
  int threads = 2;         // io threads
  int worker_threads = 2;  // request handlers (parsing, tokenizing, rendering)
  // Open connections; beyond it a new connection gets a 503 and is closed. 0: from the file
  // descriptor limit (RLIMIT_NOFILE - 64, at most 16384).
  int max_connections = 0;
  std::chrono::milliseconds header_timeout{30'000};  // a request's headers and body
  std::chrono::milliseconds idle_timeout{5'000};     // keep-alive between requests (vLLM: 5 s)
};

class Session;

class HttpServer {
 public:
  // Binds and listens; throws deltaserve::Error when the address cannot be used.
  HttpServer(HttpServerConfig cfg, Handler handler);
  ~HttpServer();

  // Serves on cfg.threads threads until stop(). `on_signal(n)` runs (on an io thread) for the n-th
  // SIGINT or SIGTERM; accepting has stopped by the first.
  void run(std::function<void(int)> on_signal);
  // Stops accepting new connections (in-flight replies continue).
  void stop_accepting();
  // Ends every reply still open with its on_cut bytes (a final error event or a 503).
  void cut_open_replies(const std::string& reason);
  // Ends run(): stops the io threads.
  void stop();
  uint16_t port() const { return port_; }
  // Async replies whose last byte is not yet written (or whose connection has not closed).
  int64_t open_replies() const { return open_replies_.load(); }
  int64_t open_connections() const { return connections_.load(); }
  const HttpServerConfig& config() const { return cfg_; }

 private:
  friend class Session;
  void accept();
  void accept_later();
  void dispatch(std::shared_ptr<Session> s, Request req);
  bool reserve_body(size_t bytes);
  void release_body(size_t bytes);
  void track(Session* s, const std::shared_ptr<Session>& sp);
  void untrack(Session* s);
  Reply handle_safely(const Request& req);

  HttpServerConfig cfg_;
  Handler handler_;
  boost::asio::io_context io_;
  DrainBatcher drains_{io_.get_executor()};  // sessions' drains posted by the engine thread
  boost::asio::thread_pool workers_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer accept_retry_;
  std::chrono::milliseconds accept_backoff_{0};
  std::atomic<bool> accepting_{true};
  uint16_t port_ = 0;
  int signals_seen_ = 0;
  std::atomic<int64_t> open_replies_{0};
  std::atomic<int64_t> connections_{0};
  std::atomic<size_t> body_bytes_{0};
  std::mutex replying_mu_;
  std::unordered_map<Session*, std::weak_ptr<Session>> replying_;
};

// A JSON response with the given status.
Response json_response(http::status status, std::string body, unsigned version = 11,
                       bool keep_alive = true);
// A JSON error body in OpenAI's shape.
std::string error_body(const std::string& message, const char* type, int code);

}  // namespace deltaserve::server
