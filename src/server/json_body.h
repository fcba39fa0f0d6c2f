// Request-body JSON: a bounded, linear-time parser and a serialiser that never throws.
//
// nlohmann's own parse into ordered_json inserts each key with a linear search (quadratic in the
// keys of one object: 100k keys took 7.8 s), and deep nesting overflows the stack in the recursive
// copies made later (chat-template rendering). parse_json_body builds the same ordered_json through
// the SAX interface in time linear in the body, with bounded depth and value count, keeping the
// key order of the body (the chat template renders tools in the order the client wrote them) and
// the last value of a duplicated key (as nlohmann does).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace deltaserve::server {

using json = nlohmann::ordered_json;

struct JsonLimits {
  size_t max_depth = 128;         // nested arrays / objects
  size_t max_values = 1'000'000;  // every scalar, array, object and key counts once
};

// Parses `body`; on malformed input or a broken limit returns false and sets `error` to a message
// fit for a 400 response (never echoing the body).
bool parse_json_body(std::string_view body, json& out, std::string& error,
                     const JsonLimits& limits = {});

// Serialises without throwing: invalid UTF-8 in strings becomes U+FFFD.
std::string dump_json(const json& j);

}  // namespace deltaserve::server
