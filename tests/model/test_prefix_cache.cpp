// Prefix caching of states (issue 28), for every registered architecture (a new one without a case here fails
// EveryArchitectureHasACase): a request served from the cache gives the same greedy ids and the same logprobs, bit
// for bit on the CPU, as the same request with --no-enable-prefix-caching run alone in one prefill step. Scenarios:
// shared prefixes ending just before, exactly on and just after block boundaries; multi-turn conversations whose
// later turns extend, shorten or edit earlier text; requests sharing a prefix in the same step (the same-step hazard:
// a state is cached only after the step that computes it); a pool of a few blocks (eviction); preemption; random
// token budgets. Hits must happen (num_cached_tokens, the prefix-cache counters): a cache that never hits fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "engine/llm_engine.h"
#include "architecture_coverage.h"
#include "test_util.h"

namespace ssmserve {
namespace {

// A model under test: a checkpoint of the shared models folder, or a dummy-weight config of tests/data/tiny-hybrids.
// block_size: the --mamba-block-size the test uses (0: the model's default), small so short prompts cross several.
struct CacheCase {
  std::string name;
  bool dummy = false;
  int block_size = 0;
};
std::ostream& operator<<(std::ostream& os, const CacheCase& c) { return os << c.name; }

const std::vector<CacheCase>& cases() {
  static const std::vector<CacheCase> v = {
      {"tiny-mamba", false, 32},          {"tiny-mamba2", false, 64},         {"tiny-minimax", false, 0},
      {"tiny-granitemoehybrid", false, 0}, {"tiny-nemotron_h", false, 0},      {"tiny-bamba", true, 0},
      {"tiny-jamba", true, 0},             {"tiny-falcon_h1", true, 0},        {"tiny-qwen3_5_moe", false, 0},
      {"tiny-qwen3_5", true, 0},           {"tiny-qwen3_next", true, 0},
  };
  return v;
}

std::filesystem::path case_dir(const CacheCase& c) {
  return c.dummy ? testing::source_dir() / "tests/data/tiny-hybrids" / c.name : testing::model_dir(c.name);
}

EngineConfig case_config(const CacheCase& c) {
  EngineConfig cfg;
  cfg.model = case_dir(c);
  if (c.dummy) cfg.load_format = LoadFormat::Dummy;
  cfg.num_threads = 2;
  return cfg;
}

struct Outcome {
  std::vector<int> ids;
  std::vector<float> logprobs;
  int num_cached_tokens = 0;
};

SamplingParams greedy(int max_tokens) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  sp.logprobs = 0;
  return sp;
}

Outcome outcome_of(const RequestOutput& o) {
  Outcome r{o.outputs[0].token_ids, {}, o.num_cached_tokens};
  for (const auto& step : o.outputs[0].logprobs) r.logprobs.push_back(step.at(0).logprob);
  return r;
}

class PrefixCaching : public ::testing::TestWithParam<CacheCase> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(case_dir(GetParam()) / "config.json")) GTEST_SKIP() << "no model " << GetParam().name;
    EngineConfig ref = case_config(GetParam());
    ref.enable_prefix_caching = false;
    ref.scheduler.max_num_batched_tokens = 8192;  // every prompt in one prefill step
    ref.num_state_blocks = 64;
    reference_ = std::make_unique<LLMEngine>(ref);
    EXPECT_EQ(reference_->prefix_cache_config().mode, MambaCacheMode::None);
  }

  /// The caching engine under test: budget, pool size (0: default) and max_num_seqs.
  std::unique_ptr<LLMEngine> cached_engine(int budget, int blocks = 0, int max_seqs = 256, const std::string& mode = "all") const {
    EngineConfig cfg = case_config(GetParam());
    cfg.mamba_cache_mode = mode;
    cfg.mamba_block_size = GetParam().block_size;
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.scheduler.max_num_seqs = max_seqs;
    cfg.num_state_blocks = blocks;
    auto e = std::make_unique<LLMEngine>(cfg);
    EXPECT_EQ(e->prefix_cache_config().mode, mode == "all" ? MambaCacheMode::All : MambaCacheMode::Align);  // the CPU does "all"
    return e;
  }

  /// The block size the caching engines use (the case's, else the model's default).
  int block_size() const {
    if (GetParam().block_size > 0) return GetParam().block_size;
    if (!bs_) bs_ = cached_engine(8192, 8)->prefix_cache_config().block_size;
    return bs_;
  }

  /// The request run alone without prefix caching (memoized).
  Outcome reference(const std::vector<int>& prompt, int max_tokens) {
    const auto key = std::make_pair(prompt, max_tokens);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    Request r;
    r.request_id = "ref";
    r.prompt_token_ids = prompt;
    r.params = greedy(max_tokens);
    reference_->add_request(r);
    Outcome o;
    while (reference_->has_unfinished_requests())
      for (const auto& out : reference_->step())
        if (out.finished) o = outcome_of(out);
    return memo_[key] = o;
  }

  /// Runs `prompts` through `e`, request i added before step arrive[i] (all at once when empty), optionally
  /// preempting the newest running request before step `preempt_at`; returns the outcomes in input order.
  static std::vector<Outcome> run(LLMEngine& e, const std::vector<std::vector<int>>& prompts, int max_tokens,
                                  std::vector<int> arrive = {}, int preempt_at = -1) {
    static int counter = 0;
    if (arrive.empty()) arrive.assign(prompts.size(), 0);
    std::map<std::string, size_t> index;
    std::vector<Outcome> out(prompts.size());
    size_t added = 0, done = 0;
    for (int step = 0; done < prompts.size(); ++step) {
      for (size_t i = 0; i < prompts.size(); ++i)
        if (arrive[i] == step) {
          Request r;
          r.request_id = "p" + std::to_string(counter++);
          r.prompt_token_ids = prompts[i];
          r.params = greedy(max_tokens);
          index[r.request_id] = i;
          e.add_request(r);
          ++added;
        }
      if (step == preempt_at) e.preempt_newest_request();
      if (!e.has_unfinished_requests()) continue;
      for (const auto& o : e.step())
        if (o.finished) out[index.at(o.request_id)] = outcome_of(o), ++done;
      if (step > 100000) ADD_FAILURE() << "runaway";
    }
    return out;
  }

  void expect_matches_reference(const std::vector<std::vector<int>>& prompts, const std::vector<Outcome>& got, int max_tokens,
                                const std::string& what) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Outcome want = reference(prompts[i], max_tokens);
      ASSERT_EQ(got[i].ids, want.ids) << what << ": prompt " << i << " (" << prompts[i].size() << " tokens, "
                                      << got[i].num_cached_tokens << " cached)";
      ASSERT_EQ(got[i].logprobs.size(), want.logprobs.size());
      for (size_t k = 0; k < want.logprobs.size(); ++k)
        ASSERT_EQ(got[i].logprobs[k], want.logprobs[k]) << what << ": prompt " << i << " token " << k << " ("
                                                        << prompts[i].size() << " tokens, " << got[i].num_cached_tokens
                                                        << " cached)";
    }
  }

  std::vector<int> random_tokens(int n) {
    const int V = reference_->model_config().vocab_size;
    std::vector<int> v(static_cast<size_t>(std::max(0, n)));
    for (int& t : v) t = 2 + static_cast<int>(rng_() % static_cast<uint32_t>(std::min(V - 2, 5000)));
    return v;
  }
  static std::vector<int> cat(std::vector<int> a, const std::vector<int>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  std::unique_ptr<LLMEngine> reference_;
  std::map<std::pair<std::vector<int>, int>, Outcome> memo_;
  std::mt19937 rng_{28};
  mutable int bs_ = 0;
};

