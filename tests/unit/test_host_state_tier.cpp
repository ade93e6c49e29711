// The host tier of cached states (--swap-space, issue 28) and the scheduler's state stores ("all" mode), against a
// fake model whose state after token position p is the number p: a cached state evicted from a small pool is
// swapped out to a host slot, a later request with that prefix gets it back into its running block (swap-in) and
// continues from the right position; pinned slots are never reused; "all" mode stores every boundary inside a chunk.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>

#include "cache/host_state_tier.h"
#include "core/error.h"
#include "engine/scheduler.h"

namespace ssmserve {
namespace {

constexpr int kBlock = 4;  // tokens per cached state

BlockHash h(uint64_t v) { return {v, v * 7 + 1}; }

TEST(HostStateTier, EvictsLeastRecentlyUsedUnpinnedSlots) {
  constexpr CachedKind S = CachedKind::State;
  HostStateTier t(2);
  const int a = t.insert(S, h(1)), b = t.insert(S, h(2));
  EXPECT_NE(a, b);
  EXPECT_EQ(t.lookup(S, h(1)), a);
  t.touch(a);                  // b is now the least recently used
  EXPECT_EQ(t.insert(S, h(3)), b);
  EXPECT_EQ(t.lookup(S, h(2)), -1);
  t.pin(a);
  t.pin(b);
  EXPECT_EQ(t.insert(S, h(4)), -1);  // every slot is read by a swap-in
  t.unpin(a);
  EXPECT_EQ(t.insert(S, h(4)), a);
  EXPECT_THROW(t.unpin(a), Error);
  EXPECT_THROW(t.insert(S, h(4)), Error);  // held already
  EXPECT_EQ(t.num_used(), 2);
}

// A state and the KV page ending at the same token share a hash: they are kept apart.
TEST(HostStateTier, StatesAndKvPagesAreKeyedApart) {
  HostStateTier t(3);
  const int s = t.insert(CachedKind::State, h(5));
  EXPECT_EQ(t.lookup(CachedKind::Kv, h(5)), -1);
  const int k = t.insert(CachedKind::Kv, h(5));
  EXPECT_NE(s, k);
  EXPECT_EQ(t.lookup(CachedKind::State, h(5)), s);
  EXPECT_EQ(t.lookup(CachedKind::Kv, h(5)), k);
}

/// A scheduler over a pool of `blocks` blocks and a fake model: "running" a step sets each scheduled request's state
/// to its new position (and each state store to its boundary) and, with KV blocks of `kv` tokens (a fake hybrid),
/// each KV block it writes to the number of tokens written up to its end; the host tier is a map slot -> page value.
/// A swapped-out page is poisoned (-1): only a swap-in gives it back.
struct Harness {
  BlockPool pool;
  StateCache cache;
  Scheduler sched;
  int kv = 0;
  std::map<int, float> host;
  int swap_outs = 0, swap_ins = 0;
  std::vector<std::unique_ptr<RequestState>> reqs;

