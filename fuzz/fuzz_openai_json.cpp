// The OpenAI JSON -> engine request conversion: the first byte picks the route, the rest is the
// request body (parsing, validation, sampling parameters, chat rendering, tokenizing).
#include "api_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltaserve;
  namespace http = boost::beast::http;
  if (size == 0) return 0;
  static const char* kRoutes[] = {"/v1/chat/completions", "/v1/completions", "/tokenize",
                                  "/detokenize"};
  server::Request req{http::verb::post, kRoutes[data[0] % 4], 11};
  req.set(http::field::content_type, "application/json");
  req.body().assign(reinterpret_cast<const char*>(data + 1), size - 1);
  req.prepare_payload();
  fuzz::expect_response(fuzz::ApiHarness::get().api->handle(req));
  return 0;
}
