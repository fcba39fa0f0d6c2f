#include "model/hub_cache.h"

#include <cctype>
#include <cstdlib>
#include <fstream>

#include "core/error.h"

namespace deltaserve::model {
namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

bool repo_part(const std::string& s) {
  if (s.empty() || s[0] == '.') return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  return true;
}

// A single path component: not empty, not '.' or '..', no '/'.
bool is_plain_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos;
}

// The first line of refs/<revision>: the commit it names; empty when there is no such ref.
std::string ref_commit(const fs::path& repo, const std::string& revision) {
  if (revision.find("..") != std::string::npos || revision.empty() || revision[0] == '/') return "";
  std::ifstream in(repo / "refs" / revision);
  std::string commit;
  if (!in || !std::getline(in, commit)) return "";
  while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back())))
    commit.pop_back();
  return commit;
}

}  // namespace

fs::path default_hub_cache() {
  if (const std::string v = env("HF_HUB_CACHE"); !v.empty()) return v;
  if (const std::string v = env("HF_HOME"); !v.empty()) return fs::path(v) / "hub";
  if (const std::string v = env("XDG_CACHE_HOME"); !v.empty())
    return fs::path(v) / "huggingface" / "hub";
  return fs::path(env("HOME")) / ".cache" / "huggingface" / "hub";
}

bool is_repo_id(const std::string& s) {
  const size_t slash = s.find('/');
  return slash != std::string::npos && s.find('/', slash + 1) == std::string::npos &&
         repo_part(s.substr(0, slash)) && repo_part(s.substr(slash + 1));
}

std::string resolve_model_dir(const std::string& model, const std::string& revision,
                              const fs::path& hub_cache) {
  if (model.empty() || is_dir(model)) return model;
  std::error_code ec;
  if (fs::exists(model, ec))
    throw Error(model +
                ": not a directory (a checkpoint is a directory holding config.json and "
                "safetensors)");
  if (!is_repo_id(model)) throw Error(model + ": no such checkpoint directory");
  const fs::path cache = hub_cache.empty() ? default_hub_cache() : hub_cache;
  const size_t slash = model.find('/');
  const fs::path repo =
      cache / ("models--" + model.substr(0, slash) + "--" + model.substr(slash + 1));
  const std::string rev = revision.empty() ? "main" : revision;
  // A branch or tag names its commit in refs/; a commit is a snapshot's name.
  const std::string commit = ref_commit(repo, rev);
  const std::string name = commit.empty() ? rev : commit;
  if (is_plain_name(name) && is_dir(repo / "snapshots" / name))
    return (repo / "snapshots" / name).string();
  throw Error(model + ": not a directory, and revision '" + rev +
              "' of it is not in the Hugging Face cache (" + repo.string() +
              "); deltaserve downloads nothing: fetch it first, e.g. huggingface-cli download " +
              model + (revision.empty() ? "" : " --revision " + revision) +
              ", or pass the checkpoint's directory");
}

}  // namespace deltaserve::model
