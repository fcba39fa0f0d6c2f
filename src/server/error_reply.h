// The one place where errors become HTTP: every exception a route raises is mapped here to a
// status, an OpenAI-style error type and a JSON body.
//   Error (invalid input) -> 400   NotFoundError -> 404   OverloadedError -> 503 + Retry-After
//   UnavailableError (draining) -> 503 + Retry-After       EngineFailedError -> 503
//   DeviceError -> 500             HttpError -> its own status (401, 405)   anything else -> 500
#pragma once

#include <stdexcept>
#include <string>

#include "server/http_server.h"

namespace deltaserve::server {

// A routing-level answer that is not about the request's content (authentication, method).
class HttpError : public std::runtime_error {
 public:
  HttpError(http::status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  http::status status() const { return status_; }

 private:
  http::status status_;
};

struct ErrorReply {
  http::status status = http::status::internal_server_error;
  const char* type = "internal_error";
  std::string message;
  std::string param;  // empty: null
};

ErrorReply error_reply_of(const std::exception& e);
// The JSON error body, in OpenAI's shape.
std::string error_json_body(const ErrorReply& e);
// The full response (Retry-After on 503 and 429).
Response error_response(const ErrorReply& e);

}  // namespace deltaserve::server
