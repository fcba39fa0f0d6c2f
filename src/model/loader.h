// Model loading for the CLI and server: an HF checkpoint directory, random weights from a config
// (--load-format dummy), or the embedded default model when no directory is given.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/qwen35.h"
#include "model/tp_shard.h"

namespace deltaserve::model {

enum class LoadFormat { kAuto, kSafetensors, kDummy };

// Parses "auto" | "safetensors" | "dummy"; throws deltaserve::Error otherwise.
LoadFormat parse_load_format(const std::string& s);

// config.json of the embedded default model: a small random-weight Qwen3.5 (real head dims).
const std::string& embedded_default_config_json();

// Loads the model at `dir` (empty: the embedded default, always dummy weights). Throws
// deltaserve::Error for a bad directory, config or checkpoint.
// With `verbose`, prints what it loads and the weight-loading progress to stderr. With a
// tensor-parallel `shard` (size > 1) it loads the rank's shard (validating the degree first) and
// the model all-reduces through `comm`.
std::unique_ptr<Qwen35Model> load_model(const std::string& dir, LoadFormat format,
                                        backend::Backend& be, bool verbose,
                                        const TpShard& shard = {},
                                        dist::Communicator* comm = nullptr);

// The global config the model at `dir` (or the embedded default when empty) has.
ModelConfig load_config(const std::string& dir);

}  // namespace deltaserve::model
