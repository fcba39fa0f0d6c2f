// Command-line flag values: vLLM's human-readable token counts (--max-model-len 32k).
#include "app/args.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace deltaserve::app {
namespace {

TEST(Args, HumanReadableCountsAsVllmTakesThem) {
  EXPECT_EQ(human_readable_count("8192"), 8192);
  EXPECT_EQ(human_readable_count("32k"), 32000);
  EXPECT_EQ(human_readable_count("25.6k"), 25600);
  EXPECT_EQ(human_readable_count("32K"), 32768);
  EXPECT_EQ(human_readable_count("1m"), 1000000);
  EXPECT_EQ(human_readable_count("1M"), 1048576);
  EXPECT_EQ(human_readable_count("2G"), 2147483648LL);
  for (const char* bad : {"", "k", "1.5K", "1.5", "32kb", "-1k", " 1", "1e3", "0x10", "inf", "3 k"})
    EXPECT_FALSE(human_readable_count(bad).has_value()) << bad;
}

TEST(Args, CountFlagsTakeThemWithinTheirRange) {
  const Args a({"--max-model-len", "32K", "--max-num-batched-tokens=8k", "--bad", "9G"}, "serve",
               {"max-model-len", "max-num-batched-tokens", "bad"});
  EXPECT_EQ(a.get_count("max-model-len", 0, 1, 1 << 24), 32768);
  EXPECT_EQ(a.get_count("max-num-batched-tokens", 0, 1, 1 << 24), 8000);
  EXPECT_EQ(a.get_count("absent", 7, 1, 10), 7);
  try {
    a.get_count("bad", 0, 1, 1 << 24);
    ADD_FAILURE() << "9G is out of range";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--bad must be an integer in [1, 16777216] (or like 32k"),
              std::string::npos)
        << e.what();
  }
}

TEST(Args, ListFlagsTakeValuesUpToTheNextFlag) {
  const Args a({"--served-model-name", "a", "b", "--port", "1"}, "serve", {"port"}, {},
               {"served-model-name"});
  EXPECT_EQ(a.get_list("served-model-name"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(a.get("served-model-name", ""), "a");
  EXPECT_EQ(a.get("port", ""), "1");
  EXPECT_TRUE(a.get_list("absent").empty());
  const Args inline_first({"--served-model-name=a", "b"}, "serve", {}, {}, {"served-model-name"});
  EXPECT_EQ(inline_first.get_list("served-model-name"), (std::vector<std::string>{"a", "b"}));
  EXPECT_THROW(
      Args({"--served-model-name", "--port", "1"}, "serve", {"port"}, {}, {"served-model-name"}),
      Error);
}

}  // namespace
}  // namespace deltaserve::app
