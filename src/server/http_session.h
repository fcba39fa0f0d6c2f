// Session: one HTTP connection of HttpServer. Reads a request's headers, then its body (after
// `100 Continue` when asked, and only once the server's body budget admits it), hands the request
// to the server's dispatcher and writes the reply; keeps the connection for the next request
// (keep-alive), also after a whole JSON body fed by an engine stream; an SSE stream ends the
// connection (Connection: close: its length is unknown). Everything a Session does runs on its
// strand.
#pragma once

#include <boost/beast/core.hpp>
#include <deque>
#include <optional>

#include "server/http_server.h"

namespace deltaserve::server {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(boost::asio::ip::tcp::socket socket, HttpServer& server);
  ~Session();

  void start() { read_header(); }
  // Answers 503 (too many connections) and closes.
  void reject();
  // Delivers the handler's reply (on the session's strand).
  void deliver(Reply reply);
  // Ends an open async reply with its on_cut bytes.
  void cut(const std::string& reason);
  boost::asio::any_io_executor executor() { return stream_.get_executor(); }

 private:
  void read_header();
  void on_header(boost::beast::error_code ec);
  void read_body();
  void on_body(boost::beast::error_code ec);
  void on_read_error(boost::beast::error_code ec);
  void write_response(Response res);
  void error_and_close(http::status status, const std::string& message);
  void start_async(AsyncReply reply);
  void drain();
  void finish_reply(std::string bytes);
  void enqueue(std::string bytes);
  void write_next();
  void watch_disconnect();
  void end_reply();
  void client_gone();
  void close();

  boost::beast::tcp_stream stream_;
  HttpServer& server_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  size_t reserved_ = 0;  // body bytes held against the server's budget
  unsigned version_ = 11;
  bool head_ = false;  // a HEAD request: the GET reply without its body
  bool first_ = true;  // the connection's first request (later ones get the idle timeout)
  AsyncReply reply_;
  bool open_ = false;     // an async reply is in progress
  bool counted_ = false;  // counted in the server's open replies until the last byte is out
  bool done_ = false;
  bool closed_ = false;
  bool req_keep_alive_ = false;  // the request being answered asked for keep-alive
  bool keep_after_ = false;      // this async reply keeps the connection (a whole JSON body)
  std::deque<std::string> writes_;
  std::shared_ptr<Session> self_;  // set while an async reply is open
};

}  // namespace deltaserve::server