  Harness(int blocks, MambaCacheMode mode, int budget, int kv_block = 0)
      : pool(blocks),
        cache(1, StateShape{0, 16}, blocks),
        sched(config(budget), pool, cache, kv_block, prefix(mode, kv_block)),
        kv(kv_block) {}
  static SchedulerConfig config(int budget) {
    SchedulerConfig c;
    c.max_num_batched_tokens = budget;
    c.max_num_seqs = 1;
    return c;
  }
  static PrefixCacheConfig prefix(MambaCacheMode mode, int kv_block) {
    PrefixCacheConfig p;
    p.mode = mode, p.block_size = kBlock, p.hash_granularity = kv_block > 0 ? kv_block : kBlock, p.salt = 3;
    return p;
  }
  float& state(int block) { return cache.ssm_state(0).block<float>(block)[0]; }
  void enable_host(int slots, bool swap_kv_pages = true) {
    StateSwapper sw;
    sw.swap_kv_pages = swap_kv_pages;  // (hybrids' KV pages too)
    sw.swap_out = [this](std::span<const BlockCopy> c) {
      for (const BlockCopy& x : c) host[x.dst] = state(x.src), state(x.src) = -1, ++swap_outs;
    };
    sw.swap_in = [this](std::span<const BlockCopy> c) {
      for (const BlockCopy& x : c) state(x.dst) = host.at(x.src), ++swap_ins;
    };
    sched.enable_host_tier(slots, std::move(sw));
  }
  /// Runs one request with prompt tokens base + [0, len) to completion (one output token); returns its cached
  /// tokens and checks that every step starts from the state of its position.
  int run(int base, int len) {
    Request r;
    r.request_id = std::to_string(reqs.size());
    for (int i = 0; i < len; ++i) r.prompt_token_ids.push_back(base + i);
    r.params.max_tokens = 1;
    reqs.push_back(std::make_unique<RequestState>(std::move(r)));
    RequestState* q = reqs.back().get();
    sched.add_request(q);
    while (q->status != RequestStatus::Finished) {
      SchedulerOutput out = sched.schedule();
      for (const BlockCopy& c : out.state_copies) cache.copy_block(c.src, c.dst);
      std::vector<int> toks;
      for (const ScheduledRequest& s : out.prefills) {
        RequestState* x = s.req;
        // The state holds exactly the tokens before this step (a hit restored it: copy or swap-in).
        if (x->num_computed_tokens > 0) EXPECT_EQ(state(x->state_block), static_cast<float>(x->num_computed_tokens)) << "request " << x->request.request_id;
        // Every full KV block before the step holds its tokens (a hit shared it or swapped it in).
        for (int j = 0; kv > 0 && j < x->num_computed_tokens / kv; ++j)
          EXPECT_EQ(state(x->kv_blocks.at(static_cast<size_t>(j))), static_cast<float>((j + 1) * kv)) << "KV block " << j;
        for (const StateStore& st : s.state_stores) state(st.block) = static_cast<float>(x->num_computed_tokens + st.offset);
        x->num_computed_tokens += s.num_tokens;
        state(x->state_block) = static_cast<float>(x->num_computed_tokens);
        for (int j = (x->num_computed_tokens - s.num_tokens) / std::max(1, kv); kv > 0 && j * kv < x->num_computed_tokens; ++j)
          state(x->kv_blocks.at(static_cast<size_t>(j))) = static_cast<float>(std::min((j + 1) * kv, x->num_computed_tokens));
        toks.push_back(s.num_tokens);
        if (x->num_computed_tokens == x->num_tokens()) x->output_token_ids.push_back(1), x->status = RequestStatus::Finished;
      }
      EXPECT_TRUE(out.decodes.empty());
      sched.finish_step(out, toks, [&](std::span<const BlockCopy> c) {
        for (const BlockCopy& x : c) cache.copy_block(x.src, x.dst);
      });
      if (q->status == RequestStatus::Finished) sched.finish_request(q);
    }
    return q->num_cached_tokens;
  }
};

TEST(HostStateTierScheduler, EvictedStatesComeBackFromHostSlots) {
  // 4 usable blocks: a running one and three cached; six prompts of distinct text evict the first ones' states.
  Harness t(5, MambaCacheMode::Align, 64);
  t.enable_host(64);
  EXPECT_EQ(t.run(1000, 9), 0);  // caches positions 4 and 8
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.run(2000 + 100 * i, 9), 0);
  EXPECT_GT(t.swap_outs, 0);
  EXPECT_EQ(t.run(1000, 11), 8);  // from the host tier: state 8 copied back, continues from there
  EXPECT_EQ(t.swap_ins, 1);
  EXPECT_EQ(t.sched.host_tier_stats().swap_ins, 1);
  EXPECT_EQ(t.run(1000, 11), 8);  // now cached in the pool again (or still on the host): a hit either way
}

TEST(HostStateTierScheduler, WithoutTheTierEvictedStatesAreGone) {
  Harness t(5, MambaCacheMode::Align, 64);
  EXPECT_EQ(t.run(1000, 9), 0);
  for (int i = 0; i < 6; ++i) t.run(2000 + 100 * i, 9);
  EXPECT_EQ(t.run(1000, 11), 0);
}

// A fake hybrid (KV blocks of 2 tokens, states every 4): a second prompt evicts the first prompt's cached state and
// its first KV pages (least recently used first: the state, cached before the request finished, then KV blocks 0, 1,
// 2) to host slots; the first prompt again hits 8 tokens with KV blocks 0-2 swapped into fresh blocks and block 3
// shared from the pool, and sees every page it had. finish_step registers the swapped-in KV blocks, so a third run
// shares all four from the pool (its state comes from the host again: align mode caches none at 9 tokens).
TEST(HostStateTierScheduler, HybridKvPagesComeBackFromHostSlots) {
  // 8 usable blocks: the first request holds a state block and 5 KV blocks, and caches a state.
  Harness t(9, MambaCacheMode::Align, 64, 2);
  t.enable_host(64);
  EXPECT_EQ(t.run(1000, 9), 0);  // caches the state at 8 and KV blocks 0-3
  EXPECT_EQ(t.run(2000, 9), 0);
  HostTierStats st = t.sched.host_tier_stats();
  EXPECT_EQ(st.swap_outs, 1);
  EXPECT_EQ(st.kv_swap_outs, 3);
  EXPECT_EQ(t.run(1000, 9), 8);
  st = t.sched.host_tier_stats();
  EXPECT_EQ(st.swap_ins, 1);
  EXPECT_EQ(st.kv_swap_ins, 3);
  EXPECT_EQ(t.swap_ins, 4);
  EXPECT_EQ(t.run(1000, 9), 8);
  st = t.sched.host_tier_stats();
  EXPECT_EQ(st.swap_ins, 2);
  EXPECT_EQ(st.kv_swap_ins, 3);

  Harness off(9, MambaCacheMode::Align, 64, 2);  // without the tier the hit is gone with the KV pages
  EXPECT_EQ(off.run(1000, 9), 0);
  EXPECT_EQ(off.run(2000, 9), 0);
  EXPECT_EQ(off.run(1000, 9), 0);

  Harness states_only(9, MambaCacheMode::Align, 64, 2);  // swap_kv_pages off: states only
  states_only.enable_host(64, false);
  EXPECT_EQ(states_only.run(1000, 9), 0);
  EXPECT_EQ(states_only.run(2000, 9), 0);
  EXPECT_EQ(states_only.run(1000, 9), 0);  // the state is on the host but its KV pages are gone: no hit
  st = states_only.sched.host_tier_stats();
  EXPECT_GE(st.swap_outs, 1);
  EXPECT_EQ(st.kv_swap_outs, 0);
  EXPECT_EQ(st.kv_swap_ins, 0);
}

TEST(AllModeScheduler, StoresEveryBoundaryInsideAChunk) {
  Harness t(16, MambaCacheMode::All, 64);
  EXPECT_EQ(t.run(1000, 14), 0);  // one step: stores at 4 and 8, 12 likewise (inside), none at 14
  for (int len : {5, 9, 13}) EXPECT_EQ(t.run(1000, len), (len - 1) / kBlock * kBlock) << len;
  Harness a(16, MambaCacheMode::Align, 64);
  EXPECT_EQ(a.run(1000, 14), 0);  // align: the step ends at 12, which alone is cached
  EXPECT_EQ(a.run(1000, 5), 0);
}

}  // namespace
}  // namespace ssmserve
