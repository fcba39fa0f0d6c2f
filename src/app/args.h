// Command-line flags: "--name value" or "--name=value", checked against the flags a command knows.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace deltaserve::app {

class Args {
 public:
  // Throws deltaserve::Error for an unknown flag, a missing value or a stray argument. A flag of
  // `lists` takes one or more values, up to the next flag (vLLM's --served-model-name A B).
  Args(const std::vector<std::string>& argv, const std::string& command,
       const std::set<std::string>& known, const std::set<std::string>& switches = {},
       const std::set<std::string>& lists = {});

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  // A list flag's first value here.
  std::string get(const std::string& name, const std::string& fallback) const;
  // A list flag's values (empty when absent).
  std::vector<std::string> get_list(const std::string& name) const;
  // Integer flag in [lo, hi]; throws deltaserve::Error otherwise.
  long long get_int(const std::string& name, long long fallback, long long lo, long long hi) const;
  // get_int that also takes vLLM's human-readable counts (human_readable_count), for token counts
  // such as --max-model-len 32k.
  long long get_count(const std::string& name, long long fallback, long long lo,
                      long long hi) const;
  // Finite number flag in the interval (lo, hi] (lo_open) or [lo, hi]; throws deltaserve::Error
  // otherwise.
  double get_double(const std::string& name, double fallback, double lo, double hi,
                    bool lo_open = false) const;

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> lists_;
};

// vLLM's human-readable integers: a plain integer, or a number with a suffix — k, m, g decimal
// (25.6k = 25,600), K, M, G binary and whole (32K = 32,768); nullopt for anything else.
std::optional<long long> human_readable_count(const std::string& s);

// Accepts --device cpu|cuda (whether cuda is built in is checked when the model loads).
void check_device(const Args& a);

// Parses "1,2,3" into ids in [0, vocab); throws deltaserve::Error naming the bad entry.
std::vector<int32_t> parse_ids(const std::string& s, long long vocab);

}  // namespace deltaserve::app
