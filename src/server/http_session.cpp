#include "server/http_session.h"

#include <sstream>

namespace deltaserve::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

namespace {

bool is_http_protocol_error(const beast::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_method).category() &&
         ec != http::error::end_of_stream && ec != http::error::partial_message;
}

}  // namespace

Session::Session(tcp::socket socket, HttpServer& server)
    : stream_(std::move(socket)), server_(server) {
  ++server_.connections_;
}

Session::~Session() {
  server_.release_body(reserved_);
  --server_.connections_;
}

void Session::reject() {
  error_and_close(http::status::service_unavailable,
                  "the server has too many open connections; retry later");
}

void Session::read_header() {
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(server_.cfg_.max_header_bytes));
  parser_->body_limit(server_.cfg_.max_body_bytes);
  stream_.expires_after(first_ ? server_.cfg_.header_timeout : server_.cfg_.idle_timeout);
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void Session::on_header(beast::error_code ec) {
  if (ec) return on_read_error(ec);
  first_ = false;
  stream_.expires_after(server_.cfg_.header_timeout);
  const auto& req = parser_->get();
  version_ = req.version();
  // The budget is charged before a byte of the body is read; a chunked body counts at the cap.
  const auto length = parser_->content_length();
  const size_t want = parser_->is_done() ? 0
                      : length           ? static_cast<size_t>(*length)
                                         : server_.cfg_.max_body_bytes;
  if (want > server_.cfg_.max_body_bytes)
    return error_and_close(http::status::payload_too_large,
                           "request body exceeds the server's limit");
  if (want > 0) {
    if (!server_.reserve_body(want))
      return error_and_close(http::status::service_unavailable,
                             "the server is receiving too many request bodies; retry later");
    reserved_ = want;
  }
  if (!parser_->is_done() && beast::iequals(req[http::field::expect], "100-continue")) {
    auto msg = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    return asio::async_write(stream_, asio::buffer(*msg),
                             [self = shared_from_this(), msg](beast::error_code wec, size_t) {
                               if (wec) return self->close();
                               self->read_body();
                             });
  }
  read_body();
}

