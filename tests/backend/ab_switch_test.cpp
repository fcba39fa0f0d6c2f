// The CUDA backend's A/B switches (backend/cuda/ab_switch.h), read from the environment on the
// host: a switch that turns a form off, and one that forces a form on or off over its heuristic.
#include "backend/cuda/ab_switch.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace deltaserve::cuda {
namespace {

constexpr const char* kName = "DS_AB_SWITCH_TEST";

TEST(AbSwitch, OnUnlessSetToZero) {
  unsetenv(kName);
  EXPECT_TRUE(ab_switch_on(kName));
  setenv(kName, "0", 1);
  EXPECT_FALSE(ab_switch_on(kName));
  setenv(kName, "1", 1);
  EXPECT_TRUE(ab_switch_on(kName));
  unsetenv(kName);
}

TEST(AbSwitch, ForcedIsUnsetOffOrOn) {
  unsetenv(kName);
  EXPECT_EQ(ab_switch_forced(kName), -1);
  setenv(kName, "0", 1);
  EXPECT_EQ(ab_switch_forced(kName), 0);
  setenv(kName, "1", 1);
  EXPECT_EQ(ab_switch_forced(kName), 1);
  setenv(kName, "yes", 1);
  EXPECT_EQ(ab_switch_forced(kName), 1);
  unsetenv(kName);
}

}  // namespace
}  // namespace deltaserve::cuda
