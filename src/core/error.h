// Errors: DS_CHECK for broken invariants (aborts), deltaserve::Error for bad input at a boundary.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace deltaserve {

// Bad input at a boundary (checkpoint, config, CLI flag, request): the message says what to fix.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void check_failed(const char* cond, const char* file, int line,
                                      const std::string& msg) {
  std::fprintf(stderr, "DS_CHECK failed: %s at %s:%d %s\n", cond, file, line, msg.c_str());
  std::abort();
}

}  // namespace deltaserve

// Aborts with file/line when an invariant is broken (a bug, never bad input).
#define DS_CHECK(cond, ...)                                                                       \
  do {                                                                                            \
    if (!(cond)) ::deltaserve::check_failed(#cond, __FILE__, __LINE__, std::string{__VA_ARGS__}); \
  } while (0)
