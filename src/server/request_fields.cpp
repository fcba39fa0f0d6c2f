#include "server/request_fields.h"

#include <limits>

#include "core/error.h"

namespace deltaserve::server {

namespace {

bool is_int64(const json& x) {
  return x.is_number_integer() &&
         !(x.is_number_unsigned() &&
           x.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

}  // namespace

void bad_request(const std::string& message, const std::string& param) {
  throw Error(message, param);
}

bool present(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

std::optional<double> get_number(const json& j, const char* key) {
  if (!present(j, key)) return std::nullopt;
  if (!j[key].is_number()) bad_request(std::string("'") + key + "' must be a number", key);
  return j[key].get<double>();
}

std::optional<int64_t> get_int(const json& j, const char* key) {
  if (!present(j, key)) return std::nullopt;
  if (!is_int64(j[key])) bad_request(std::string("'") + key + "' must be an integer (64-bit)", key);
  return j[key].get<int64_t>();
}

std::optional<bool> get_bool(const json& j, const char* key) {
  if (!present(j, key)) return std::nullopt;
  if (!j[key].is_boolean()) bad_request(std::string("'") + key + "' must be a boolean", key);
  return j[key].get<bool>();
}

std::vector<int32_t> get_token_ids(const json& list, int64_t vocab, const char* key) {
  const std::string what = std::string("'") + key + "' must be a list of token ids in [0, " +
                           std::to_string(vocab) + ")";
  if (!list.is_array()) bad_request(what, key);
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (const json& x : list) {
    if (!is_int64(x) || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab) bad_request(what, key);
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return ids;
}

json parse_body(const Request& req) {
  json j;
  std::string error;
  if (!parse_json_body(req.body(), j, error)) bad_request(error);
  if (!j.is_object()) bad_request("The request body must be a JSON object");
  return j;
}

}  // namespace deltaserve::server
