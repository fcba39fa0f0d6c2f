// Prometheus text exposition of the engine metrics (GET /metrics).
#pragma once

#include <string>

#include "engine/metrics.h"

namespace deltaserve::server {

// A label value escaped for the text format (backslash, double quote, line feed).
std::string prometheus_label_value(const std::string& v);

std::string prometheus_text(const engine::MetricsSnapshot& m, const std::string& model_name,
                            int64_t http_requests);

}  // namespace deltaserve::server
