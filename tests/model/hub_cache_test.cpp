// A model argument resolved as vLLM users give it: a directory as it is, a repository id to its
// snapshot in the Hugging Face cache (refs/<revision> naming the commit), else a clear error.
#include "model/hub_cache.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "test_util.h"

namespace deltaserve::model {
namespace {

namespace fs = std::filesystem;
using deltaserve::testing::TempDir;

// A cache holding Org/Name at commits c1 (main) and c2 (tag v2).
struct FakeCache {
  TempDir d;
  fs::path repo = d.path() / "models--Org--Name";
  FakeCache() {
    for (const char* c : {"c1", "c2"}) fs::create_directories(repo / "snapshots" / c);
    fs::create_directories(repo / "refs");
    std::ofstream(repo / "refs" / "main") << "c1";  // no newline, as huggingface_hub writes it
    std::ofstream(repo / "refs" / "v2") << "c2\n";
  }
  std::string snapshot(const char* c) const { return (repo / "snapshots" / c).string(); }
};

std::string error_of(const std::string& model, const std::string& revision, const fs::path& cache) {
  try {
    resolve_model_dir(model, revision, cache);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(HubCache, RepositoryIdsResolveToTheirSnapshot) {
  FakeCache c;
  EXPECT_EQ(resolve_model_dir("Org/Name", "", c.d.path()), c.snapshot("c1"));
  EXPECT_EQ(resolve_model_dir("Org/Name", "main", c.d.path()), c.snapshot("c1"));
  EXPECT_EQ(resolve_model_dir("Org/Name", "v2", c.d.path()), c.snapshot("c2"));
  EXPECT_EQ(resolve_model_dir("Org/Name", "c2", c.d.path()), c.snapshot("c2"));  // a commit
}

TEST(HubCache, DirectoriesAndTheDefaultModelStayAsGiven) {
  FakeCache c;
  EXPECT_EQ(resolve_model_dir("", "", c.d.path()), "");
  EXPECT_EQ(resolve_model_dir(c.repo.string(), "", c.d.path()), c.repo.string());
  // A local directory named like a repository id wins over the cache (as in vLLM).
  const fs::path cwd = fs::current_path();
  fs::current_path(c.d.path());
  fs::create_directories("Org/Name");
  EXPECT_EQ(resolve_model_dir("Org/Name", "", c.d.path()), "Org/Name");
  fs::current_path(cwd);
}

TEST(HubCache, WhatIsNotThereIsAClearError) {
  FakeCache c;
  EXPECT_NE(error_of("/no/such/dir", "", c.d.path()).find("/no/such/dir: no such checkpoint"),
            std::string::npos);
  std::ofstream(c.d.path() / "model.safetensors") << "x";
  EXPECT_NE(error_of((c.d.path() / "model.safetensors").string(), "", c.d.path())
                .find("model.safetensors: not a directory"),
            std::string::npos);
  const std::string missing = error_of("Org/Other", "", c.d.path());
  EXPECT_NE(missing.find("not in the Hugging Face cache"), std::string::npos) << missing;
  EXPECT_NE(missing.find("huggingface-cli download Org/Other"), std::string::npos) << missing;
  EXPECT_NE(error_of("Org/Name", "v3", c.d.path()).find("revision 'v3'"), std::string::npos);
  // Revisions that would leave the snapshots directory are not looked up.
  EXPECT_NE(error_of("Org/Name", "..", c.d.path()).find("not in the Hugging Face cache"),
            std::string::npos);
  EXPECT_NE(error_of("Org/Name", "../snapshots/c1", c.d.path()).find("not in the"),
            std::string::npos);
  std::ofstream(c.repo / "refs" / "evil") << "../../x";
  EXPECT_NE(error_of("Org/Name", "evil", c.d.path()).find("not in the"), std::string::npos);
}

TEST(HubCache, RepositoryIdForm) {
  EXPECT_TRUE(is_repo_id("Qwen/Qwen3.5-4B"));
  EXPECT_TRUE(is_repo_id("a_b/c.d-e"));
  for (const char* s : {"Qwen", "/Qwen/x", "Qwen/", "a/b/c", "./x", "../x", "a/.b", "a b/c"})
    EXPECT_FALSE(is_repo_id(s)) << s;
}

TEST(HubCache, TheCacheFollowsTheHuggingFaceVariables) {
  const auto saved = [](const char* n) {
    const char* v = std::getenv(n);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  const char* names[] = {"HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"};
  std::optional<std::string> old[4];
  for (int i = 0; i < 4; ++i) old[i] = saved(names[i]);
  for (const char* n : names) unsetenv(n);
  setenv("HOME", "/h", 1);
  EXPECT_EQ(default_hub_cache(), fs::path("/h/.cache/huggingface/hub"));
  setenv("XDG_CACHE_HOME", "/x", 1);
  EXPECT_EQ(default_hub_cache(), fs::path("/x/huggingface/hub"));
  setenv("HF_HOME", "/hf", 1);
  EXPECT_EQ(default_hub_cache(), fs::path("/hf/hub"));
  setenv("HF_HUB_CACHE", "/cache", 1);
  EXPECT_EQ(default_hub_cache(), fs::path("/cache"));
  for (int i = 0; i < 4; ++i) {
    if (old[i])
      setenv(names[i], old[i]->c_str(), 1);
    else
      unsetenv(names[i]);
  }
}

}  // namespace
}  // namespace deltaserve::model