TEST(PrefixCacheCoverage, EveryArchitectureHasACase) {
  std::vector<std::filesystem::path> dirs;
  for (const CacheCase& c : cases()) dirs.push_back(case_dir(c));
  for (const std::string& a : testing::uncovered_architectures(dirs))
    ADD_FAILURE() << a << " has no prefix-caching case (add its small checkpoint or dummy config to cases())";
}

// Shared prefixes ending just before, on and just after the first three block boundaries, one request at a time
// after a request that computed the whole prefix, then the same prompts again (every one now a hit), at random budgets.
TEST_P(PrefixCaching, SharedPrefixesAroundBlockBoundariesEqualUncached) {
  const int bs = block_size();
  const std::vector<int> base = random_tokens(3 * bs + 20);
  std::vector<std::vector<int>> prompts = {base};
  for (int k = 1; k <= 3; ++k)
    for (int d : {-1, 0, 1, 2}) {
      const int len = std::min<int>(k * bs + d, static_cast<int>(base.size()));
      prompts.push_back(cat(std::vector<int>(base.begin(), base.begin() + len), random_tokens(static_cast<int>(rng_() % 5))));
    }
  for (int budget : {bs, bs + 13, 8192}) {
    auto e = cached_engine(budget);
    std::vector<Outcome> got;
    for (const auto& p : prompts) got.push_back(run(*e, {p}, 6)[0]);
    expect_matches_reference(prompts, got, 6, "first pass, budget " + std::to_string(budget));
    std::vector<Outcome> again;
    for (const auto& p : prompts) again.push_back(run(*e, {p}, 6)[0]);
    expect_matches_reference(prompts, again, 6, "second pass, budget " + std::to_string(budget));
    // Every prompt of at least bs + 1 tokens had its first block cached by the first pass.
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int len = static_cast<int>(prompts[i].size());
      EXPECT_EQ(again[i].num_cached_tokens % bs, 0);
      EXPECT_LE(again[i].num_cached_tokens, len - 1);
      if (len >= bs + 1) EXPECT_GE(again[i].num_cached_tokens, bs) << "prompt " << i << " of " << len << " tokens";
    }
    const PrefixCacheStats st = e->prefix_cache_stats();
    EXPECT_GT(st.hits, 0);
    EXPECT_EQ(st.requests, static_cast<int64_t>(2 * prompts.size()));
  }
}

