#include "server/drain_batcher.h"

#include <boost/asio/post.hpp>

namespace deltaserve::server {

void DrainBatcher::add(boost::asio::any_io_executor session, std::function<void()> drain) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = queued_.empty();
    queued_.emplace_back(std::move(session), std::move(drain));
  }
  if (first) boost::asio::post(io_, [this] { flush(); });
}

void DrainBatcher::flush() {
  std::vector<std::pair<boost::asio::any_io_executor, std::function<void()>>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(queued_);
  }
  for (auto& [session, drain] : batch) boost::asio::post(session, std::move(drain));
}

}  // namespace deltaserve::server
