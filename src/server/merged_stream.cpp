#include "server/merged_stream.h"

#include <atomic>
#include <mutex>

namespace deltaserve::server {

std::shared_ptr<engine::RequestStream> merge_streams(
    const std::vector<std::shared_ptr<engine::RequestStream>>& streams) {
  auto merged = std::make_shared<engine::RequestStream>(streams.front()->id());
  auto remaining = std::make_shared<std::atomic<int>>(static_cast<int>(streams.size()));
  for (size_t i = 0; i < streams.size(); ++i) {
    auto child = streams[i];
    auto order = std::make_shared<std::mutex>();  // one forwarder at a time keeps the order
    std::weak_ptr<engine::RequestStream> weak_child = child;
    child->set_listener([merged, remaining, order, weak_child, i] {
      auto c = weak_child.lock();
      if (!c) return;
      std::lock_guard<std::mutex> lock(*order);
      engine::OutputDelta d;
      while (c->try_next(d)) {
        d.index = static_cast<int32_t>(i);
        if (d.finished) d.finished = --*remaining == 0;
        merged->push(std::move(d));
      }
    });
  }
  return merged;
}

}  // namespace deltaserve::server