// Multi-turn chat: each turn resends the history (prompt + the model's answer) plus new text; later turns that shorten
// or edit the history hit only up to where they agree with it.
TEST_P(PrefixCaching, MultiTurnConversationsEqualUncached) {
  const int bs = block_size();
  auto e = cached_engine(std::max(bs, 61 * ((bs + 60) / 61)));
  for (int conv = 0; conv < 2; ++conv) {
    std::vector<int> history = random_tokens(bs + 5 + static_cast<int>(rng_() % bs));
    for (int turn = 0; turn < 3; ++turn) {
      const Outcome o = run(*e, {history}, 8)[0];
      expect_matches_reference({history}, {o}, 8, "conversation " + std::to_string(conv) + " turn " + std::to_string(turn));
      if (turn > 0) EXPECT_GE(o.num_cached_tokens, bs) << "turn " << turn << " resent " << history.size() << " tokens";
      history = cat(cat(history, o.ids), random_tokens(3 + static_cast<int>(rng_() % (bs / 2 + 1))));
    }
    // Shortened, edited in the second block, edited in the first block.
    std::vector<int> shorter(history.begin(), history.begin() + bs + 3), edited = history, early = history;
    edited[static_cast<size_t>(bs + bs / 2)] ^= 1;
    early[static_cast<size_t>(bs / 2)] ^= 1;
    const auto got = run(*e, {shorter, edited, early}, 8, {0, 40, 80});
    expect_matches_reference({shorter, edited, early}, got, 8, "edited conversation " + std::to_string(conv));
    EXPECT_EQ(got[0].num_cached_tokens, bs);
    EXPECT_LE(got[1].num_cached_tokens, bs + bs / 2);
    EXPECT_EQ(got[2].num_cached_tokens, 0);
  }
}

// Requests sharing a prefix admitted in one step (none can use a state another computes in that step), requests
// arriving while others run, a pool of a few blocks (cached states evicted, running requests never fail), and
// preemption (a preempted request may resume from its own cached states).
TEST_P(PrefixCaching, ConcurrentEvictionAndPreemptionEqualUncached) {
  const int bs = block_size();
  const std::vector<int> shared = random_tokens(2 * bs + 7);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 6; ++i)
    prompts.push_back(cat(std::vector<int>(shared.begin(), shared.begin() + bs + 1 + static_cast<int>(rng_() % (bs + 6))),
                          random_tokens(1 + static_cast<int>(rng_() % 9))));
  {  // all in the first step: nothing to hit yet
    auto e = cached_engine(8192);
    const auto got = run(*e, prompts, 5);
    expect_matches_reference(prompts, got, 5, "same step");
    for (const Outcome& o : got) EXPECT_EQ(o.num_cached_tokens, 0);
    const auto again = run(*e, prompts, 5, {0, 1, 2, 3, 4, 5}, 3);
    expect_matches_reference(prompts, again, 5, "staggered, preempted");
    EXPECT_GT(e->prefix_cache_stats().hits, 0);
  }
  {  // a pool of a few blocks: 2 running requests at a time and room for only a few cached blocks
    const int kv = reference_->kv_block_size();
    const int per_request = 1 + (kv > 0 ? (3 * bs + 20) / kv + 1 : 0);
    auto e = cached_engine(bs + 13, 1 + 2 * per_request + 2, 2);
    std::vector<int> arrive;
    for (size_t i = 0; i < prompts.size(); ++i) arrive.push_back(static_cast<int>(3 * i));
    for (int round = 0; round < 2; ++round) {
      const auto got = run(*e, prompts, 5, arrive, 7);
      expect_matches_reference(prompts, got, 5, "small pool, round " + std::to_string(round));
    }
  }
}

