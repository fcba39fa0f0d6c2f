// Errors: DS_CHECK for broken invariants (aborts); typed exceptions for everything else. The kind
// says whose fault it is and what a client should do; the server maps kinds to HTTP statuses in
// one place (server/error_reply.cpp).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace deltaserve {

enum class ErrorKind {
  kInvalidInput,  // bad input at a boundary (request, flag, checkpoint, config): fix the input
  kNotFound,      // a named thing does not exist (e.g. an unknown model name)
  kOverloaded,    // too much work admitted right now: retry later
  kUnavailable,   // the server is draining or shutting down
  kDeviceFault,   // CUDA, cuBLAS or NCCL failed, or a tensor-parallel rank did
  kEngineFailed,  // the engine stopped after a fault (fail-stop): nothing more is served
};

// Base of every deltaserve exception.
class DsError : public std::runtime_error {
 public:
  DsError(ErrorKind kind, const std::string& message, std::string param = "")
      : std::runtime_error(message), kind_(kind), param_(std::move(param)) {}
  ErrorKind kind() const { return kind_; }
  // The request field at fault (OpenAI's `param`), when there is one.
  const std::string& param() const { return param_; }

 private:
  ErrorKind kind_;
  std::string param_;
};

// Bad input at a boundary (checkpoint, config, CLI flag, request): the message says what to fix.
class Error : public DsError {
 public:
  explicit Error(const std::string& message, std::string param = "")
      : DsError(ErrorKind::kInvalidInput, message, std::move(param)) {}
};

class NotFoundError : public DsError {
 public:
  explicit NotFoundError(const std::string& message, std::string param = "")
      : DsError(ErrorKind::kNotFound, message, std::move(param)) {}
};

class OverloadedError : public DsError {
 public:
  explicit OverloadedError(const std::string& message) : DsError(ErrorKind::kOverloaded, message) {}
};

class UnavailableError : public DsError {
 public:
  explicit UnavailableError(const std::string& message)
      : DsError(ErrorKind::kUnavailable, message) {}
};

// A device or collective fault: not the client's input.
class DeviceError : public DsError {
 public:
  explicit DeviceError(const std::string& message) : DsError(ErrorKind::kDeviceFault, message) {}
};

class EngineFailedError : public DsError {
 public:
  explicit EngineFailedError(const std::string& message)
      : DsError(ErrorKind::kEngineFailed, message) {}
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
