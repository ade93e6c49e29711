// Scheduler with KV blocks in the shared pool (hybrid models): a request is admitted only when its state block
// and its first chunk's KV blocks fit, KV blocks are allocated as sequences grow, the newest running request is
// preempted (by recompute, all its blocks freed) when one cannot grow, and a pool too small for a lone request
// is a clear error instead of a livelock.
#include <gtest/gtest.h>

#include <memory>

#include "core/error.h"
#include "engine/scheduler.h"

namespace ssmserve {
namespace {

constexpr int kBs = 4;  // tokens per KV block

struct Harness {
  BlockPool pool;
  StateCache cache;
  Scheduler sched;
  std::vector<std::unique_ptr<RequestState>> reqs;
  Harness(int blocks, int budget) : pool(blocks), cache(1, StateShape{0, 16}, blocks), sched(config(budget), pool, cache, kBs) {}
  static SchedulerConfig config(int budget) {
    SchedulerConfig c;
    c.max_num_batched_tokens = budget;
    return c;
  }
  RequestState* add(int prompt_len) {
    Request r;
    r.request_id = std::to_string(reqs.size());
    r.prompt_token_ids.assign(prompt_len, 5);
    reqs.push_back(std::make_unique<RequestState>(std::move(r)));
    sched.add_request(reqs.back().get());
    return reqs.back().get();
  }
  /// Applies a step's work as the engine would: computed tokens advance; finished prompts get one output.
  static void apply(const SchedulerOutput& out) {
    for (const auto* list : {&out.decodes, &out.prefills})
      for (const auto& s : *list) {
        s.req->num_computed_tokens += s.num_tokens;
        if (s.req->num_computed_tokens == s.req->num_tokens()) s.req->output_token_ids.push_back(7);
      }
  }
};

TEST(KvScheduler, AdmitsOnlyWhenStateAndKvFit) {
  Harness h(6, 100);  // 5 usable blocks
  RequestState* a = h.add(10);  // 1 state + 3 KV
  RequestState* b = h.add(4);   // 1 state + 1 KV: does not fit next to a
  auto out = h.sched.schedule();
  ASSERT_EQ(out.prefills.size(), 1u);
  EXPECT_EQ(out.prefills[0].req, a);
  EXPECT_EQ(a->kv_blocks.size(), 3u);
  EXPECT_NE(a->state_block, 0);
  EXPECT_EQ(h.pool.num_free(), 1);
  EXPECT_EQ(b->status, RequestStatus::Waiting);
  // a grows: 11 tokens fit its 3 blocks; at 13 it takes the last free block.
  Harness::apply(out);
  out = h.sched.schedule();
  ASSERT_EQ(out.decodes.size(), 1u);
  EXPECT_EQ(a->kv_blocks.size(), 3u);
  Harness::apply(out);
  a->output_token_ids.push_back(7);  // pretend one more sampled token: 12 computed, 13 tokens
  a->num_computed_tokens = 12;
  out = h.sched.schedule();
  EXPECT_EQ(a->kv_blocks.size(), 4u);
  EXPECT_EQ(h.pool.num_free(), 0);
  // Finishing returns every block; b is admitted next.
  h.sched.finish_request(a);
  EXPECT_EQ(h.pool.num_free(), 5);
  out = h.sched.schedule();
  ASSERT_EQ(out.prefills.size(), 1u);
  EXPECT_EQ(out.prefills[0].req, b);
}

TEST(KvScheduler, PreemptsNewestWhenKvRunsOut) {
  Harness h(7, 100);  // 6 usable
  RequestState* a = h.add(8);  // 1 + 2
  RequestState* b = h.add(4);  // 1 + 1
  auto out = h.sched.schedule();
  ASSERT_EQ(out.prefills.size(), 2u);
  EXPECT_EQ(h.pool.num_free(), 1);
  Harness::apply(out);  // a: 9 tokens (needs 3 KV), b: 5 tokens (needs 2 KV)
  out = h.sched.schedule();
  // a takes the last block; b (the newest) cannot grow and is preempted: all its blocks back, not rescheduled
  // in the same step.
  ASSERT_EQ(out.decodes.size(), 1u);
  EXPECT_EQ(out.decodes[0].req, a);
  EXPECT_TRUE(out.prefills.empty());
  EXPECT_EQ(b->status, RequestStatus::Preempted);
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_EQ(b->state_block, 0);
  EXPECT_TRUE(b->kv_blocks.empty());
  EXPECT_EQ(h.sched.num_preemptions(), 1);
  EXPECT_EQ(h.pool.num_free(), 2);
  // Next step b comes back (prompt + its output token: 5 tokens = 1 + 2 blocks... only 2 free): stays waiting.
  Harness::apply(out);
  out = h.sched.schedule();
  EXPECT_EQ(b->status, RequestStatus::Preempted);
  h.sched.finish_request(a);
  out = h.sched.schedule();
  ASSERT_EQ(out.prefills.size(), 1u);
  EXPECT_EQ(out.prefills[0].req, b);
  EXPECT_EQ(out.prefills[0].num_tokens, 5);
  EXPECT_EQ(b->kv_blocks.size(), 2u);
}

TEST(KvScheduler, LoneRequestTooLargeForPoolIsAnError) {
  Harness h(4, 100);  // 3 usable: a state block + 2 KV blocks = 8 tokens
  RequestState* a = h.add(8);
  auto out = h.sched.schedule();
  ASSERT_EQ(out.prefills.size(), 1u);
  Harness::apply(out);  // 9 tokens: needs a third KV block
  EXPECT_THROW(h.sched.schedule(), Error);
  (void)a;
}

TEST(KvScheduler, NoKvWithoutBlockSize) {
  BlockPool pool(3);
  StateCache cache(1, StateShape{0, 16}, 3);
  Scheduler s(SchedulerConfig{}, pool, cache);  // Mamba: one state block per request, nothing else
  Request r;
  r.request_id = "x";
  r.prompt_token_ids.assign(1000, 1);
  RequestState st(std::move(r));
  s.add_request(&st);
  auto out = s.schedule();
  ASSERT_EQ(out.prefills.size(), 1u);
  EXPECT_TRUE(st.kv_blocks.empty());
  EXPECT_EQ(pool.num_free(), 1);
}

}  // namespace
}  // namespace ssmserve
