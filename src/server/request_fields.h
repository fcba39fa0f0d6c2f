// Typed reads of request-body JSON fields: each throws deltaserve::Error (a 400 naming the field)
// when a present field has the wrong type or range; absent or null fields read as nullopt.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/http_server.h"
#include "server/json_body.h"

namespace deltaserve::server {

[[noreturn]] void bad_request(const std::string& message, const std::string& param = "");

bool present(const json& j, const char* key);
std::optional<double> get_number(const json& j, const char* key);
// An integer that fits int64 (JSON integers above 2^63 - 1 are refused, never wrapped).
std::optional<int64_t> get_int(const json& j, const char* key);
std::optional<bool> get_bool(const json& j, const char* key);
// A list of token ids in [0, vocab).
std::vector<int32_t> get_token_ids(const json& list, int64_t vocab, const char* key);
// The body as a JSON object (bounded parser).
json parse_body(const Request& req);

}  // namespace deltaserve::server
