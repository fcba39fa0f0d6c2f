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
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

namespace {

// A sample exported under our name and, where vLLM has one, under vLLM's (its dashboards read
// those); an empty vLLM name means ours only.
struct Sample {
  const char* ours;
  const char* vllm;
  const char* type;
  const char* help;
  double value;
};

struct HistogramSample {
  const char* ours;
  const char* vllm;
  const char* help;
  const engine::Histogram* h;
};

}  // namespace

std::string prometheus_text(const engine::MetricsSnapshot& m, const std::string& model_name,
                            int64_t http_requests) {
  const std::string l = "model_name=\"" + prometheus_label_value(model_name) + "\"";
  const double kv_usage = m.kv_pages_total ? static_cast<double>(m.kv_pages_used) /
                                                 static_cast<double>(m.kv_pages_total)
                                           : 0.0;
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  const Sample samples[] = {
      {"deltaserve_num_requests_running", "vllm:num_requests_running", "gauge",
       "Requests in the running batch.", d(m.running)},
      {"deltaserve_num_requests_waiting", "vllm:num_requests_waiting", "gauge",
       "Requests waiting to be scheduled.", d(m.waiting)},
      {"deltaserve_kv_cache_usage_perc", "vllm:kv_cache_usage_perc", "gauge",
       "Fraction of KV cache pages held by requests (cached pages nobody holds are free).",
       kv_usage},
      {"", "vllm:gpu_cache_usage_perc", "gauge",
       "Fraction of KV cache pages in use (vLLM v0's name).", kv_usage},
      {"deltaserve_kv_cache_pages_used", "", "gauge", "KV cache pages in use.", d(m.kv_pages_used)},
      {"deltaserve_kv_cache_pages_total", "", "gauge", "KV cache pages in all.",
       d(m.kv_pages_total)},
      {"deltaserve_prompt_tokens_total", "vllm:prompt_tokens_total", "counter",
       "Prompt tokens received.", d(m.prompt_tokens)},
      {"deltaserve_generation_tokens_total", "vllm:generation_tokens_total", "counter",
       "Tokens generated.", d(m.generation_tokens)},
      {"deltaserve_request_success_total", "vllm:request_success_total", "counter",
       "Requests finished (stop or length).", d(m.requests_finished)},
      {"deltaserve_request_aborted_total", "", "counter",
       "Requests aborted (client gone, cancelled).", d(m.requests_aborted)},
      {"deltaserve_num_preemptions_total", "vllm:num_preemptions_total", "counter",
       "Requests preempted for lack of KV pages.", d(m.preemptions)},
      {"deltaserve_prefix_cache_queries_total", "vllm:prefix_cache_queries_total", "counter",
       "Prompt tokens looked up in the prefix cache.", d(m.prefix_cache_queries)},
      {"deltaserve_prefix_cache_hits_total", "vllm:prefix_cache_hits_total", "counter",
       "Prompt tokens resumed from the prefix cache.", d(m.prefix_cache_hits)},
      {"deltaserve_prefix_cache_blocks", "", "gauge", "KV pages indexed by the prefix cache.",
       d(m.prefix_cache_blocks)},
      {"deltaserve_engine_steps_total", "", "counter", "Engine steps (batched forwards).",
       d(m.steps)},
      {"deltaserve_engine_forward_seconds_total", "", "counter",
       "Engine-thread seconds in the steps' forwards (staging, device work, tokens back).",
       m.forward_seconds},
      {"deltaserve_engine_host_seconds_total", "", "counter",
       "Engine-thread seconds around the steps' forwards (admission, scheduling, outputs).",
       m.host_seconds},
      {"deltaserve_http_requests_total", "", "counter", "HTTP requests received.",
       d(http_requests)},
  };
  const HistogramSample histograms[] = {
      {"deltaserve_time_to_first_token_seconds", "vllm:time_to_first_token_seconds",
       "Time to first token.", &m.ttft},
      {"deltaserve_inter_token_latency_seconds", "vllm:inter_token_latency_seconds",
       "Time between output tokens.", &m.itl},
      {"deltaserve_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds",
       "Request latency, arrival to finish.", &m.e2e},
  };
  std::string out;
  for (const Sample& s : samples)
    for (const char* name : {s.ours, s.vllm})
      if (*name) metric(out, name, s.type, s.help, l, s.value);
  for (const HistogramSample& h : histograms)
    for (const char* name : {h.ours, h.vllm})
      if (*name) histogram(out, name, h.help, l, *h.h);
  return out;
}

}  // namespace deltaserve::server
