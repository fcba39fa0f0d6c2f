// HTTP request parsing and routing: arbitrary bytes through Beast's request parser with the
// server's limits, then every parsed request through the OpenAI routes.
#include <boost/beast/core.hpp>

#include "api_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltaserve;
  namespace http = boost::beast::http;
  auto& h = fuzz::ApiHarness::get();
  http::request_parser<http::string_body> parser;
  parser.header_limit(64 << 10);
  parser.body_limit(1 << 20);
  parser.eager(true);
  boost::beast::error_code ec;
  parser.put(boost::asio::buffer(data, size), ec);
  if (!ec && !parser.is_done()) parser.put_eof(ec);
  if (ec || !parser.is_done()) return 0;
  server::Request req = parser.release();
  if (req.method() == http::verb::head) req.method(http::verb::get);
  fuzz::expect_response(h.api->handle(req));
  return 0;
}
