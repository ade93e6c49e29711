// Owns the helpers of the GPU engine-level tests (test_cuda_model, test_cuda_tp, test_cuda_tp_spec): generating
// through an LLM on --device cuda with a tweaked EngineConfig, and comparing two runs' outputs exactly.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "engine/llm_engine.h"

namespace ssmserve::cudatest {

/// LLM(cfg).generate_ids(prompts, sp) with cfg.model = dir, cfg.device = "cuda", after tweak(cfg) (if given).
inline std::vector<RequestOutput> generate_on_cuda(const std::filesystem::path& dir,
                                                   const std::vector<std::vector<int>>& prompts, const SamplingParams& sp,
                                                   const std::function<void(EngineConfig&)>& tweak = {}) {
  EngineConfig cfg;
  cfg.model = dir;
  cfg.device = "cuda";
  if (tweak) tweak(cfg);
  LLM llm(cfg);
  return llm.generate_ids(prompts, sp);
}

/// Every prompt's token ids equal, and every logprob entry (id and value) bit for bit.
inline void expect_identical_outputs(const std::vector<RequestOutput>& got, const std::vector<RequestOutput>& want,
                                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& g = got[i].outputs.at(0);
    const auto& w = want[i].outputs.at(0);
    EXPECT_EQ(g.token_ids, w.token_ids) << what << " prompt " << i;
    ASSERT_EQ(g.logprobs.size(), w.logprobs.size()) << what << " prompt " << i;
    for (size_t t = 0; t < w.logprobs.size(); ++t) {
      ASSERT_EQ(g.logprobs[t].size(), w.logprobs[t].size()) << what << " prompt " << i << " token " << t;
      for (size_t k = 0; k < w.logprobs[t].size(); ++k) {
        EXPECT_EQ(g.logprobs[t][k].id, w.logprobs[t][k].id) << what << " prompt " << i << " token " << t;
        EXPECT_EQ(g.logprobs[t][k].logprob, w.logprobs[t][k].logprob) << what << " prompt " << i << " token " << t;
      }
    }
  }
}

/// Per generated token (entries of SamplingParams::logprobs >= 2: [chosen, top...]): the chosen token's logprob minus
/// the best other listed token's, +inf when none is listed. A greedy run's margin is how far its pick was from a tie.
inline std::vector<float> greedy_margins(const std::vector<std::vector<TokenLogprob>>& lps) {
  std::vector<float> m;
  for (const auto& e : lps) {
    float other = -std::numeric_limits<float>::infinity();
    for (size_t k = 1; k < e.size(); ++k)
      if (e[k].id != e.at(0).id) other = std::max(other, e[k].logprob);
    m.push_back(e.at(0).logprob - other);
  }
  return m;
}

/// Greedy ids of two GPU paths whose GEMMs see different row counts (bf16 sums in another order, so logits differ in
/// the last bits): equal, or equal up to a first difference where the reference `want` was at a near tie (margin <
/// `tie`: the other path picked the runner-up; not a bug) and after which the sequences are not comparable. Fails
/// the test on any other difference. Returns the number of leading tokens the caller may compare logprobs on.
inline size_t greedy_prefix_up_to_tie(const std::vector<int>& got, const std::vector<int>& want,
                                      const std::vector<float>& want_margins, double tie, const std::string& what) {
  const size_t n = std::min(got.size(), want.size());
  for (size_t t = 0; t < n; ++t) {
    if (got[t] == want[t]) continue;
    const float margin = t < want_margins.size() ? want_margins[t] : std::numeric_limits<float>::infinity();
    EXPECT_LT(margin, tie) << what << ": token " << t << " differs (" << got[t] << " vs " << want[t]
                           << ") where the reference's pick was " << margin << " from the runner-up, not a near tie";
    if (margin < tie) std::printf("[tie] %s: token %zu flipped at a near tie (margin %.3g)\n", what.c_str(), t, margin);
    return t;
  }
  EXPECT_EQ(got.size(), want.size()) << what;
  return n;
}

}  // namespace ssmserve::cudatest
