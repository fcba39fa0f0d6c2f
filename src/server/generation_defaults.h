// The default sampling parameters of requests that leave them out, as vLLM sets them: from the
// model's generation_config.json (--generation-config auto, vLLM's default), where the model's
// authors put their recommended sampling (Qwen3's: temperature 0.6, top_k 20, top_p 0.95), or
// OpenAI's neutral ones (--generation-config vllm), with --override-generation-config on top. A
// request's own fields always win; max_new_tokens caps max_tokens.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "engine/request.h"
#include "server/json_body.h"

namespace deltaserve::server {

struct GenerationDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  std::optional<int64_t> max_tokens;  // generation_config's max_new_tokens

  bool empty() const;
  // "temperature 0.6, top_k 20, top_p 0.95": the fields set, for the start-up log.
  std::string describe() const;
  // The fields set, into p (before the request's own fields are parsed over them).
  void apply(engine::SamplingParams& p) const;
};

// A generation config's sampling fields (repetition_penalty, temperature, top_k, top_p, min_p,
// max_new_tokens), those equal to transformers' GenerationConfig defaults left out (as vLLM reads
// the config's difference from them), then `overrides`' fields on top. `where` names the source
// in errors. Throws deltaserve::Error for a field of the wrong type or out of range.
GenerationDefaults generation_defaults_of(const json& config, const json& overrides,
                                          const std::string& where);

// --generation-config `mode` ("auto": model_dir's generation_config.json where there is one;
// "vllm": none; else a directory holding generation_config.json) with --override-generation-config
// `overrides` (a JSON object, or empty). Throws deltaserve::Error for a missing directory file,
// malformed JSON or a bad field.
GenerationDefaults load_generation_defaults(const std::string& mode,
                                            const std::filesystem::path& model_dir,
                                            const std::string& overrides);

}  // namespace deltaserve::server
