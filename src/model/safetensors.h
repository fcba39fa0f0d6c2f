// Safetensors checkpoints: a validated, mmapped reader (single file or sharded index) and a writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace deltaserve::model {

// One tensor inside a mapped file; `data` stays valid as long as its file is open.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // path, for error messages

  int64_t numel() const;
  std::string shape_str() const;
};

// A read-only mmap of one .safetensors file whose header has been fully validated: header length
// within the file, JSON well formed, known dtypes, offsets in range, sizes matching shapes, no
// overlaps. Throws deltaserve::Error naming the file (and tensor) otherwise.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: `model.safetensors`, or `model.safetensors.index.json` with shards, or
// (fallback) every `*.safetensors` file in it. Names are unique across files.
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& dir);

  const TensorInfo* find(const std::string& name) const;
  // Throws deltaserve::Error "missing tensor" naming the directory when absent.
  const TensorInfo& get(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
};

// A tensor to write: `data` holds numel * dtype_size bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes a safetensors file (tensors in name order, header padded to 8 bytes). Throws on I/O error.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace deltaserve::model