// "all" mode stores the states at the block boundaries inside a prefill chunk: a prompt prefilled in one step caches
// every boundary it crosses, so prompts sharing only its first blocks hit there (align caches only the boundary the
// step ends on); both modes give the bits of the uncached run, also for the shared-prefix prompts admitted in one step
// with the long one (same-step: no hit) and at a budget off the block grid.
TEST_P(PrefixCaching, AllModeStoresBoundariesInsideAChunk) {
  const int bs = block_size();
  const std::vector<int> base = random_tokens(3 * bs + 20);
  std::vector<std::vector<int>> shorter;
  for (int k = 1; k <= 3; ++k)
    shorter.push_back(cat(std::vector<int>(base.begin(), base.begin() + k * bs), random_tokens(2 + k)));
  for (const std::string mode : {"all", "align"}) {
    auto e = cached_engine(8192, 0, 256, mode);
    const Outcome first = run(*e, {base}, 4)[0];
    expect_matches_reference({base}, {first}, 4, mode + ": the long prompt");
    const auto got = run(*e, shorter, 4, {0, 30, 60});
    expect_matches_reference(shorter, got, 4, mode + ": prompts sharing 1, 2, 3 blocks");
    for (int k = 1; k <= 3; ++k) {
      // align: the long prompt cached only 3 bs (where its step ended); each shorter prompt its own last boundary.
      const int want = mode == "all" || k == 3 ? k * bs : (k - 1) * bs;
      EXPECT_EQ(got[static_cast<size_t>(k - 1)].num_cached_tokens, want) << mode << ": prompt sharing " << k << " blocks";
    }
  }
  auto e = cached_engine(2 * bs + 13);  // chunks cross boundaries anywhere, on the model's chunk grid
  const std::vector<int> other = random_tokens(3 * bs + 9);
  const std::vector<std::vector<int>> pair = {other, cat(std::vector<int>(other.begin(), other.begin() + 2 * bs), random_tokens(5))};
  expect_matches_reference(pair, run(*e, pair, 4, {0, 1}), 4, "budget 2 bs + 13");
  const Outcome again = run(*e, {cat(std::vector<int>(other.begin(), other.begin() + 2 * bs + 1), random_tokens(3))}, 4)[0];
  EXPECT_EQ(again.num_cached_tokens, 2 * bs);
}

// What the cache relies on, without it: a prompt cut into steps on block boundaries (a last piece of one token
// included) gives the bits of the uncut prompt, for every architecture; and a budget off the chunk grid (bs + 13) is
// cut on the grid (Scheduler chunk_alignment), so it does too.
TEST_P(PrefixCaching, CutsOnBlockBoundariesEqualUncut) {
  const int bs = block_size();
  for (int extra : {1, 5}) {
    const std::vector<int> p = random_tokens(2 * bs + extra);
    for (int budget : {bs, 2 * bs, bs + 13}) {
      EngineConfig cfg = case_config(GetParam());
      cfg.enable_prefix_caching = false;
      cfg.scheduler.max_num_batched_tokens = budget;
      cfg.num_state_blocks = 64;
      LLMEngine e(cfg);
      expect_matches_reference({p}, run(e, {p}, 4), 4, "cut every " + std::to_string(budget) + " tokens");
    }
  }
}

