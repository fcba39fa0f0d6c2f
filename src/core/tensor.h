// Tensor: a non-owning, contiguous (row-major) view of typed memory on one device; Buffer owns it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace deltaserve {

enum class Device : uint8_t { kCpu, kCuda };

constexpr int kMaxDims = 4;

// NOTE: views are always contiguous; slicing is along dim 0 only. Strided views are not needed by
// any op yet and would make every kernel handle them.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev = Device::kCpu);

  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? ndim + i : i)); }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }
  std::string shape_str() const;

  // Same memory, new shape with the same number of elements.
  Tensor view(std::initializer_list<int64_t> dims) const;
  // Rows [begin, end) along dim 0.
  Tensor rows(int64_t begin, int64_t end) const;

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  float* f32() const {
    DS_CHECK(dtype == DType::kF32, "tensor is not F32");
    return static_cast<float*>(data);
  }
  int32_t* i32() const {
    DS_CHECK(dtype == DType::kI32, "tensor is not I32");
    return static_cast<int32_t*>(data);
  }
};

// Owns device or host memory through a deleter; `t` views all of it.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Tensor t, std::function<void(void*)> deleter) : t_(t), deleter_(std::move(deleter)) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  const Tensor& tensor() const { return t_; }
  void reset();

 private:
  Tensor t_;
  std::function<void(void*)> deleter_;
};

// A zero-initialised, 64-byte aligned host buffer.
Buffer host_buffer(DType t, std::initializer_list<int64_t> dims);

}  // namespace deltaserve
