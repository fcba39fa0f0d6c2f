#include "server/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "server/http_session.h"

namespace deltaserve::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

namespace {

int default_max_connections() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 16384;
  return static_cast<int>(std::clamp<rlim_t>(rl.rlim_cur, 128, 16384 + 64) - 64);
}

// Cheap routes answered on the io thread; everything else goes to the worker pool.
bool answer_inline(const Request& req) {
  return req.method() == http::verb::get && req.body().empty();
}

}  // namespace

Response json_response(http::status status, std::string body, unsigned version, bool keep_alive) {
  Response res{status, version};
  res.set(http::field::server, "deltaserve");
  res.set(http::field::content_type, "application/json");
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

std::string error_body(const std::string& message, const char* type, int code) {
  const nlohmann::ordered_json j = {
      {"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}};
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

HttpServer::HttpServer(HttpServerConfig cfg, Handler handler)
    : cfg_(std::move(cfg)),
      handler_(std::move(handler)),
      workers_(static_cast<size_t>(std::max(1, cfg_.worker_threads))),
      acceptor_(io_),
      signals_(io_, SIGINT, SIGTERM),
      accept_retry_(io_) {
  if (cfg_.max_connections <= 0) cfg_.max_connections = default_max_connections();
  if (cfg_.max_body_bytes_in_flight == 0) cfg_.max_body_bytes_in_flight = 2 * cfg_.max_body_bytes;
  beast::error_code ec;
  auto addr = asio::ip::make_address(cfg_.host, ec);
  if (ec) {  // a host name (e.g. localhost): its first address
    asio::ip::tcp::resolver resolver(io_);
    const auto found = resolver.resolve(cfg_.host, "", ec);
    if (ec || found.empty())
      throw Error("--host '" + cfg_.host + "' is neither an IP address nor a known host name");
    addr = found.begin()->endpoint().address();
  }
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

HttpServer::~HttpServer() {
  stop();
  workers_.join();
}

void HttpServer::accept() {
  acceptor_.async_accept(asio::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !accepting_) return;  // acceptor closed
    if (ec) return accept_later();  // e.g. out of file descriptors: try again after a pause
    accept_backoff_ = std::chrono::milliseconds(0);
    socket.set_option(tcp::no_delay(true), ec);
    auto session = std::make_shared<Session>(std::move(socket), *this);
    if (connections_.load() > cfg_.max_connections)
      session->reject();
    else
      session->start();
    accept();
  });
}

void HttpServer::accept_later() {
  accept_backoff_ = std::min(std::chrono::milliseconds(1000),
                             std::max(std::chrono::milliseconds(10), accept_backoff_ * 2));
  accept_retry_.expires_after(accept_backoff_);
  accept_retry_.async_wait([this](beast::error_code ec) {
    if (!ec && accepting_) accept();
  });
}

Reply HttpServer::handle_safely(const Request& req) {
  try {
    return handler_(req);
  } catch (const std::exception& e) {
    return json_response(
        http::status::internal_server_error,
        error_body(std::string("internal error: ") + e.what(), "internal_error", 500));
  }
}

void HttpServer::dispatch(std::shared_ptr<Session> s, Request req) {
  if (answer_inline(req)) return s->deliver(handle_safely(req));
  asio::post(workers_, [this, s = std::move(s), req = std::move(req)]() mutable {
    auto reply = std::make_shared<Reply>(handle_safely(req));
    Request().swap(req);  // the body's memory goes before the reply is written
    auto exec = s->executor();
    asio::post(exec, [s = std::move(s), reply] { s->deliver(std::move(*reply)); });
  });
}

bool HttpServer::reserve_body(size_t bytes) {
  size_t cur = body_bytes_.load();
  do {
    if (cur + bytes > cfg_.max_body_bytes_in_flight && cur > 0) return false;
  } while (!body_bytes_.compare_exchange_weak(cur, cur + bytes));
  return true;
}

void HttpServer::release_body(size_t bytes) {
  if (bytes) body_bytes_ -= bytes;
}

void HttpServer::track(Session* s, const std::shared_ptr<Session>& sp) {
  std::lock_guard<std::mutex> lock(replying_mu_);
  replying_[s] = sp;
}

void HttpServer::untrack(Session* s) {
  std::lock_guard<std::mutex> lock(replying_mu_);
  replying_.erase(s);
}

void HttpServer::cut_open_replies(const std::string& reason) {
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard<std::mutex> lock(replying_mu_);
    for (auto& [ptr, weak] : replying_)
      if (auto sp = weak.lock()) open.push_back(std::move(sp));
  }
  for (auto& s : open) {
    auto exec = s->executor();
    asio::post(exec, [s, reason] { s->cut(reason); });
  }
}

void HttpServer::run(std::function<void(int)> on_signal) {
  std::function<void()> wait_signal;
  wait_signal = [this, on_signal, &wait_signal] {
    signals_.async_wait([this, on_signal, &wait_signal](beast::error_code ec, int) {
      if (ec) return;
      if (++signals_seen_ == 1) stop_accepting();
      if (on_signal) on_signal(signals_seen_);
      wait_signal();
    });
  };
  wait_signal();
  accept();
  std::vector<std::thread> threads;
  for (int i = 1; i < cfg_.threads; ++i) threads.emplace_back([this] { io_.run(); });
  io_.run();
  for (auto& t : threads) t.join();
  workers_.join();  // no handler outlives run(): the routes' owners may go right after
}

void HttpServer::stop_accepting() {
  asio::post(io_, [this] {
    accepting_ = false;
    beast::error_code ec;
    accept_retry_.cancel();
    acceptor_.close(ec);
  });
}

void HttpServer::stop() { io_.stop(); }

}  // namespace deltaserve::server
