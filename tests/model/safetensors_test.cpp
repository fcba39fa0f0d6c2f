#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace deltaserve::model {
namespace {

using deltaserve::testing::TempDir;
namespace fs = std::filesystem;

// Writes a raw file: 8-byte header length, header text, then `data_bytes` zero bytes.
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes,
               uint64_t hlen_override = 0) {
  std::ofstream f(p, std::ios::binary);
  const uint64_t hlen = hlen_override ? hlen_override : header.size();
  f.write(reinterpret_cast<const char*>(&hlen), 8);
  f << header;
  std::string data(data_bytes, '\0');
  f << data;
}

std::string error_of(const fs::path& p) {
  try {
    SafetensorsFile f(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, WriteReadRoundTrip) {
  TempDir d;
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const uint16_t b[2] = {0x3f80, 0x4000};
  write_safetensors(d.path() / "x.safetensors",
                    {{"b", DType::kBF16, {2}, b}, {"a", DType::kF32, {2, 3}, a}},
                    {{"format", "pt"}});
  SafetensorsFile f(d.path() / "x.safetensors");
  ASSERT_EQ(f.tensors().size(), 2u);
  const TensorInfo& ta = f.tensors().at("a");
  EXPECT_EQ(ta.dtype, DType::kF32);
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(ta.data, a, sizeof a), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta.data) % 4, 0u);  // header padded to 8 bytes
  EXPECT_EQ(f.tensors().at("b").dtype, DType::kBF16);
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST(Safetensors, RejectsTruncatedFile) {
  TempDir d;
  std::ofstream(d.path() / "t.safetensors") << "abc";
  EXPECT_NE(error_of(d.path() / "t.safetensors").find("truncated file"), std::string::npos);
}

TEST(Safetensors, RejectsFileCutInTheDataSection) {
  TempDir d;
  const fs::path src =
      deltaserve::testing::test_data() / "tiny_odd" / "model-00001-of-00006.safetensors";
  const fs::path cut = d.path() / "model-00001-of-00006.safetensors";
  fs::copy_file(src, cut);
  fs::resize_file(cut, fs::file_size(src) / 2);
  const std::string e = error_of(cut);
  EXPECT_NE(e.find("model-00001-of-00006.safetensors: tensor '"), std::string::npos) << e;
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
}

TEST(Safetensors, RejectsHeaderPastEof) {
  TempDir d;
  write_raw(d.path() / "t.safetensors", "{}", 0, 1000);
  const std::string e = error_of(d.path() / "t.safetensors");
  EXPECT_NE(e.find("header length 1000 runs past end of file"), std::string::npos) << e;
  EXPECT_NE(e.find("t.safetensors"), std::string::npos) << e;
}

TEST(Safetensors, RejectsBadJson) {
  TempDir d;
  write_raw(d.path() / "t.safetensors", "{\"a\": [", 0);
  EXPECT_NE(error_of(d.path() / "t.safetensors").find("header is not a JSON object"),
            std::string::npos);
}

TEST(Safetensors, RejectsOffsetsOutOfRange) {
  TempDir d;
  write_raw(d.path() / "t.safetensors",
            R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  const std::string e = error_of(d.path() / "t.safetensors");
  EXPECT_NE(e.find("tensor 'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
}

TEST(Safetensors, RejectsSizeMismatch) {
  TempDir d;
  write_raw(d.path() / "t.safetensors",
            R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", 16);
  EXPECT_NE(error_of(d.path() / "t.safetensors").find("does not match shape [4] BF16"),
            std::string::npos);
}

TEST(Safetensors, RejectsOverlap) {
  TempDir d;
  write_raw(
      d.path() / "t.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      16);
  const std::string e = error_of(d.path() / "t.safetensors");
  EXPECT_NE(e.find("'a' and 'b' overlap"), std::string::npos) << e;
}

TEST(Safetensors, RejectsUnknownDtype) {
  TempDir d;
  write_raw(d.path() / "t.safetensors",
            R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2);
  const std::string e = error_of(d.path() / "t.safetensors");
  EXPECT_NE(e.find("tensor 'w': unsupported dtype 'F8_E4M3'"), std::string::npos) << e;
}

TEST(Safetensors, RejectsNegativeShapeAndMissingFields) {
  TempDir d;
  write_raw(d.path() / "t.safetensors",
            R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(error_of(d.path() / "t.safetensors").find("non-negative"), std::string::npos);
  write_raw(d.path() / "u.safetensors", R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(error_of(d.path() / "u.safetensors").find("missing dtype"), std::string::npos);
}

TEST(Checkpoint, ShardedIndexAndErrors) {
  TempDir d;
  const float a[2] = {1, 2}, b[3] = {3, 4, 5};
  write_safetensors(d.path() / "s1.safetensors", {{"a", DType::kF32, {2}, a}});
  write_safetensors(d.path() / "s2.safetensors", {{"b", DType::kF32, {3}, b}});
  std::ofstream(d.path() / "model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})";
  Checkpoint c(d.path());
  EXPECT_EQ(c.get("b").shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(c.find("zzz"), nullptr);
  try {
    c.get("zzz");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'zzz'"), std::string::npos);
  }
  // An index naming a tensor that its shard lacks.
  std::ofstream(d.path() / "model.safetensors.index.json")
      << R"({"weight_map":{"a":"s1.safetensors","c":"s2.safetensors"}})";
  EXPECT_THROW(Checkpoint{d.path()}, Error);
  std::ofstream(d.path() / "model.safetensors.index.json") << "not json";
  EXPECT_THROW(Checkpoint{d.path()}, Error);
  std::ofstream(d.path() / "model.safetensors.index.json") << R"({"weight_map":{"a":"../x"}})";
  EXPECT_THROW(Checkpoint{d.path()}, Error);
}

TEST(Checkpoint, RealShardedTinyModel) {
  Checkpoint c(deltaserve::testing::test_data() / "tiny_odd");
  EXPECT_NE(c.find("lm_head.weight"), nullptr);
  EXPECT_EQ(c.get("model.language_model.layers.0.linear_attn.A_log").dtype, DType::kF32);
  EXPECT_EQ(c.get("model.language_model.layers.0.linear_attn.dt_bias").dtype, DType::kBF16);
}

}  // namespace
}  // namespace deltaserve::model
