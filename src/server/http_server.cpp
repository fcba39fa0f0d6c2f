#include "server/http_server.h"

#include <boost/beast/core.hpp>
#include <csignal>
#include <deque>
#include <thread>

#include "core/error.h"

namespace deltaserve::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

Response json_response(http::status status, std::string body, unsigned version, bool keep_alive) {
  Response res{status, version};
  res.set(http::field::server, "deltaserve");
  res.set(http::field::content_type, "application/json");
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

// One connection: reads requests (keep-alive) and writes replies; an AsyncReply ends the
// connection when done (Connection: close), which keeps the disconnect watch simple.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer& server) : stream_(std::move(socket)), server_(server) {}

  void start() { read(); }

 private:
  void read() {
    parser_.emplace();
    parser_->body_limit(server_.cfg_.max_body_bytes);
    stream_.expires_after(std::chrono::minutes(10));
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout) return close();
    if (ec == http::error::body_limit) {
      return write_response(json_response(
          http::status::payload_too_large,
          R"({"error": {"message": "request body exceeds the server's limit", "type": "invalid_request_error", "param": null, "code": 413}})",
          11, false));
    }
    if (ec) return close();
    stream_.expires_never();
    const Request req = parser_->release();
    Reply reply = server_.handler_(req);
    if (auto* r = std::get_if<Response>(&reply)) {
      r->version(req.version());
      r->keep_alive(r->keep_alive() && req.keep_alive());
      return write_response(std::move(*r));
    }
    start_async(std::move(std::get<AsyncReply>(reply)), req.version());
  }

  void write_response(Response res) {
    auto sp = std::make_shared<Response>(std::move(res));
    http::async_write(stream_, *sp, [self = shared_from_this(), sp](beast::error_code ec, size_t) {
      if (ec || !sp->keep_alive()) return self->close();
      self->read();
    });
  }

  void start_async(AsyncReply reply, unsigned version) {
    reply_ = std::move(reply);
    ++server_.open_replies_;
    open_ = true;
    if (reply_.sse) {
      std::string head = "HTTP/1." + std::to_string(version % 10) +
                         " 200 OK\r\nServer: deltaserve\r\nContent-Type: text/event-stream\r\n"
                         "Cache-Control: no-cache\r\nConnection: close\r\n\r\n";
      enqueue(std::move(head));
    }
    watch_disconnect();
    auto weak = weak_from_this();
    auto exec = stream_.get_executor();
    reply_.stream->set_listener([weak, exec] {
      asio::post(exec, [weak] {
        if (auto self = weak.lock()) self->drain();
      });
    });
  }

  // Takes every queued delta (on the session's strand).
  void drain() {
    if (!open_) return;
    engine::OutputDelta d;
    std::string bytes;
    bool finished = false;
    while (!finished && reply_.stream->try_next(d)) {
      bytes += reply_.on_delta(d);
      finished = d.finished;
    }
    if (finished) {
      open_ = false;
      --server_.open_replies_;
      reply_.stream->set_listener(nullptr);
      if (reply_.sse) {
        bytes += reply_.on_finish();
      } else {
        std::string body = reply_.on_finish();
        Response res = json_response(reply_.final_status ? reply_.final_status() : http::status::ok,
                                     std::move(body), 11, false);
        std::ostringstream os;
        os << res;
        bytes = os.str();
      }
      done_ = true;
    }
    if (!bytes.empty()) enqueue(std::move(bytes));
  }

  void enqueue(std::string bytes) {
    writes_.push_back(std::move(bytes));
    if (writes_.size() == 1) write_next();
  }

  void write_next() {
    asio::async_write(stream_.socket(), asio::buffer(writes_.front()),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->client_gone();
                        self->writes_.pop_front();
                        if (!self->writes_.empty()) return self->write_next();
                        if (self->done_) self->close();
                      });
  }

  // A readable socket while replying means the client closed (or sent bytes we discard). The read
  // is non-blocking: a readiness report with nothing to read must not block the io thread.
  void watch_disconnect() {
    stream_.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
          if (ec || !self->open_) return;
          char buf[512];
          beast::error_code rec;
          self->stream_.socket().non_blocking(true, rec);
          const size_t n = rec ? 0 : self->stream_.socket().read_some(asio::buffer(buf), rec);
          if (rec == asio::error::would_block || rec == asio::error::try_again)
            return self->watch_disconnect();
          if (rec || n == 0) return self->client_gone();
          self->watch_disconnect();
        });
  }

  void client_gone() {
    if (open_) {
      open_ = false;
      --server_.open_replies_;
      reply_.stream->set_listener(nullptr);
      reply_.abort();
    }
    close();
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  HttpServer& server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  AsyncReply reply_;
  bool open_ = false;  // an async reply is in progress
  bool done_ = false;
  std::deque<std::string> writes_;
};

HttpServer::HttpServer(HttpServerConfig cfg, Handler handler)
    : cfg_(std::move(cfg)),
      handler_(std::move(handler)),
      acceptor_(io_),
      signals_(io_, SIGINT, SIGTERM) {
  beast::error_code ec;
  const auto addr = asio::ip::make_address(cfg_.host, ec);
  if (ec) throw Error("--host '" + cfg_.host + "' is not an IP address");
  const tcp::endpoint ep(addr, cfg_.port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw Error("cannot listen on " + cfg_.host + ":" + std::to_string(cfg_.port) + ": " +
                ec.message());
  port_ = acceptor_.local_endpoint().port();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::accept() {
  acceptor_.async_accept(asio::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) return;  // acceptor closed
    socket.set_option(tcp::no_delay(true), ec);
    std::make_shared<Session>(std::move(socket), *this)->start();
    accept();
  });
}

void HttpServer::run(std::function<void()> on_signal) {
  signals_.async_wait([this, on_signal](beast::error_code ec, int) {
    if (ec) return;
    stop_accepting();
    if (on_signal) on_signal();
  });
  accept();
  std::vector<std::thread> threads;
  for (int i = 1; i < cfg_.threads; ++i) threads.emplace_back([this] { io_.run(); });
  io_.run();
  for (auto& t : threads) t.join();
}

void HttpServer::stop_accepting() {
  asio::post(io_, [this] {
    beast::error_code ec;
    acceptor_.close(ec);
  });
}

void HttpServer::stop() { io_.stop(); }

}  // namespace deltaserve::server
