#include "server/generation_defaults.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace deltaserve::server {
namespace fs = std::filesystem;

namespace {

// A finite number field in [lo, hi] (or (lo, hi] when lo_open); nullopt where absent or null.
std::optional<double> number_field(const json& c, const char* key, double lo, double hi,
                                   bool lo_open, const std::string& where) {
  if (!c.contains(key) || c[key].is_null()) return std::nullopt;
  const json& v = c[key];
  const double x = v.is_number() ? v.get<double>() : NAN;
  if (!std::isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi)
    throw Error(where + ": \"" + key + "\" must be a number in " + (lo_open ? "(" : "[") +
                std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return x;
}

std::optional<int64_t> int_field(const json& c, const char* key, int64_t lo, int64_t hi,
                                 const std::string& where) {
  if (!c.contains(key) || c[key].is_null()) return std::nullopt;
  const json& v = c[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    throw Error(where + ": \"" + key + "\" must be an integer in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "], got " + v.dump());
  return v.get<int64_t>();
}

// The sampling fields of one JSON object over `d`; with `skip_hf_defaults`, values equal to
// transformers' GenerationConfig defaults (temperature 1, top_k 50, top_p 1, repetition_penalty
// 1) are not taken, as vLLM takes only a config's difference from them.
void read_fields(const json& c, bool skip_hf_defaults, const std::string& where,
                 GenerationDefaults& d) {
  if (!c.is_object()) throw Error(where + ": must be a JSON object");
  const auto take = [&](auto& field, auto value, double hf_default) {
    if (value && !(skip_hf_defaults && static_cast<double>(*value) == hf_default))
      field = static_cast<typename std::remove_reference_t<decltype(field)>::value_type>(*value);
  };
  take(d.temperature, number_field(c, "temperature", 0, 100, false, where), 1.0);
  take(d.top_p, number_field(c, "top_p", 0, 1, true, where), 1.0);
  take(d.min_p, number_field(c, "min_p", 0, 1, false, where), NAN);
  take(d.repetition_penalty, number_field(c, "repetition_penalty", 0, 100, true, where), 1.0);
  take(d.top_k, int_field(c, "top_k", -1, 1 << 24, where), 50.0);
  take(d.max_tokens, int_field(c, "max_new_tokens", 1, int64_t{1} << 40, where), NAN);
}

json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) throw Error(path.string() + ": bad JSON");
  return j;
}

template <class T>
void describe_field(std::string& out, const char* name, const std::optional<T>& v) {
  if (!v) return;
  std::ostringstream s;
  s << (out.empty() ? "" : ", ") << name << ' ' << *v;
  out += s.str();
}

}  // namespace

bool GenerationDefaults::empty() const {
  return !temperature && !top_p && !min_p && !repetition_penalty && !top_k && !max_tokens;
}

std::string GenerationDefaults::describe() const {
  std::string s;
  describe_field(s, "temperature", temperature);
  describe_field(s, "top_k", top_k);
  describe_field(s, "top_p", top_p);
  describe_field(s, "min_p", min_p);
  describe_field(s, "repetition_penalty", repetition_penalty);
  describe_field(s, "max_tokens", max_tokens);
  return s;
}

void GenerationDefaults::apply(engine::SamplingParams& p) const {
  if (temperature) p.temperature = *temperature;
  if (top_p) p.top_p = *top_p;
  if (min_p) p.min_p = *min_p;
  if (repetition_penalty) p.repetition_penalty = *repetition_penalty;
  if (top_k) p.top_k = *top_k;
}

GenerationDefaults generation_defaults_of(const json& config, const json& overrides,
                                          const std::string& where) {
  GenerationDefaults d;
  if (!config.is_null()) read_fields(config, true, where, d);
  if (!overrides.is_null()) read_fields(overrides, false, "--override-generation-config", d);
  return d;
}

GenerationDefaults load_generation_defaults(const std::string& mode, const fs::path& model_dir,
                                            const std::string& overrides) {
  json over;
  if (!overrides.empty()) {
    over = json::parse(overrides, nullptr, false);
    if (over.is_discarded() || !over.is_object())
      throw Error("--override-generation-config must be a JSON object, got '" + overrides + "'");
  }
  fs::path file;
  if (mode != "auto" && mode != "vllm") {
    file = fs::path(mode) / "generation_config.json";
    std::error_code ec;
    if (!fs::is_regular_file(file, ec))
      throw Error("--generation-config " + mode + ": no generation_config.json there (auto: the " +
                  "model's; vllm: OpenAI's defaults)");
  } else if (mode == "auto" && !model_dir.empty()) {
    std::error_code ec;
    if (fs::is_regular_file(model_dir / "generation_config.json", ec))
      file = model_dir / "generation_config.json";
  }
  return generation_defaults_of(file.empty() ? json() : read_json_file(file), over, file.string());
}

}  // namespace deltaserve::server
