#include "app/bench_client.h"

#include <utility>
// clang-format off
#include <boost/asio.hpp>
#include <boost/beast/http.hpp>
// clang-format on
#include <chrono>
#include <nlohmann/json.hpp>

namespace deltaserve::app {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using clock = std::chrono::steady_clock;

// One streamed completion over a fresh connection (the server closes SSE replies).
Outcome stream_completion(const std::string& host, const std::string& port, const std::string& body,
                          const std::string& key) {
  Outcome o;
  const auto start = clock::now();
  try {
    asio::io_context io;
    tcp::resolver res(io);
    tcp::socket sock(io);
    asio::connect(sock, res.resolve(host, port));
    std::string req =
        "POST /v1/completions HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\n";
    if (!key.empty()) req += "Authorization: Bearer " + key + "\r\n";
    req +=
        "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    asio::write(sock, asio::buffer(req));
    std::string buf;
    char chunk[8192];
    bool header_done = false, first = true;
    auto last = start;
    boost::system::error_code ec;
    for (;;) {
      const size_t n = sock.read_some(asio::buffer(chunk), ec);
      if (n == 0 && ec) break;
      const auto now = clock::now();
      buf.append(chunk, n);
      if (!header_done) {
        const size_t h = buf.find("\r\n\r\n");
        if (h == std::string::npos) continue;
        if (buf.compare(0, 12, "HTTP/1.1 200") != 0) {
          o.error = buf.substr(0, buf.find("\r\n"));
          return o;
        }
        header_done = true;
        buf.erase(0, h + 4);
      }
      for (size_t e; (e = buf.find("\n\n")) != std::string::npos;) {
        const std::string ev = buf.substr(0, e);
        buf.erase(0, e + 2);
        if (ev.rfind("data: ", 0) != 0) continue;
        if (ev == "data: [DONE]") {
          o.ok = true;
          continue;
        }
        const auto j = nlohmann::json::parse(ev.substr(6), nullptr, false);
        if (j.is_discarded()) continue;
        if (j.contains("usage") && j["usage"].is_object()) {
          o.output_tokens = j["usage"].value("completion_tokens", 0);
          const auto& details = j["usage"]["prompt_tokens_details"];
          if (details.is_object()) o.cached_tokens = details.value("cached_tokens", 0);
        }
        if (!j.contains("choices") || j["choices"].empty()) continue;
        for (const auto& c : j["choices"])
          if (c.contains("token_ids") && c["token_ids"].is_array())
            for (const auto& t : c["token_ids"]) o.token_ids.push_back(t.get<int32_t>());
        if (first) {
          o.ttft = std::chrono::duration<double>(now - start).count();
          first = false;
        } else {
          o.itl.push_back(std::chrono::duration<double>(now - last).count());
        }
        last = now;
      }
    }
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  o.e2e = std::chrono::duration<double>(clock::now() - start).count();
  return o;
}

}  // namespace deltaserve::app
