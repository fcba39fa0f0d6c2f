// The reliability suite (CTest label `reliability`): a real server under a disconnect storm,
// overload, file-descriptor exhaustion and a soak; each ends by checking the server still answers
// and holds nothing for requests that are gone. Figures go to stdout for
// bench/results/reliability.md.
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <future>
#include <vector>

#include "server_fixture.h"

namespace deltaserve::testing {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

bool healthy(uint16_t port) {
  return status_of(raw_exchange(port, get_request("/health"), 5s)) == 200;
}

bool eventually(const std::function<bool()>& ok, std::chrono::milliseconds limit) {
  const auto end = clock_type::now() + limit;
  while (clock_type::now() < end) {
    if (ok()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return ok();
}

int64_t rss_kib() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

const std::string kLongStream =
    R"({"prompt":"Tell me a long story","max_tokens":400,"ignore_eos":true,"stream":true})";

// Clients that start streams and go away mid-stream, in waves: everything the engine and the
// server held for them comes back.
TEST(Reliability, DisconnectStormReleasesEverything) {
  TestServer s({}, {}, 64);
  const int kWaves = 5, kPerWave = 64;
  int mid_stream = 0;
  const auto t0 = clock_type::now();
  for (int w = 0; w < kWaves; ++w) {
    std::vector<int> fds;
    for (int i = 0; i < kPerWave; ++i) {
      const int fd = connect_to(s.port());
      ASSERT_GE(fd, 0);
      send_all(fd, post_request("/v1/completions", kLongStream));
      fds.push_back(fd);
    }
    for (int fd : fds) {  // wait for the first event, then drop the connection
      std::string got;
      char buf[4096];
      const auto end = clock_type::now() + 60s;
      while (got.find("data: ") == std::string::npos && clock_type::now() < end) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 1000) <= 0) continue;
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
      }
      mid_stream += got.find("data: ") != std::string::npos;
      ::close(fd);
    }
  }
  EXPECT_EQ(mid_stream, kWaves * kPerWave);
  const bool released = eventually(
      [&] {
        const auto m = s.engine().metrics();
        return m.running == 0 && m.waiting == 0 && m.kv_pages_used == 0 &&
               s.http().open_replies() == 0;
      },
      30s);
  const auto m = s.engine().metrics();
  std::printf(
      "[figure] disconnect storm: %d streams dropped mid-stream in %.1f s; after: running "
      "%lld waiting %lld kv_pages_used %lld open_replies %lld aborted %lld\n",
      mid_stream, std::chrono::duration<double>(clock_type::now() - t0).count(),
      static_cast<long long>(m.running), static_cast<long long>(m.waiting),
      static_cast<long long>(m.kv_pages_used), static_cast<long long>(s.http().open_replies()),
      static_cast<long long>(m.requests_aborted));
  EXPECT_TRUE(released);
  EXPECT_TRUE(healthy(s.port()));
}

// Far more requests than the server admits: every one is answered 200 or 503 within a bound, and
// the server serves normally afterwards.
TEST(Reliability, OverloadAnswersEveryRequestAndRecovers) {
  server::ApiConfig acfg;
  acfg.max_pending = 8;
  TestServer s({}, acfg, 8);
  const int kClients = 200;
  std::vector<std::future<std::pair<int, double>>> out;
  const std::string body = R"({"prompt":"Hello","max_tokens":8,"ignore_eos":true})";
  for (int i = 0; i < kClients; ++i)
    out.push_back(std::async(std::launch::async, [&] {
      const auto t = clock_type::now();
      const int st = status_of(raw_exchange(s.port(), post_request("/v1/completions", body), 60s));
      return std::make_pair(st, std::chrono::duration<double>(clock_type::now() - t).count());
    }));
  int ok = 0, busy = 0, other = 0;
  double worst = 0;
  for (auto& f : out) {
    const auto [st, secs] = f.get();
    (st == 200 ? ok : st == 503 || st == 429 ? busy : other)++;
    worst = std::max(worst, secs);
  }
  std::printf(
      "[figure] overload: %d concurrent requests, max_pending 8: %d x 200, %d x 503, %d "
      "other; slowest answer %.2f s\n",
      kClients, ok, busy, other, worst);
  EXPECT_EQ(other, 0);
  EXPECT_GT(ok, 0);
  EXPECT_GT(busy, 0);
  EXPECT_LT(worst, 60.0);
  EXPECT_EQ(status_of(raw_exchange(s.port(), post_request("/v1/completions", body))), 200);
}

// The process runs out of file descriptors while clients keep connecting: accepting pauses and
// re-arms, and once the clients go the server answers again.
TEST(Reliability, RecoversFromFileDescriptorExhaustion) {
  server::HttpServerConfig cfg;
  cfg.max_connections = 1 << 20;  // no connection cap: the fd limit itself is what runs out
  TestServer s(cfg);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> fds;
  for (int i = 0; i < 400; ++i) {
    const int fd = connect_to(s.port());
    if (fd < 0) break;
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(300ms);  // the server hits EMFILE on accept meanwhile
  const size_t held = fds.size();
  for (int fd : fds) ::close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  const auto t0 = clock_type::now();
  const bool back = eventually([&] { return healthy(s.port()); }, 10s);
  std::printf(
      "[figure] fd exhaustion: RLIMIT_NOFILE 256, %zu client connections held; /health "
      "answered again %.2f s after they closed\n",
      held, std::chrono::duration<double>(clock_type::now() - t0).count());
  EXPECT_GT(held, 100u);
  EXPECT_TRUE(back);
}

// Thousands of requests (completions, chat, streams, tokenize, bad input) on keep-alive and fresh
// connections: resident memory stays flat after warm-up.
TEST(Reliability, SoakKeepsResidentMemoryFlat) {
  TestServer s;
  const std::vector<std::string> requests = {
      post_request("/v1/completions", R"({"prompt":"Hi","max_tokens":2})"),
      post_request("/v1/chat/completions",
                   R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":2})"),
      post_request("/v1/completions", R"({"prompt":"Hi","max_tokens":2,"stream":true})"),
      post_request("/tokenize", R"({"prompt":"Hello world"})"),
      post_request("/v1/completions", R"({"prompt":)"),
      get_request("/metrics"),
  };
  std::atomic<int> failures{0};
  auto run = [&](int n) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < n / 4; ++i) {
          const std::string& r = requests[static_cast<size_t>(i + t) % requests.size()];
          const int st = status_of(raw_exchange(s.port(), r, 30s));
          if (st != 200 && st != 400) ++failures;
        }
      });
    for (auto& th : threads) th.join();
  };
  run(1000);
  const int64_t warm = rss_kib();
  run(2000);
  const int64_t after = rss_kib();
  std::printf(
      "[figure] soak: 3000 requests over 4 clients; RSS %lld KiB after 1000, %lld KiB after "
      "3000 (%+lld KiB)\n",
      static_cast<long long>(warm), static_cast<long long>(after),
      static_cast<long long>(after - warm));
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LT(after - warm, 16 * 1024) << "resident memory grew by more than 16 MiB";
  EXPECT_TRUE(healthy(s.port()));
}

}  // namespace
}  // namespace deltaserve::testing
