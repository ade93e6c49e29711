// Model-level check of the SSM state dtype (--mamba-ssm-cache-dtype) on the bundled tiny-mamba: 128-token greedy
// generations with a bf16 or fp16 SSM state run and follow the fp32-state reference, and teacher-forced logprobs
// of the reference continuation (state rounded after every token, as in decode) stay within a measured bound.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/llm_engine.h"
#include "test_util.h"

namespace ssmserve {
namespace {

constexpr int kMaxTokens = 128;
const std::vector<std::string> kPrompts = {"It is a truth universally acknowledged", "And the LORD said unto Moses,",
                                           "The", "Emma Woodhouse, handsome, clever, and rich"};

EngineConfig tiny_config(const std::string& ssm_dtype, int max_num_batched_tokens = 2048) {
  EngineConfig cfg;
  cfg.model = testing::model_dir("tiny-mamba");
  cfg.mamba_ssm_cache_dtype = ssm_dtype;
  cfg.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  return cfg;
}

/// Measured against the fp32-state run (see the test comments for what each is).
struct Bounds {
  int min_common_prefix;       ///< greedy tokens identical to the reference, worst prompt
  double max_gen_logprob;      ///< max |Δ logprob| of the sampled token over that common prefix
  double max_forced_logprob;   ///< max |Δ logprob| of the reference tokens, teacher-forced, all positions
  double mean_forced_logprob;  ///< mean of the same
};

class StateDtype : public ::testing::TestWithParam<std::tuple<std::string, Bounds>> {};

TEST_P(StateDtype, GreedyFollowsFp32StateReference) {
  const auto [dtype, bound] = GetParam();
  SSM_SKIP_IF_NO_MODEL(tiny_config("float32").model);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = kMaxTokens;
  sp.ignore_eos = true;
  sp.logprobs = 2;  // sampled (= top-1, greedy) then the runner-up
  static const auto ref = LLM(tiny_config("float32")).generate(kPrompts, sp);
  const auto out = LLM(tiny_config(dtype)).generate(kPrompts, sp);
  // 1. Free-running greedy: the tokens agree up to a first flip of a near-tie, after which the runs diverge;
  //    up to there the sampled tokens' logprobs differ by the state's rounding only.
  int min_prefix = kMaxTokens;
  double max_dlp = 0;
  for (size_t p = 0; p < kPrompts.size(); ++p) {
    const auto &r = ref[p].outputs[0], &o = out[p].outputs[0];
    ASSERT_EQ(o.token_ids.size(), static_cast<size_t>(kMaxTokens));
    int n = 0;
    while (n < kMaxTokens && o.token_ids[n] == r.token_ids[n]) {
      max_dlp = std::max(max_dlp, std::abs(double(o.logprobs[n][0].logprob) - r.logprobs[n][0].logprob));
      ++n;
    }
    min_prefix = std::min(min_prefix, n);
    // A divergence must be a flip of a near-tie: the reference's top-2 margin there is within what the state's
    // rounding can move a logprob (twice the teacher-forced bound).
    if (n < kMaxTokens) {
      const double margin = r.logprobs[n][0].logprob - r.logprobs[n][1].logprob;
      EXPECT_LE(margin, 2 * bound.max_forced_logprob) << "prompt " << p << " diverges at token " << n;
      RecordProperty(fmt::format("divergence_{}", p), fmt::format("token {}, fp32 top-2 margin {:.3g}", n, margin));
    }
  }
  // 2. Teacher-forced: score prompt + reference continuation with prompt_logprobs, one token per step (chunks of
  //    1 token, so the state is rounded after every token as on the decode path), in both dtypes; compare the
  //    logprob of every reference token. This covers all 128 positions whatever the greedy divergence.
  SamplingParams forced;
  forced.temperature = 0;
  forced.max_tokens = 1;
  forced.prompt_logprobs = 0;
  std::vector<std::vector<int>> ids;
  for (const auto& r : ref) {
    ids.push_back(r.prompt_token_ids);
    ids.back().insert(ids.back().end(), r.outputs[0].token_ids.begin(), r.outputs[0].token_ids.end());
  }
  static const auto fref = LLM(tiny_config("float32", 1)).generate_ids(ids, forced);
  const auto fout = LLM(tiny_config(dtype, 1)).generate_ids(ids, forced);
  double max_forced = 0, sum_forced = 0;
  int count = 0;
  for (size_t p = 0; p < ids.size(); ++p)
    for (size_t i = 1; i < ids[p].size(); ++i) {
      const double d = std::abs(double(fout[p].prompt_logprobs[i]->token_logprob) - fref[p].prompt_logprobs[i]->token_logprob);
      max_forced = std::max(max_forced, d), sum_forced += d, ++count;
    }
  const std::string measured = fmt::format("{}: greedy common prefix >= {} / {} tokens, max |dlogprob| on it {:.3g}; "
                                           "teacher-forced max |dlogprob| {:.3g}, mean {:.3g} over {} positions",
                                           dtype, min_prefix, kMaxTokens, max_dlp, max_forced, sum_forced / count, count);
  RecordProperty("measured", measured);
  std::cout << "[ measured ] " << measured << "\n";
  EXPECT_GE(min_prefix, bound.min_common_prefix);
  EXPECT_LE(max_dlp, bound.max_gen_logprob);
  EXPECT_LE(max_forced, bound.max_forced_logprob);
  EXPECT_LE(sum_forced / count, bound.mean_forced_logprob);
}

// Bounds. Measured on tiny-mamba (8 layers, d_inner 512, d_state 16; 4 prompts x 128 tokens, 533 teacher-forced
// positions), natural-log logprobs:
//   bf16 state: greedy common prefix >= 73 tokens (prompt 1 flips a near-tie at token 73: fp32 top-2 margin
//               2.4e-4), max |Δlogprob| 0.0169 on the prefix; teacher-forced max 0.0169, mean 1.5e-3.
//   fp16 state: all 128 tokens identical for every prompt; max |Δlogprob| 1.2e-3; teacher-forced max 1.25e-3,
//               mean 1.8e-4.
//   fp32 state: identical to the reference (same code path), bit for bit.
// The logprob bounds are ~3x the measured values; the prefix bounds are lower than measured (half or less) since
// where a near-tie flips depends on the GEMM kernels' summation order, and the margin check above is what
// guards the reason for a flip.
INSTANTIATE_TEST_SUITE_P(SsmDtypes, StateDtype,
                         ::testing::Values(std::make_tuple("float32", Bounds{kMaxTokens, 0.0, 0.0, 0.0}),
                                           std::make_tuple("bfloat16", Bounds{32, 0.05, 0.05, 5e-3}),
                                           std::make_tuple("float16", Bounds{64, 5e-3, 5e-3, 6e-4})),
                         [](const auto& info) { return std::get<0>(info.param); });

TEST(StateDtype, EngineRejectsBadDtypeNamingTheFlag) {
  EngineConfig cfg = tiny_config("fp8");
  try {
    cfg.validate();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mamba-ssm-cache-dtype"), std::string::npos) << e.what();
  }
  cfg.mamba_ssm_cache_dtype = "float32";
  cfg.mamba_cache_dtype = "int8";
  EXPECT_THROW(cfg.validate(), Error);
}

}  // namespace
}  // namespace ssmserve
