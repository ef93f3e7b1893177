// Where an offloaded stage's optimizer runs per parameter
// (executor/update_split.hpp): the cut between the host's updates (beside
// the backward pass) and the compute's (through the window) where the step's
// tail is shortest, and a share asked for.
#include <gtest/gtest.h>

#include "executor/update_split.hpp"

namespace tiermem::exec {
namespace {

// Four parameters of a million elements with Adam's four operands: 28 MB
// through the link each on the compute.
std::vector<UpdateOpCost> four() { return {{10, 1000000, 4}, {11, 1000000, 4}, {12, 1000000, 4}, {13, 1000000, 4}}; }

TEST(UpdateSplit, AHostThatKeepsUpTakesEveryParameter) {
  const UpdateRates rates{.host_params_per_s = 1e9, .link_bytes_per_s = 25e9, .hidden_s = 0.010};
  const UpdateSplit s = split_updates(four(), rates);
  EXPECT_TRUE(s.device_ops.empty());
  EXPECT_EQ(s.host_params, 4000000);
  EXPECT_EQ(s.device_params, 0);
  EXPECT_DOUBLE_EQ(s.tail_s, 0) << "4 ms of host work hidden in 10 ms of backward pass";
  EXPECT_NEAR(s.all_device_tail_s, 4 * 28e6 / 25e9, 1e-12);
}

TEST(UpdateSplit, ASlowHostAndAFastLinkSendEveryParameterThroughTheWindow) {
  const UpdateRates rates{.host_params_per_s = 1e6, .link_bytes_per_s = 1e12, .hidden_s = 0};
  const UpdateSplit s = split_updates(four(), rates);
  EXPECT_EQ(s.device_ops, (std::set<int>{10, 11, 12, 13}));
  EXPECT_EQ(s.host_params, 0);
  EXPECT_NEAR(s.tail_s, 4 * 28e6 / 1e12, 1e-12);
  EXPECT_NEAR(s.all_host_tail_s, 4.0, 1e-9);
}

TEST(UpdateSplit, BetweenThemTheCutIsWhereTheTailIsShortestAndTiesFavourTheHost) {
  // 10 ms an op either way, 10 ms hidden: tails 40, 30, 20, 20, 30 ms for
  // 0..4 ops on the host; 3 on the host (fewer bytes on the link).
  const UpdateRates rates{.host_params_per_s = 1e8, .link_bytes_per_s = 28e8, .hidden_s = 0.010};
  const UpdateSplit s = split_updates(four(), rates);
  EXPECT_EQ(s.device_ops, (std::set<int>{13})) << "the last gradient home goes through the window";
  EXPECT_EQ(s.host_params, 3000000);
  EXPECT_EQ(s.device_params, 1000000);
  EXPECT_NEAR(s.tail_s, 0.020, 1e-9);
  EXPECT_NEAR(s.host_s, 0.030, 1e-9);
  EXPECT_NEAR(s.device_s, 0.010, 1e-9);
  EXPECT_NEAR(s.all_host_tail_s, 0.030, 1e-9);
  EXPECT_NEAR(s.all_device_tail_s, 0.040, 1e-9);
  const std::string line = describe(s, rates, false);
  EXPECT_NE(line.find("3.00 M parameters on the host, 1.00 M through the window"), std::string::npos) << line;
  EXPECT_NE(line.find("0.10 G parameters/s, the link 2.8 GB/s, 10.0 ms of backward pass"), std::string::npos) << line;
  EXPECT_NE(line.find("predicted 20.0 ms past the backward pass (all on the host 30.0 ms, all through the window 40.0 ms)"),
            std::string::npos)
      << line;
}

TEST(UpdateSplit, ASplitThatSavesLessThanATenthOfTheBackwardPassIsNotTaken) {
  // As on the H100 (all on the host 7.5 ms past a 40 ms backward pass, the
  // best split 5.1 ms): here 10 ms of host work a parameter, 40 ms with
  // 38.5 ms hidden (1.5 ms past), 0.1 ms each through the window: the best
  // split (three on the host, 0.1 ms) saves 1.4 ms < 3.85 ms.
  const UpdateRates rates{.host_params_per_s = 1e8, .link_bytes_per_s = 28e10, .hidden_s = 0.0385};
  const UpdateSplit s = split_updates(four(), rates);
  EXPECT_TRUE(s.device_ops.empty()) << "a 1.4 ms gain in a 38.5 ms backward pass";
  EXPECT_NEAR(s.tail_s, 0.0015, 1e-9);
  // The same with a backward pass of 20 ms: 20 ms past on the host, the
  // split saves more than 2 ms.
  const UpdateSplit t = split_updates(four(), {.host_params_per_s = 1e8, .link_bytes_per_s = 28e10, .hidden_s = 0.020});
  EXPECT_FALSE(t.device_ops.empty());
  EXPECT_LT(t.tail_s, t.all_host_tail_s - 0.002);
}

TEST(UpdateSplit, AShareAskedForIsTakenByElementsFromTheFirstGradientsHome) {
  const UpdateRates rates{.host_params_per_s = 1e9, .link_bytes_per_s = 25e9, .hidden_s = 1};
  std::vector<UpdateOpCost> ops = {{1, 100, 4}, {2, 300, 4}, {3, 600, 4}};
  EXPECT_EQ(split_updates(ops, rates, 0.5).device_ops, (std::set<int>{3})) << "100 + 300 <= 500: the first two, at most the share";
  EXPECT_EQ(split_updates(ops, rates, 0.4).device_ops, (std::set<int>{3}));
  EXPECT_EQ(split_updates(ops, rates, 0.0).device_ops, (std::set<int>{1, 2, 3}));
  EXPECT_TRUE(split_updates(ops, rates, 1.0).device_ops.empty());
  EXPECT_NE(describe(split_updates(ops, rates, 0.5), rates, true).find("as asked (--offload-host-share)"),
            std::string::npos);
}

TEST(UpdateSplit, NoParametersNoCut) {
  const UpdateSplit s = split_updates({}, {.host_params_per_s = 1e9, .link_bytes_per_s = 1e9, .hidden_s = 0});
  EXPECT_TRUE(s.device_ops.empty());
  EXPECT_EQ(s.host_params + s.device_params, 0);
  EXPECT_DOUBLE_EQ(s.tail_s, 0);
}

}  // namespace
}  // namespace tiermem::exec
