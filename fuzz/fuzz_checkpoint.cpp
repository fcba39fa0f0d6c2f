// Checkpoint input: the first byte picks the model config parser (config.json text) or the
// safetensors header validation (the rest written to a file and mapped as SafetensorsFile).
// Both must refuse bad input with deltaserve::Error only.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "core/error.h"
#include "model/config.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltaserve;
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    if (data[0] % 2 == 0) {
      (void)model::parse_model_config(rest, "fuzz config.json");
    } else {
      static const std::string path = "/tmp/ds_fuzz_" + std::to_string(::getpid()) + ".safetensors";
      FILE* f = std::fopen(path.c_str(), "wb");
      if (!f) return 0;
      std::fwrite(rest.data(), 1, rest.size(), f);
      std::fclose(f);
      model::SafetensorsFile file(path);
      for (const auto& [name, t] : file.tensors())
        if (t.nbytes && t.data == nullptr) __builtin_trap();
    }
  } catch (const Error&) {
  }
  return 0;
}
