// The one error -> HTTP mapping: every error kind, routing errors and unknown exceptions.
#include "server/error_reply.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace deltaserve::server {
namespace {

struct Case {
  std::exception_ptr error;
  http::status status;
  std::string type;
  bool retry_after;
};

template <class E, class... A>
std::exception_ptr make(A&&... a) {
  return std::make_exception_ptr(E(std::forward<A>(a)...));
}

TEST(ErrorReply, EveryKindMapsToItsStatus) {
  const Case cases[] = {
      {make<Error>("bad field", "temperature"), http::status::bad_request, "invalid_request_error",
       false},
      {make<NotFoundError>("The model `x` does not exist.", "model"), http::status::not_found,
       "not_found_error", false},
      {make<OverloadedError>("too many"), http::status::service_unavailable, "server_overloaded",
       true},
      {make<UnavailableError>("draining"), http::status::service_unavailable, "service_unavailable",
       true},
      {make<EngineFailedError>("rank 1 died"), http::status::service_unavailable, "engine_failed",
       true},
      {make<DeviceError>("CUDA launch: illegal address"), http::status::internal_server_error,
       "device_error", false},
      {make<HttpError>(http::status::method_not_allowed, "GET only"),
       http::status::method_not_allowed, "invalid_request_error", false},
      {make<HttpError>(http::status::unauthorized, "key"), http::status::unauthorized,
       "authentication_error", false},
      {make<std::out_of_range>("vector"), http::status::internal_server_error, "internal_error",
       false},
  };
  for (const Case& c : cases) {
    try {
      std::rethrow_exception(c.error);
    } catch (const std::exception& e) {
      const ErrorReply r = error_reply_of(e);
      EXPECT_EQ(r.status, c.status) << e.what();
      EXPECT_EQ(r.type, c.type) << e.what();
      const Response res = error_response(r);
      EXPECT_EQ(res.result(), c.status);
      EXPECT_EQ(res.count(http::field::retry_after) > 0, c.retry_after) << e.what();
      EXPECT_NE(res.body().find(e.what()), std::string::npos) << res.body();
    }
  }
}

TEST(ErrorReply, ParamIsReportedForInvalidInput) {
  const ErrorReply r = error_reply_of(Error("'temperature' must be a number", "temperature"));
  EXPECT_NE(error_json_body(r).find("\"param\":\"temperature\""), std::string::npos);
  EXPECT_NE(error_json_body(error_reply_of(DeviceError("x"))).find("\"param\":null"),
            std::string::npos);
}

}  // namespace
}  // namespace deltaserve::server
