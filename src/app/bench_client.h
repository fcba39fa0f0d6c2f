// The load clients' HTTP side: one streamed /v1/completions request, timed from its SSE events.
#pragma once

#include <string>

#include "app/bench_stats.h"

namespace deltaserve::app {

// POSTs `body` (a streaming completions request) over a fresh connection and reads its events:
// TTFT, inter-token gaps, the usage (completion and cached tokens) and, when the request asked
// for return_token_ids, the output ids.
Outcome stream_completion(const std::string& host, const std::string& port, const std::string& body,
                          const std::string& key);

}  // namespace deltaserve::app
