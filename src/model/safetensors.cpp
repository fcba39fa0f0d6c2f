#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace deltaserve::model {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw Error(file + ": " + what);
}

// Parses one header entry into `info` (data pointer relative to the data section).
void parse_entry(const std::string& file, const std::string& name, const json& e, size_t data_size,
                 TensorInfo& info) {
  const std::string where = "tensor '" + name + "': ";
  if (!e.is_object()) fail(file, where + "header entry is not an object");
  if (!e.contains("dtype") || !e["dtype"].is_string()) fail(file, where + "missing dtype");
  const std::string ds = e["dtype"].get<std::string>();
  const auto dt = parse_safetensors_dtype(ds);
  if (!dt)
    fail(file, where + "unsupported dtype '" + ds + "' (supported: F32, BF16, F16, I32, I64)");
  if (!e.contains("shape") || !e["shape"].is_array()) fail(file, where + "missing shape");
  info.name = name;
  info.dtype = *dt;
  info.file = file;
  int64_t numel = 1;
  for (const json& d : e["shape"]) {
    if (!d.is_number_unsigned()) fail(file, where + "shape entries must be non-negative integers");
    const int64_t v = d.get<int64_t>();
    if (v > (int64_t{1} << 40) || (v && numel > (int64_t{1} << 50) / v))
      fail(file, where + "shape too large");
    info.shape.push_back(v);
    numel *= v;
  }
  const json& off = e.contains("data_offsets") ? e["data_offsets"] : json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    fail(file, where + "data_offsets must be two non-negative integers");
  const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
  if (b > en || en > data_size)
    fail(file, where + "data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
                   "] out of range (data section is " + std::to_string(data_size) + " bytes)");
  const uint64_t want = static_cast<uint64_t>(numel) * dtype_size(*dt);
  if (en - b != want)
    fail(file, where + "byte size " + std::to_string(en - b) + " does not match shape " +
                   info.shape_str() + " " + ds + " (" + std::to_string(want) + " bytes)");
  info.data = reinterpret_cast<const std::byte*>(b);  // relocated by the caller
  info.nbytes = want;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const fs::path& path) : path_(path.string()) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path_, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path_, "cannot stat");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail(path_, "truncated file (" + std::to_string(size_) + " bytes, need at least 8)");
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(path_, "mmap failed");
  }
  try {
    const auto* base = static_cast<const std::byte*>(map_);
    uint64_t hlen = 0;
    std::memcpy(&hlen, base, 8);  // little endian, as the format says
    if (hlen > size_ - 8)
      fail(path_, "header length " + std::to_string(hlen) + " runs past end of file (" +
                      std::to_string(size_) + " bytes): truncated or not safetensors");
    const char* hp = reinterpret_cast<const char*>(base + 8);
    json header = json::parse(hp, hp + hlen, nullptr, /*allow_exceptions=*/false);
    if (header.is_discarded() || !header.is_object()) fail(path_, "header is not a JSON object");
    const size_t data_size = size_ - 8 - hlen;
    const std::byte* data = base + 8 + hlen;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it.value().is_object()) fail(path_, "__metadata__ is not an object");
        for (auto m = it.value().begin(); m != it.value().end(); ++m)
          if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
        continue;
      }
      TensorInfo info;
      parse_entry(path_, it.key(), it.value(), data_size, info);
      info.data = data + reinterpret_cast<uintptr_t>(info.data);
      tensors_.emplace(it.key(), std::move(info));
    }
    std::vector<const TensorInfo*> by_offset;
    for (const auto& [n, t] : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const TensorInfo* p = by_offset[i - 1];
      if (p->nbytes && by_offset[i]->nbytes && p->data + p->nbytes > by_offset[i]->data)
        fail(path_, "tensors '" + p->name + "' and '" + by_offset[i]->name + "' overlap");
    }
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

Checkpoint::Checkpoint(const fs::path& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) throw Error(dir.string() + ": not a directory");
  std::vector<fs::path> paths;
  const fs::path index = dir / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index)) {
    std::ifstream in(index);
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object())
      throw Error(index.string() + ": bad JSON or no \"weight_map\" object");
    std::vector<std::string> shard_names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw Error(index.string() + ": weight_map values must be file names");
      const std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f == "..")
        throw Error(index.string() + ": shard name '" + f + "' is not a plain file name");
      weight_map[it.key()] = f;
      if (std::find(shard_names.begin(), shard_names.end(), f) == shard_names.end())
        shard_names.push_back(f);
    }
    for (const auto& f : shard_names) paths.push_back(dir / f);
  } else if (fs::exists(dir / "model.safetensors")) {
    paths.push_back(dir / "model.safetensors");
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") paths.push_back(e.path());
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty()) throw Error(dir.string() + ": no safetensors files found");
  for (const auto& p : paths) {
    files_.push_back(std::make_unique<SafetensorsFile>(p));
    for (const auto& [name, info] : files_.back()->tensors()) {
      if (!index_.emplace(name, &info).second)
        throw Error(p.string() + ": tensor '" + name + "' also appears in " + index_[name]->file);
    }
  }
  for (const auto& [name, file] : weight_map) {
    const auto it = index_.find(name);
    if (it == index_.end())
      throw Error((dir / file).string() + ": tensor '" + name +
                  "' listed in model.safetensors.index.json is missing from the shard");
    if (fs::path(it->second->file).filename() != file)
      throw Error(index.string() + ": tensor '" + name + "' is in " + it->second->file +
                  ", not in " + file);
  }
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw Error(dir_.string() + ": missing tensor '" + name + "'");
  return *t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> r;
  for (const auto& [n, t] : index_) r.push_back(n);
  return r;
}

void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const TensorToWrite* t : sorted) {
    int64_t n = 1;
    for (int64_t d : t->shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(t->dtype);
    header[t->name] = {{"dtype", std::string(dtype_name(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(path.string() + ": cannot open for writing");
  const uint64_t hlen = h.size();
  out.write(reinterpret_cast<const char*>(&hlen), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const TensorToWrite* t : sorted) {
    int64_t n = 1;
    for (int64_t d : t->shape) n *= d;
    out.write(static_cast<const char*>(t->data),
              static_cast<std::streamsize>(static_cast<uint64_t>(n) * dtype_size(t->dtype)));
  }
  if (!out) throw Error(path.string() + ": write failed");
}

}  // namespace deltaserve::model
