// Several engine requests answered as one reply (n > 1, a list of prompts): their streams merged
// into one, each delta tagged with its request's index. A request's last delta keeps its
// finish_reason; only the last delta of the last request to end is `finished`.
#pragma once

#include <memory>
#include <vector>

#include "engine/request.h"

namespace deltaserve::server {

std::shared_ptr<engine::RequestStream> merge_streams(
    const std::vector<std::shared_ptr<engine::RequestStream>>& streams);

}  // namespace deltaserve::server