// A bf16 state (--mamba-ssm-cache-dtype bfloat16, or the conv window's --mamba-cache-dtype bfloat16): "all" mode's
// prefill pieces carry the running state in fp32 between block boundaries (run_prefill_pieces) and round only what
// they store, so a request without a hit (fresh engine, a prompt over 2 blocks prefilled in one step) gives the bits of
// the same request with --no-enable-prefix-caching; and hits still happen (a hit resumes from the stored, rounded
// state, so it is not compared bit for bit).
TEST_P(PrefixCaching, LowPrecisionStatesWithoutAHitEqualUncached) {
  const int bs = block_size();
  const std::vector<int> p = random_tokens(2 * bs + 17);
  const std::vector<std::pair<std::string, std::string>> dtypes = {{"auto", "bfloat16"}, {"bfloat16", "float32"}};  // conv, ssm
  for (const auto& [conv_dtype, ssm_dtype] : dtypes) {
    const std::string what = "conv " + conv_dtype + ", ssm " + ssm_dtype;
    EngineConfig ref = case_config(GetParam());
    ref.enable_prefix_caching = false;
    ref.mamba_cache_dtype = conv_dtype;
    ref.mamba_ssm_cache_dtype = ssm_dtype;
    ref.scheduler.max_num_batched_tokens = 8192;
    ref.num_state_blocks = 64;
    LLMEngine uncached(ref);
    const Outcome want = run(uncached, {p}, 4)[0];
    {
      const int budget = 8192;  // one step: a cut between steps rounds the running state with or without caching
      EngineConfig cfg = case_config(GetParam());
      cfg.mamba_cache_mode = "all";
      cfg.mamba_block_size = GetParam().block_size;
      cfg.mamba_cache_dtype = conv_dtype;
      cfg.mamba_ssm_cache_dtype = ssm_dtype;
      cfg.scheduler.max_num_batched_tokens = budget;
      LLMEngine e(cfg);
      ASSERT_EQ(e.prefix_cache_config().mode, MambaCacheMode::All);
      const Outcome got = run(e, {p}, 4)[0];
      const std::string at = what + ", budget " + std::to_string(budget);
      EXPECT_EQ(got.num_cached_tokens, 0) << at;
      ASSERT_EQ(got.ids, want.ids) << at;
      ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << at;
      for (size_t k = 0; k < want.logprobs.size(); ++k) EXPECT_EQ(got.logprobs[k], want.logprobs[k]) << at << ": token " << k;
      // A prompt sharing the first two blocks hits them.
      const std::vector<int> q = cat(std::vector<int>(p.begin(), p.begin() + 2 * bs), random_tokens(5));
      EXPECT_EQ(run(e, {q}, 2)[0].num_cached_tokens, 2 * bs) << at;
      EXPECT_GT(e.prefix_cache_stats().hits, 0) << at;
    }
  }
}

// vLLM's cache_salt: blocks are shared only among requests with the same salt (an unsalted request shares with
// unsalted ones only); the outputs stay those of the uncached reference.
TEST_P(PrefixCaching, CacheSaltSeparatesTenants) {
  const int bs = block_size();
  const std::vector<int> p = random_tokens(2 * bs + 7);
  auto e = cached_engine(8192);
  const auto once = [&](const std::string& salt, const std::string& id) {
    Request r;
    r.request_id = id;
    r.prompt_token_ids = p;
    r.params = greedy(4);
    r.cache_salt = salt;
    e->add_request(r);
    Outcome o;
    while (e->has_unfinished_requests())
      for (const auto& out : e->step())
        if (out.finished) o = outcome_of(out);
    return o;
  };
  const Outcome want = reference(p, 4);
  struct Turn { std::string salt; bool hit; };
  const std::vector<Turn> turns = {{"", false}, {"", true}, {"tenant-a", false}, {"tenant-a", true}, {"tenant-b", false},
                                   {"", true}, {"tenant-b", true}, {"tenant-a", true}};
  for (size_t i = 0; i < turns.size(); ++i) {
    const Outcome got = once(turns[i].salt, "salt-" + std::to_string(i));
    const std::string at = "turn " + std::to_string(i) + " salt '" + turns[i].salt + "'";
    EXPECT_EQ(got.num_cached_tokens, turns[i].hit ? 2 * bs : 0) << at;
    EXPECT_EQ(got.ids, want.ids) << at;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PrefixCaching, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<CacheCase>& i) {
                           std::string s = i.param.name.substr(5);
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace ssmserve
