// Owns ScriptedProposer: the test drafter of the speculative-decoding suites (tests/model/test_spec_decode.cpp on the
// CPU, tests/cuda/test_cuda_spec_decode.cpp on the GPU), which drafts from each prompt's known greedy continuation
// with a chosen number of right drafts per request and step.
#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "engine/request.h"
#include "engine/spec_decode.h"

namespace ssmserve::testing {

/// Drafts from the known greedy continuation of each prompt: `right(req, step)` of the next k tokens are correct, the
/// one after them (if any) is wrong. Counts what it drafted so the test can check the engine's counters.
class ScriptedProposer final : public Proposer {
 public:
  using Rule = std::function<int(const RequestState&, std::mt19937&)>;  // correct drafts to propose, in [0, k]
  ScriptedProposer(const std::map<std::vector<int>, std::vector<int>>* answers, int vocab, Rule right)
      : answers_(answers), vocab_(vocab), right_(std::move(right)) {}

  void propose(std::span<RequestState* const> reqs, int k) override {
    for (RequestState* r : reqs) {
      r->draft_token_ids.clear();
      const auto it = answers_->find(r->request.prompt_token_ids);
      if (it == answers_->end()) continue;
      const std::vector<int>& ans = it->second;
      const size_t g = r->output_token_ids.size();
      const int right = std::min(k, right_(*r, rng_));
      for (int j = 0; j < k && g + static_cast<size_t>(j) < ans.size(); ++j) {
        const int t = ans[g + static_cast<size_t>(j)];
        r->draft_token_ids.push_back(j < right ? t : (t + 1) % vocab_);
        if (j >= right) break;
      }
    }
  }

 private:
  const std::map<std::vector<int>, std::vector<int>>* answers_;
  int vocab_;
  Rule right_;
  std::mt19937 rng_{29};
};

}  // namespace ssmserve::testing
