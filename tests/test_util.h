// Helpers shared by the tests: test data location, temporary directories, golden access.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace deltaserve::testing {

// test_data/ (DS_TEST_DATA env var overrides the compiled-in path, e.g. on another machine).
inline std::filesystem::path test_data() {
  const char* env = std::getenv("DS_TEST_DATA");
  return env ? std::filesystem::path(env) : std::filesystem::path(DS_TEST_DATA);
}

// The real Qwen3 tokenizer directory (tools/fetch_tokenizer.sh installs it; make test runs that).
inline std::filesystem::path qwen3_tokenizer() {
  const char* env = std::getenv("DS_QWEN3_TOKENIZER");
  return env ? std::filesystem::path(env) : std::filesystem::path(DS_QWEN3_TOKENIZER);
}

// A fresh temporary directory removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("ds_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// The largest |x|, or NaN where any x is NaN (std::max would skip it: a bound checked with
// EXPECT_LE must fail on NaN).
inline float max_abs(const std::vector<float>& a) {
  float m = 0;
  for (float x : a) {
    if (std::isnan(x)) return x;
    m = std::max(m, std::abs(x));
  }
  return m;
}

// The largest |a - b|, or NaN where any difference is NaN.
inline float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) {
    const float d = std::abs(a[i] - b[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace deltaserve::testing
