// Owns the helpers of the GPU engine-level tests (test_cuda_model, test_cuda_tp): generating through an LLM on
// --device cuda with a tweaked EngineConfig, and comparing two runs' outputs exactly.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
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

}  // namespace ssmserve::cudatest
