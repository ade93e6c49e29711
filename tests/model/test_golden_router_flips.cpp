// The goldens' rule for greedy steps after a MoE router near-tie (golden_router_flips.h), on a synthetic golden prompt
// shaped like tiny-qwen3_5_moe's prompt 0 (26 prompt tokens; layer 3's choice at position 45 flipped moves step 20 by
// +0.29, step 21 by -0.08).
#include <gtest/gtest.h>

#include "golden_router_flips.h"

namespace ssmserve::testing {
namespace {

nlohmann::json prompt_golden() {
  nlohmann::json p;
  p["num_prompt_tokens"] = 26;
  p["greedy_token_ids"] = {10, 11, 12, 13};  // steps 18..21 stand in as steps 0..3 below, positions shifted to match
  p["greedy_logprobs"] = {-1.0, -2.0, -0.5, -3.0};
  p["top2_gap"] = {0.5, 0.02, 0.3, 0.4};
  // A flip at position 27 (step 2's fed token: 26 - 1 + 2), and one at position 40 that no step here depends on.
  p["router_flips"] = {{{"layer", 3}, {"position", 27}, {"logit_gap", 4.2e-3}, {"greedy_logprobs", {-1.0, -2.0, -0.206, -3.08}},
                        {"top2_gap", {0.5, 0.02, 0.3, -0.01}}},
                       {{"layer", 5}, {"position", 40}, {"logit_gap", 1e-3}, {"greedy_logprobs", {-1.4, -2.0, -0.5, -3.0}},
                        {"top2_gap", {0.01, 0.02, 0.3, 0.4}}}};
  return p;
}

TEST(GoldenRouterFlips, ReadsTheFlips) {
  const auto p = prompt_golden();
  const auto f = router_flips(p);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].layer, 3);
  EXPECT_EQ(f[0].position, 27);
  EXPECT_DOUBLE_EQ(f[0].logit_gap, 4.2e-3);
  EXPECT_EQ(f[0].greedy_logprobs.size(), 4u);
  nlohmann::json none = p;
  none.erase("router_flips");
  EXPECT_TRUE(router_flips(none).empty()) << "a golden without the field has no flips";
}

TEST(GoldenRouterFlips, GoldenWithinToleranceIsOk) {
  const auto p = prompt_golden();
  const auto f = router_flips(p);
  const StepVerdict v = judge_greedy_step(p, f, 2, 12, -0.52, 0.05, 0.05);
  EXPECT_TRUE(v.ok);
  EXPECT_EQ(v.flip, nullptr);
}

TEST(GoldenRouterFlips, FlipExplainsALogprobOnlyFromItsPositionOn) {
  const auto p = prompt_golden();
  const auto f = router_flips(p);
  // Step 2 (position 27 fed) at the flip's value: excused by the flip at position 27.
  StepVerdict v = judge_greedy_step(p, f, 2, 12, -0.21, 0.05, 0.05);
  EXPECT_TRUE(v.ok) << v.why;
  ASSERT_NE(v.flip, nullptr);
  EXPECT_EQ(v.flip->position, 27);
  EXPECT_NE(v.why.find("layer 3"), std::string::npos) << v.why;
  // Step 0 at the position-40 flip's value: that flip is after step 0's last position (25), so it does not apply.
  v = judge_greedy_step(p, f, 0, 10, -1.4, 0.05, 0.05);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.why.find("golden -1.0000"), std::string::npos) << v.why;
  // Step 2 off from both the golden and the flip: a failure naming the nearest alternative.
  v = judge_greedy_step(p, f, 2, 12, -0.35, 0.05, 0.05);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.why.find("nearest routing alternative -0.2060"), std::string::npos) << v.why;
}

TEST(GoldenRouterFlips, DivergenceAllowedAtTheGoldensOrAFlipsNearTie) {
  const auto p = prompt_golden();
  const auto f = router_flips(p);
  EXPECT_TRUE(judge_greedy_step(p, f, 1, 99, 0.0, 0.05, 0.05).ok) << "the golden's own near-tie (0.02)";
  EXPECT_FALSE(judge_greedy_step(p, f, 0, 99, 0.0, 0.05, 0.05).ok) << "gap 0.5, and the position-40 flip does not apply";
  const StepVerdict v = judge_greedy_step(p, f, 3, 99, 0.0, 0.05, 0.05);
  EXPECT_TRUE(v.ok) << "the position-27 flip makes step 3 a near-tie (-0.01)";
  ASSERT_NE(v.flip, nullptr);
  EXPECT_EQ(v.flip->layer, 3);
  EXPECT_FALSE(judge_greedy_step(p, {}, 3, 99, 0.0, 0.05, 0.05).ok) << "without the flips: gap 0.4";
}

}  // namespace
}  // namespace ssmserve::testing
