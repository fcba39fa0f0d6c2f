// A model argument as vLLM users give it — a checkpoint directory, or a Hugging Face repository id
// such as Qwen/Qwen3.5-4B — resolved to a local checkpoint directory. deltaserve downloads
// nothing: a repository id names the snapshot that `huggingface-cli download` (or vLLM) left in
// the Hugging Face cache.
#pragma once

#include <filesystem>
#include <string>

namespace deltaserve::model {

// The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else $HOME/.cache/huggingface/hub.
std::filesystem::path default_hub_cache();

// Whether `s` has the form of a repository id: "owner/name", both parts of letters, digits, '-',
// '_' and '.', neither starting with '.'.
bool is_repo_id(const std::string& s);

// `model` itself when it is an existing directory (or empty: the embedded default model); else,
// for a repository id, its snapshot directory in `hub_cache` (default_hub_cache() when empty):
// models--OWNER--NAME/snapshots/<commit>, the commit named by refs/<revision> (a branch or tag;
// "main" when `revision` is empty) or `revision` itself when it is a snapshot's commit. Throws
// deltaserve::Error saying where it looked (and how to download the checkpoint) otherwise.
std::string resolve_model_dir(const std::string& model, const std::string& revision = "",
                              const std::filesystem::path& hub_cache = {});

}  // namespace deltaserve::model
