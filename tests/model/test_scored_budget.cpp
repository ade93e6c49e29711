// Scheduler's scoring budget (SchedulerConfig::max_num_scored_tokens, issue 34 item 4): requests that score their
// prompt (prompt_logprobs) take at most that many prompt tokens per step between them, a request behind them in the
// waiting queue is admitted in the same step, and with no limit nothing changes. The engine-level test checks that
// the prompt logprobs and the generated tokens are the same with and without the budget (tiny-mamba).
#include <gtest/gtest.h>

#include <memory>

#include "engine/llm_engine.h"
#include "engine/scheduler.h"
#include "test_util.h"

namespace ssmserve {
namespace {

struct Harness {
  BlockPool pool;
  StateCache cache;
  Scheduler sched;
  std::vector<std::unique_ptr<RequestState>> reqs;
  Harness(int budget, int scored) : pool(16), cache(1, StateShape{0, 16}, 16), sched(config(budget, scored), pool, cache, 0) {}
  static SchedulerConfig config(int budget, int scored) {
    SchedulerConfig c;
    c.max_num_batched_tokens = budget;
    c.max_num_scored_tokens = scored;
    return c;
  }
  RequestState* add(int prompt_len, bool score) {
    Request r;
    r.request_id = std::to_string(reqs.size());
    r.prompt_token_ids.assign(prompt_len, 5);
    if (score) r.params.prompt_logprobs = 20;
    reqs.push_back(std::make_unique<RequestState>(std::move(r)));
    sched.add_request(reqs.back().get());
    return reqs.back().get();
  }
  /// Runs one step as the engine would; returns the tokens each request got in it (by request index).
  std::vector<int> step() {
    SchedulerOutput out = sched.schedule();
    std::vector<int> got(reqs.size(), 0);
    for (const auto* list : {&out.decodes, &out.prefills})
      for (const auto& s : *list) {
        got[std::stoi(s.req->request.request_id)] = s.num_tokens;
        s.req->num_computed_tokens += s.num_tokens;
        if (s.req->num_computed_tokens == s.req->num_tokens()) s.req->output_token_ids.push_back(7);
      }
    sched.finish_step(out, {}, [](std::span<const BlockCopy>) {});
    return got;
  }
};

TEST(ScoredBudget, ScoringIsSpreadOverStepsAndOthersGoOn) {
  Harness h(2048, 256);
  h.add(1000, true);
  h.add(1000, true);
  h.add(8, false);  // arrives after both scoring requests
  std::vector<int> got = h.step();
  EXPECT_EQ(got[0], 256);
  EXPECT_EQ(got[1], 0);  // the scoring budget is spent: it waits in place
  EXPECT_EQ(got[2], 8);  // the plain request behind it is admitted in the same step
  int steps = 1, scored0 = got[0], scored1 = 0;
  while (h.reqs[0]->num_computed_tokens < 1000 || h.reqs[1]->num_computed_tokens < 1000) {
    got = h.step();
    ++steps;
    // Prompt tokens that score something (all but the last) stay within the budget; the last one is free.
    const int s0 = std::min(got[0], std::max(0, 999 - scored0)), s1 = std::min(got[1], std::max(0, 999 - scored1));
    EXPECT_LE(s0 + s1, 256) << "step " << steps;
    scored0 += got[0], scored1 += got[1];
    ASSERT_LT(steps, 20);
  }
  EXPECT_GE(steps, 8);  // 2 x 999 scored tokens at 256 per step
}

TEST(ScoredBudget, NoLimitSchedulesByTheTokenBudgetOnly) {
  Harness h(2048, 0);
  h.add(1000, true);
  h.add(1000, true);
  h.add(8, false);
  const std::vector<int> got = h.step();
  EXPECT_EQ(got[0], 1000);
  EXPECT_EQ(got[1], 1000);
  EXPECT_EQ(got[2], 8);
}

TEST(ScoredBudget, SameLogprobsWithAndWithoutTheBudget) {
  EngineConfig cfg;
  cfg.model = testing::model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(cfg.model);
  cfg.num_threads = 1;
  cfg.enable_prefix_caching = false;  // cut by the scoring budget exactly (align mode raises it to one block)
  const auto run = [&](int scored) {
    EngineConfig c = cfg;
    c.scheduler.max_num_scored_tokens = scored;
    LLMEngine engine(c);
    std::vector<RequestOutput> done;
    for (int i = 0; i < 3; ++i) {
      Request r;
      r.request_id = std::to_string(i);
      for (int t = 0; t < 300 + 50 * i; ++t) r.prompt_token_ids.push_back(100 + (t * 7 + i) % 5000);
      r.params.max_tokens = 4;
      r.params.temperature = 0.0;
      r.params.prompt_logprobs = 3;
      engine.add_request(r);
    }
    int steps = 0;
    while (engine.has_unfinished_requests()) {
      ++steps;
      for (auto& o : engine.step())
        if (o.finished) done.push_back(std::move(o));
    }
    std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
    return std::make_pair(done, steps);
  };
  const auto [whole, steps_whole] = run(0);
  const auto [cut, steps_cut] = run(64);
  EXPECT_GT(steps_cut, steps_whole);
  ASSERT_EQ(whole.size(), 3u);
  ASSERT_EQ(cut.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(whole[i].outputs[0].token_ids, cut[i].outputs[0].token_ids);
    ASSERT_EQ(whole[i].prompt_logprobs.size(), cut[i].prompt_logprobs.size());
    for (size_t p = 1; p < whole[i].prompt_logprobs.size(); ++p) {
      ASSERT_TRUE(cut[i].prompt_logprobs[p].has_value()) << i << " " << p;
      EXPECT_NEAR(whole[i].prompt_logprobs[p]->token_logprob, cut[i].prompt_logprobs[p]->token_logprob, 1e-4) << i << " " << p;
      ASSERT_EQ(whole[i].prompt_logprobs[p]->top.size(), cut[i].prompt_logprobs[p]->top.size());
      EXPECT_EQ(whole[i].prompt_logprobs[p]->top[0].id, cut[i].prompt_logprobs[p]->top[0].id);
    }
  }
}

}  // namespace
}  // namespace ssmserve