void Session::read_body() {
  http::async_read(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
}

void Session::on_body(beast::error_code ec) {
  if (ec) return on_read_error(ec);
  stream_.expires_never();
  Request req = parser_->release();
  req_keep_alive_ = req.keep_alive();
  head_ = req.method() == http::verb::head;
  if (head_) req.method(http::verb::get);
  server_.dispatch(shared_from_this(), std::move(req));
}

void Session::on_read_error(beast::error_code ec) {
  if (ec == http::error::body_limit)
    return error_and_close(http::status::payload_too_large,
                           "request body exceeds the server's limit");
  if (ec == http::error::header_limit)
    return error_and_close(http::status::request_header_fields_too_large,
                           "request headers exceed the server's limit");
  if (is_http_protocol_error(ec))
    return error_and_close(http::status::bad_request, "malformed HTTP request: " + ec.message());
  close();  // end of stream, timeout, reset
}

void Session::error_and_close(http::status status, const std::string& message) {
  const char* type =
      status == http::status::service_unavailable ? "server_overloaded" : "invalid_request_error";
  Response res = json_response(status, error_body(message, type, static_cast<int>(status)),
                               version_ == 10 ? 10 : 11, false);
  if (status == http::status::service_unavailable) res.set(http::field::retry_after, "1");
  write_response(std::move(res));
}

void Session::deliver(Reply reply) {
  server_.release_body(reserved_);
  reserved_ = 0;
  if (auto* r = std::get_if<Response>(&reply)) {
    r->version(version_);
    r->keep_alive(r->keep_alive() && parser_ && parser_->keep_alive());
    if (head_) {  // HEAD: the GET reply's headers, Content-Length included, and no body
      const size_t length = r->body().size();
      r->body().clear();
      r->content_length(length);
    }
    return write_response(std::move(*r));
  }
  start_async(std::move(std::get<AsyncReply>(reply)));
}

void Session::write_response(Response res) {
  auto sp = std::make_shared<Response>(std::move(res));
  stream_.expires_after(server_.cfg_.header_timeout);
  http::async_write(stream_, *sp, [self = shared_from_this(), sp](beast::error_code ec, size_t) {
    if (ec || !sp->keep_alive()) return self->close();
    self->read_header();
  });
}

void Session::start_async(AsyncReply reply) {
  reply_ = std::move(reply);
  ++server_.open_replies_;
  counted_ = true;
  open_ = true;
  self_ = shared_from_this();  // no read is pending now: the reply keeps the session alive
  server_.track(this, shared_from_this());
  if (reply_.sse) {
    enqueue("HTTP/1." + std::to_string(version_ % 10) +
            " 200 OK\r\nServer: deltaserve\r\nContent-Type: text/event-stream\r\n"
            "Cache-Control: no-cache\r\nConnection: close\r\n\r\n");
  }
  watch_disconnect();
  // The engine thread's wake-up goes through the server's batcher: one post for all the sessions
  // with new deltas, not one each.
  auto weak = weak_from_this();
  reply_.stream->set_listener([weak, exec = stream_.get_executor(), drains = &server_.drains_] {
    drains->add(exec, [weak] {
      if (auto self = weak.lock()) self->drain();
    });
  });
}

// Takes every queued delta (on the session's strand).
void Session::drain() {
  if (!open_) return;
  engine::OutputDelta d;
  std::string bytes;
  bool finished = false;
  while (!finished && reply_.stream->try_next(d)) {
    bytes += reply_.on_delta(d);
    finished = d.finished;
  }
  if (!finished) {
    if (!bytes.empty()) enqueue(std::move(bytes));
    return;
  }
  if (reply_.sse) {
    bytes += reply_.on_finish();
  } else {  // a whole body: the connection stays for the next request when the client wants
    keep_after_ = req_keep_alive_;
    std::string body = reply_.on_finish();
    Response res = json_response(reply_.final_status ? reply_.final_status() : http::status::ok,
                                 std::move(body), version_ == 10 ? 10 : 11, keep_after_);
    std::ostringstream os;
    os << res;
    bytes = os.str();
  }
  finish_reply(std::move(bytes));
}

void Session::cut(const std::string& reason) {
  if (!open_) return;
  reply_.abort();
  std::string bytes;
  if (reply_.sse) {
    bytes = reply_.on_cut(reason);
  } else {
    Response res =
        json_response(http::status::service_unavailable, reply_.on_cut(reason), 11, false);
    std::ostringstream os;
    os << res;
    bytes = os.str();
  }
  finish_reply(std::move(bytes));
}

void Session::finish_reply(std::string bytes) {
  open_ = false;
  done_ = true;
  reply_.stream->set_listener(nullptr);
  server_.untrack(this);
  if (keep_after_) {  // stop the disconnect watch before the next request's bytes can arrive
    beast::error_code ec;
    stream_.socket().cancel(ec);
  }
  if (bytes.empty() && writes_.empty()) return close();
  if (!bytes.empty()) enqueue(std::move(bytes));
}

void Session::enqueue(std::string bytes) {
  writes_.push_back(std::move(bytes));
  if (writes_.size() == 1) write_next();
}

void Session::write_next() {
  asio::async_write(stream_.socket(), asio::buffer(writes_.front()),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      if (ec) return self->client_gone();
                      self->writes_.pop_front();
                      if (!self->writes_.empty()) return self->write_next();
                      if (self->done_) self->end_reply();
                    });
}

// A readable socket while replying: the client sent more bytes (discarded), half-closed its side
// (end of file: it still waits for the reply, so the watch stops and the reply goes on) or reset
// the connection (gone). A client that closed entirely is found by the next write failing. The
// read is non-blocking: a readiness report with nothing to read must not block the io thread.
void Session::watch_disconnect() {
  stream_.socket().async_wait(
      tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
        if (ec || !self->open_) return;
        char buf[512];
        beast::error_code rec;
        self->stream_.socket().non_blocking(true, rec);
        const size_t n = rec ? 0 : self->stream_.socket().read_some(asio::buffer(buf), rec);
        if (rec == asio::error::would_block || rec == asio::error::try_again)
          return self->watch_disconnect();
        if (rec == asio::error::eof || (!rec && n == 0)) return;  // half-closed: keep replying
        if (rec) return self->client_gone();
        self->watch_disconnect();
      });
}

// The last byte of an async reply is out: the next request on this connection, or the end.
void Session::end_reply() {
  if (!keep_after_) return close();
  if (counted_) --server_.open_replies_;
  counted_ = false;
  done_ = keep_after_ = false;
  reply_ = AsyncReply{};
  asio::post(stream_.get_executor(), [self = std::move(self_)] {});  // the read holds the session
  read_header();
}

void Session::client_gone() {
  if (open_) {
    open_ = false;
    reply_.stream->set_listener(nullptr);
    server_.untrack(this);
    reply_.abort();
  }
  close();
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  if (counted_) --server_.open_replies_;
  counted_ = false;
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.socket().close(ec);
  // Pending handlers hold their own references; the session goes when the last one returns.
  asio::post(stream_.get_executor(), [self = std::move(self_)] {});
}

}  // namespace deltaserve::server
