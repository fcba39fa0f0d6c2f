#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace deltaserve {

Tensor::Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev)
    : data(d), dtype(t), device(dev), ndim(static_cast<int>(dims.size())) {
  DS_CHECK(dims.size() <= kMaxDims, "too many dims");
  int i = 0;
  for (int64_t v : dims) shape[i++] = v;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor Tensor::view(std::initializer_list<int64_t> dims) const {
  Tensor r(data, dtype, dims, device);
  DS_CHECK(r.numel() == numel(), "view " + r.shape_str() + " of " + shape_str());
  return r;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  DS_CHECK(ndim >= 1 && 0 <= begin && begin <= end && end <= shape[0], "rows out of range");
  Tensor r = *this;
  const int64_t row = numel() / (shape[0] ? shape[0] : 1);
  r.data = static_cast<char*>(data) + static_cast<size_t>(begin * row) * dtype_size(dtype);
  r.shape[0] = end - begin;
  return r;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    t_ = o.t_;
    deleter_ = std::move(o.deleter_);
    o.t_ = Tensor{};
    o.deleter_ = nullptr;
  }
  return *this;
}

void Buffer::reset() {
  if (t_.data && deleter_) deleter_(t_.data);
  t_ = Tensor{};
  deleter_ = nullptr;
}

Buffer host_buffer(DType t, std::initializer_list<int64_t> dims) {
  Tensor v(nullptr, t, dims);
  const size_t bytes = (v.nbytes() + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  if (p == nullptr)
    throw Error("out of host memory: allocating " + std::to_string(bytes) + " bytes failed");
  std::memset(p, 0, bytes);
  v.data = p;
  return Buffer(v, [](void* q) { std::free(q); });
}

}  // namespace deltaserve
