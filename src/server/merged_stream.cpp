#include "server/merged_stream.h"

#include <atomic>
#include <mutex>

namespace deltaserve::server {

std::shared_ptr<engine::RequestStream> merge_streams(
    const std::vector<std::shared_ptr<engine::RequestStream>>& streams) {
  auto merged = std::make_shared<engine::RequestStream>(streams.front()->id());
  auto remaining = std::make_shared<std::atomic<int>>(static_cast<int>(streams.size()));
  // One forwarder at a time over all children: a child's deltas keep their order, and the delta
  // that ends the merged stream is pushed only after every other child's last delta (the engine
  // thread and set_listener's first call on this thread may forward at once).
  auto order = std::make_shared<std::mutex>();
  for (size_t i = 0; i < streams.size(); ++i) {
    auto child = streams[i];
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
