// HttpServer: an asynchronous HTTP/1.1 server on Boost.Beast/Asio. Connections cost no thread:
// a few io threads serve all of them. A route answers with a complete response, or with an
// AsyncReply fed by an engine RequestStream (SSE streaming or one JSON body at the end); a client
// that goes away mid-reply triggers the reply's abort at once.
#pragma once

// NOTE: Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
// clang-format off
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <memory>
#include <string>
#include <variant>
// clang-format on

#include "engine/request.h"

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
  std::function<void()> abort;  // the client went away
  // Non-SSE replies: the status of the final response (called after on_finish); null = 200.
  std::function<http::status()> final_status;
};

using Reply = std::variant<Response, AsyncReply>;
using Handler = std::function<Reply(const Request&)>;

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  size_t max_body_bytes = 32 << 20;
  int threads = 2;
};

class HttpServer {
 public:
  // Binds and listens; throws deltaserve::Error when the address cannot be used.
  HttpServer(HttpServerConfig cfg, Handler handler);
  ~HttpServer();

  // Serves on cfg.threads threads until stop(). `on_signal` runs (on an io thread) when SIGINT or
  // SIGTERM arrives; accepting has stopped by then.
  void run(std::function<void()> on_signal);
  // Stops accepting new connections (in-flight replies continue).
  void stop_accepting();
  // Ends run(): stops the io threads.
  void stop();
  uint16_t port() const { return port_; }
  int64_t open_replies() const { return open_replies_.load(); }

 private:
  friend class Session;
  void accept();

  HttpServerConfig cfg_;
  Handler handler_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::signal_set signals_;
  uint16_t port_ = 0;
  std::atomic<int64_t> open_replies_{0};
};

// A JSON response with the given status.
Response json_response(http::status status, std::string body, unsigned version = 11,
                       bool keep_alive = true);

}  // namespace deltaserve::server
