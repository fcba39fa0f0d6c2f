#include "server/error_reply.h"

#include "core/error.h"
#include "server/json_body.h"

namespace deltaserve::server {

namespace {

ErrorReply of_kind(const DsError& e) {
  switch (e.kind()) {
    case ErrorKind::kInvalidInput:
      return {http::status::bad_request, "invalid_request_error", e.what(), e.param()};
    case ErrorKind::kNotFound:
      return {http::status::not_found, "not_found_error", e.what(), e.param()};
    case ErrorKind::kOverloaded:
      return {http::status::service_unavailable, "server_overloaded", e.what(), ""};
    case ErrorKind::kUnavailable:
      return {http::status::service_unavailable, "service_unavailable", e.what(), ""};
    case ErrorKind::kEngineFailed:
      return {http::status::service_unavailable, "engine_failed", e.what(), ""};
    case ErrorKind::kDeviceFault:
      return {http::status::internal_server_error, "device_error", e.what(), ""};
  }
  return {http::status::internal_server_error, "internal_error", e.what(), ""};
}

const char* type_of(http::status s) {
  switch (s) {
    case http::status::unauthorized:
      return "authentication_error";
    case http::status::not_found:
      return "not_found_error";
    case http::status::service_unavailable:
    case http::status::too_many_requests:
      return "server_overloaded";
    case http::status::internal_server_error:
      return "internal_error";
    default:
      return "invalid_request_error";
  }
}

}  // namespace

ErrorReply error_reply_of(const std::exception& e) {
  if (const auto* ds = dynamic_cast<const DsError*>(&e)) return of_kind(*ds);
  if (const auto* h = dynamic_cast<const HttpError*>(&e))
    return {h->status(), type_of(h->status()), h->what(), ""};
  return {http::status::internal_server_error, "internal_error",
          std::string("internal error: ") + e.what(), ""};
}

std::string error_json_body(const ErrorReply& e) {
  const json j = {{"error",
                   {{"message", e.message},
                    {"type", e.type},
                    {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                    {"code", static_cast<int>(e.status)}}}};
  return dump_json(j);
}

Response error_response(const ErrorReply& e) {
  Response r = json_response(e.status, error_json_body(e));
  if (e.status == http::status::service_unavailable || e.status == http::status::too_many_requests)
    r.set(http::field::retry_after, "1");
  return r;
}

}  // namespace deltaserve::server
