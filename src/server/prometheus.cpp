#include "server/prometheus.h"

#include <cstdio>

namespace deltaserve::server {

namespace {

// %.17g: a sample value in the exposition format (finite numbers; counters and gauges here).
std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels,
            const std::string& value) {
  out += name + "{" + labels + "} " + value + "\n";
}

void metric(std::string& out, const char* name, const char* type, const char* help,
            const std::string& labels, double value) {
  header(out, name, type, help);
  sample(out, name, labels, number(value));
}

void histogram(std::string& out, const char* name, const char* help, const std::string& labels,
               const engine::Histogram& h) {
  header(out, name, "histogram", help);
  const std::string base = name;
  uint64_t cum = 0;
  for (size_t i = 0; i < engine::Histogram::kBounds.size(); ++i) {
    cum += h.counts[i];
    char le[64];
    std::snprintf(le, sizeof le, "%g", engine::Histogram::kBounds[i]);
    sample(out, base + "_bucket", labels + ",le=\"" + le + "\"", std::to_string(cum));
  }
  sample(out, base + "_bucket", labels + ",le=\"+Inf\"", std::to_string(h.count));
  sample(out, base + "_sum", labels, number(h.sum));
  sample(out, base + "_count", labels, std::to_string(h.count));
}

}  // namespace

std::string prometheus_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size() + 2);
  for (const char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string prometheus_text(const engine::MetricsSnapshot& m, const std::string& model_name,
                            int64_t http_requests) {
  const std::string l = "model_name=\"" + prometheus_label_value(model_name) + "\"";
  std::string out;
  metric(out, "deltaserve_num_requests_running", "gauge", "Requests in the running batch.", l,
         static_cast<double>(m.running));
  metric(out, "deltaserve_num_requests_waiting", "gauge", "Requests waiting to be scheduled.", l,
         static_cast<double>(m.waiting));
  metric(out, "deltaserve_kv_cache_usage_perc", "gauge", "Fraction of KV cache pages in use.", l,
         m.kv_pages_total
             ? static_cast<double>(m.kv_pages_used) / static_cast<double>(m.kv_pages_total)
             : 0.0);
  metric(out, "deltaserve_kv_cache_pages_used", "gauge", "KV cache pages in use.", l,
         static_cast<double>(m.kv_pages_used));
  metric(out, "deltaserve_kv_cache_pages_total", "gauge", "KV cache pages in all.", l,
         static_cast<double>(m.kv_pages_total));
  metric(out, "deltaserve_prompt_tokens_total", "counter", "Prompt tokens received.", l,
         static_cast<double>(m.prompt_tokens));
  metric(out, "deltaserve_generation_tokens_total", "counter", "Tokens generated.", l,
         static_cast<double>(m.generation_tokens));
  metric(out, "deltaserve_request_success_total", "counter", "Requests finished (stop or length).",
         l, static_cast<double>(m.requests_finished));
  metric(out, "deltaserve_request_aborted_total", "counter",
         "Requests aborted (client gone, cancelled).", l, static_cast<double>(m.requests_aborted));
  metric(out, "deltaserve_num_preemptions_total", "counter",
         "Requests preempted for lack of KV pages.", l, static_cast<double>(m.preemptions));
  metric(out, "deltaserve_engine_steps_total", "counter", "Engine steps (batched forwards).", l,
         static_cast<double>(m.steps));
  metric(out, "deltaserve_http_requests_total", "counter", "HTTP requests received.", l,
         static_cast<double>(http_requests));
  histogram(out, "deltaserve_time_to_first_token_seconds", "Time to first token.", l, m.ttft);
  histogram(out, "deltaserve_inter_token_latency_seconds", "Time between output tokens.", l, m.itl);
  histogram(out, "deltaserve_e2e_request_latency_seconds", "Request latency, arrival to finish.", l,
            m.e2e);
  return out;
}

}  // namespace deltaserve::server
