#include "app/args.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "core/error.h"

namespace deltaserve::app {

Args::Args(const std::vector<std::string>& argv, const std::string& command,
           const std::set<std::string>& known, const std::set<std::string>& switches,
           const std::set<std::string>& lists)
    : command_(command) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0)
      throw Error("deltaserve " + command + ": unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (switches.count(name)) {
      values_[name] = inline_value ? value : "1";
      continue;
    }
    if (lists.count(name)) {
      std::vector<std::string>& values = lists_[name];
      values.clear();
      if (inline_value) values.push_back(value);
      while (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) values.push_back(argv[++i]);
      if (values.empty()) throw Error("deltaserve " + command + ": --" + name + " needs a value");
      values_[name] = values.front();
      continue;
    }
    if (!known.count(name)) throw Error("deltaserve " + command + ": unknown flag --" + name);
    if (!inline_value) {
      if (i + 1 >= argv.size())
        throw Error("deltaserve " + command + ": --" + name + " needs a value");
      value = argv[++i];
    }
    values_[name] = value;
  }
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::vector<std::string> Args::get_list(const std::string& name) const {
  const auto it = lists_.find(name);
  return it == lists_.end() ? std::vector<std::string>() : it->second;
}

long long Args::get_int(const std::string& name, long long fallback, long long lo,
                        long long hi) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(it->second, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != it->second.size() || v < lo || v > hi)
    throw Error("deltaserve " + command_ + ": --" + name + " must be an integer in [" +
                std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + it->second + "'");
  return v;
}

std::optional<long long> human_readable_count(const std::string& s) {
  size_t pos = 0;
  double number = 0;
  try {
    number = std::stod(s, &pos);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (pos == 0 || !std::isdigit(static_cast<unsigned char>(s[0])) || !std::isfinite(number))
    return std::nullopt;
  const std::string digits = s.substr(0, pos), suffix = s.substr(pos);
  if (digits.find_first_not_of("0123456789.") != std::string::npos) return std::nullopt;
  const bool whole = digits.find('.') == std::string::npos;
  double scale = 0;
  if (suffix.empty() && whole) scale = 1;
  if (suffix == "k" || suffix == "m" || suffix == "g")
    scale = suffix == "k" ? 1e3 : suffix == "m" ? 1e6 : 1e9;
  if ((suffix == "K" || suffix == "M" || suffix == "G") && whole)
    scale = suffix == "K" ? 1024.0 : suffix == "M" ? 1048576.0 : 1073741824.0;
  if (scale == 0 || number * scale > 9e18) return std::nullopt;
  return static_cast<long long>(number * scale);
}

long long Args::get_count(const std::string& name, long long fallback, long long lo,
                          long long hi) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::optional<long long> v = human_readable_count(it->second);
  if (!v || *v < lo || *v > hi)
    throw Error("deltaserve " + command_ + ": --" + name + " must be an integer in [" +
                std::to_string(lo) + ", " + std::to_string(hi) + "] (or like 32k, 32K), got '" +
                it->second + "'");
  return *v;
}

double Args::get_double(const std::string& name, double fallback, double lo, double hi,
                        bool lo_open) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(it->second, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  const bool in_range = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
  if (pos == 0 || pos != it->second.size() || !in_range)
    throw Error("deltaserve " + command_ + ": --" + name + " must be a number in " +
                (lo_open ? "(" : "[") + std::to_string(lo) + ", " + std::to_string(hi) +
                "], got '" + it->second + "'");
  return v;
}

void check_device(const Args& a) {
  const std::string d = a.get("device", "cpu");
  if (d != "cpu" && d != "cuda") throw Error("--device must be cpu or cuda, got '" + d + "'");
}

std::vector<int32_t> parse_ids(const std::string& s, long long vocab) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    const std::string tok = s.substr(start, end - start);
    size_t pos = 0;
    long long v = -1;
    try {
      v = std::stoll(tok, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    if (pos == 0 || pos != tok.size() || v < 0 || v >= vocab)
      throw Error("--ids: '" + tok + "' is not a token id in [0, " + std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(v));
    start = end + 1;
  }
  return ids;
}

}  // namespace deltaserve::app
