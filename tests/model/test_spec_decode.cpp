// Speculative decoding with one recurrent state per draft position (issue 29), for every registered architecture (a
// new one without a case here fails EveryArchitectureHasACase): greedy output with speculation equals greedy output
// without it, ids and logprobs bit for bit on the CPU, under drafters that are always right, always wrong, right for a
// random number of positions per request and step, and the real n-gram proposer; with requests joining mid-run (one
// with a one-token prompt tail), random token budgets, preemption and prefix-cache hits. Seeded sampling gives the same
// tokens with and without speculation, and the first token sampled after a draft follows the target distribution
// (chi-square over seeds: a rule that accepts drafts unchecked fails it). The acceptance counters must match what the
// drafter did (an engine that never verifies a draft fails). With multi-step decode (num_scheduler_steps), steps with
// verify rows run one model step and steps without drafts burst, the output still the plain one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "engine/llm_engine.h"
#include "engine/spec_decode.h"
#include "architecture_coverage.h"
#include "scripted_proposer.h"
#include "test_util.h"

namespace ssmserve {
namespace {
using testing::ScriptedProposer;

struct SpecCase {
  std::string name;
  bool dummy = false;
};
std::ostream& operator<<(std::ostream& os, const SpecCase& c) { return os << c.name; }

const std::vector<SpecCase>& cases() {
  static const std::vector<SpecCase> v = {
      {"tiny-mamba", false},        {"tiny-mamba2", false},     {"tiny-minimax", false}, {"tiny-granitemoehybrid", false},
      {"tiny-nemotron_h", false},   {"tiny-bamba", true},       {"tiny-jamba", true},    {"tiny-falcon_h1", true},
      {"tiny-qwen3_5_moe", false},  {"tiny-qwen3_5", true},     {"tiny-qwen3_next", true},
  };
  return v;
}

std::filesystem::path case_dir(const SpecCase& c) {
  return c.dummy ? testing::source_dir() / "tests/data/tiny-hybrids" / c.name : testing::model_dir(c.name);
}

constexpr int kK = 3;  // num_speculative_tokens

EngineConfig case_config(const SpecCase& c) {
  EngineConfig cfg;
  cfg.model = case_dir(c);
  if (c.dummy) cfg.load_format = LoadFormat::Dummy;
  cfg.num_threads = 2;
  return cfg;
}

/// adaptive = false: every draft the proposer gives is verified (the suites below script how many are right).
std::string spec_json(int k, bool adaptive = false) {
  return "{\"method\": \"ngram\", \"num_speculative_tokens\": " + std::to_string(k) +
         ", \"prompt_lookup_min\": 1, \"prompt_lookup_max\": 3, \"adaptive_draft_length\": " +
         (adaptive ? "true}" : "false}");
}

struct Outcome {
  std::vector<int> ids;
  std::vector<float> logprobs;
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
  Outcome r{o.outputs[0].token_ids, {}};
  for (const auto& step : o.outputs[0].logprobs) r.logprobs.push_back(step.at(0).logprob);
  return r;
}

/// Steps of a run by kind: with verify rows, multi-step bursts (LLMEngine::last_step_stats().num_model_steps > 1),
/// and both at once (never: a step with verify rows runs one model step).
struct StepKinds {
  int verify = 0, burst = 0, verify_and_burst = 0;
};

/// Passes `inner`'s drafts on every third engine step only: on the other steps no request has drafts.
class EveryThirdStep final : public Proposer {
 public:
  explicit EveryThirdStep(std::unique_ptr<Proposer> inner) : inner_(std::move(inner)) {}
  void propose(std::span<RequestState* const> reqs, int k) override {
    if (calls_++ % 3 == 0) return inner_->propose(reqs, k);
    for (RequestState* r : reqs) r->draft_token_ids.clear();
  }
  void release(const std::string& request_id) override { inner_->release(request_id); }

 private:
  std::unique_ptr<Proposer> inner_;
  int calls_ = 0;
};

class SpecDecode : public ::testing::TestWithParam<SpecCase> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(case_dir(GetParam()) / "config.json")) GTEST_SKIP() << "no model " << GetParam().name;
    EngineConfig ref = case_config(GetParam());
    ref.enable_prefix_caching = false;
    ref.scheduler.max_num_batched_tokens = 8192;  // every prompt in one prefill step
    ref.num_state_blocks = 16;
    reference_ = std::make_unique<LLMEngine>(ref);
    vocab_ = reference_->model_config().vocab_size;
    // Chunked prefill forms (SSD, lightning, the delta rule) are bit-exact only for prefills cut on their chunk grid:
    // those models get budgets that prefill every prompt here in one step (cut budgets are tested on the others).
    chunked_ = reference_->prefix_cache_config().chunk_alignment > 1;
  }

  /// A speculative engine; a small pool (allocating the default one dominates these tiny runs).
  std::unique_ptr<LLMEngine> spec_engine(int budget, int blocks = 64, bool prefix_caching = false, int k = kK,
                                         bool adaptive = false, int scheduler_steps = 1) const {
    EngineConfig cfg = case_config(GetParam());
    cfg.num_scheduler_steps = scheduler_steps;
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.num_state_blocks = blocks;
    cfg.enable_prefix_caching = prefix_caching;
    cfg.speculative_config = spec_json(k, adaptive);
    auto e = std::make_unique<LLMEngine>(cfg);
    EXPECT_EQ(e->speculative_config().num_speculative_tokens, k);
    return e;
  }

  /// The request run alone without speculation (memoized); records its ids as the drafters' answer key.
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
    answers_[prompt] = o.ids;
    return memo_[key] = o;
  }

  /// Runs the prompts through `e`, request i added before step arrive[i] (all at once when empty), preempting the
  /// newest running request before each step in `preempt_at`; counts the kinds of steps into *kinds when given.
  static std::vector<Outcome> run(LLMEngine& e, const std::vector<std::vector<int>>& prompts, int max_tokens,
                                  std::vector<int> arrive = {}, std::set<int> preempt_at = {},
                                  StepKinds* kinds = nullptr) {
    static int counter = 0;
    if (arrive.empty()) arrive.assign(prompts.size(), 0);
    std::map<std::string, size_t> index;
    std::vector<Outcome> out(prompts.size());
    size_t done = 0;
    for (int step = 0; done < prompts.size(); ++step) {
      for (size_t i = 0; i < prompts.size(); ++i)
        if (arrive[i] == step) {
          Request r;
          r.request_id = "s" + std::to_string(counter++);
          r.prompt_token_ids = prompts[i];
          r.params = greedy(max_tokens);
          index[r.request_id] = i;
          e.add_request(r);
        }
      if (preempt_at.count(step)) e.preempt_newest_request();
      if (!e.has_unfinished_requests()) continue;
      const int64_t drafts_before = e.spec_decode_stats().num_drafts;
      for (const auto& o : e.step())
        if (o.finished) out[index.at(o.request_id)] = outcome_of(o), ++done;
      if (kinds) {
        const bool verify = e.spec_decode_stats().num_drafts > drafts_before;
        const bool burst = e.last_step_stats().num_model_steps > 1;
        kinds->verify += verify, kinds->burst += burst, kinds->verify_and_burst += verify && burst;
      }
      if (step > 100000) ADD_FAILURE() << "runaway";
    }
    return out;
  }

  void expect_matches_reference(const std::vector<std::vector<int>>& prompts, const std::vector<Outcome>& got, int max_tokens,
                                const std::string& what) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Outcome want = reference(prompts[i], max_tokens);
      ASSERT_EQ(got[i].ids, want.ids) << what << ": prompt " << i << " (" << prompts[i].size() << " tokens)";
      ASSERT_EQ(got[i].logprobs.size(), want.logprobs.size());
      for (size_t k = 0; k < want.logprobs.size(); ++k)
        ASSERT_EQ(got[i].logprobs[k], want.logprobs[k]) << what << ": prompt " << i << " token " << k;
    }
  }

  std::vector<int> random_tokens(int n) {
    std::vector<int> v(static_cast<size_t>(std::max(0, n)));
    for (int& t : v) t = 2 + static_cast<int>(rng_() % static_cast<uint32_t>(std::min(vocab_ - 2, 5000)));
    return v;
  }

  /// Prompts of several lengths (a few with a repeated phrase, so the n-gram proposer finds matches).
  std::vector<std::vector<int>> prompts(int n) {
    std::vector<std::vector<int>> v;
    for (int i = 0; i < n; ++i) {
      std::vector<int> p = random_tokens(3 + static_cast<int>(rng_() % 40));
      if (i % 2 == 0) {
        const std::vector<int> phrase = random_tokens(4);
        for (int r = 0; r < 3; ++r) p.insert(p.end(), phrase.begin(), phrase.end());
      }
      v.push_back(p);
    }
    return v;
  }

  std::unique_ptr<LLMEngine> reference_;
  std::map<std::pair<std::vector<int>, int>, Outcome> memo_;
  std::map<std::vector<int>, std::vector<int>> answers_;
  std::mt19937 rng_{29};
  int vocab_ = 0;
  bool chunked_ = false;
};

TEST(SpecDecodeCoverage, EveryArchitectureHasACase) {
  std::vector<std::filesystem::path> dirs;
  for (const SpecCase& c : cases()) dirs.push_back(case_dir(c));
  for (const std::string& a : testing::uncovered_architectures(dirs))
    ADD_FAILURE() << a << " has no speculative-decoding case (add its small checkpoint or dummy config to cases())";
}

// Always-right and always-wrong drafters: identical output; every draft accepted / none.
TEST_P(SpecDecode, AlwaysRightAndAlwaysWrongDraftersEqualPlain) {
  const auto ps = prompts(3);
  constexpr int kTokens = 10;
  for (const auto& p : ps) reference(p, kTokens);
  for (const bool right : {true, false}) {
    auto e = spec_engine(8192);
    e->set_proposer(std::make_unique<ScriptedProposer>(&answers_, vocab_, [&](const RequestState&, std::mt19937&) {
      return right ? kK : 0;
    }));
    const auto got = run(*e, ps, kTokens);
    expect_matches_reference(ps, got, kTokens, right ? "always right" : "always wrong");
    const SpecDecodeStats& st = e->spec_decode_stats();
    EXPECT_GT(st.num_drafts, 0);
    if (right) {
      EXPECT_EQ(st.num_accepted_tokens, st.num_draft_tokens);
      EXPECT_GT(st.mean_acceptance_length(), 3.0);  // 1 + k per row but the last ones
    } else {
      EXPECT_EQ(st.num_accepted_tokens, 0);
      EXPECT_EQ(st.num_draft_tokens, st.num_drafts);  // one (wrong) draft per row
    }
  }
}

// adaptive_draft_length: the output is the plain one whatever the drafts; always-right drafters keep every draft,
// always-wrong ones are backed off to a one-draft probe every few steps (far fewer verified drafts than rows).
TEST_P(SpecDecode, AdaptiveDraftLengthEqualsPlainAndBacksOffWrongDrafters) {
  const auto ps = prompts(3);
  constexpr int kTokens = 40;
  for (const auto& p : ps) reference(p, kTokens);
  for (const bool right : {true, false}) {
    auto e = spec_engine(8192, 64, false, kK, /*adaptive=*/true);
    e->set_proposer(std::make_unique<ScriptedProposer>(&answers_, vocab_, [&](const RequestState&, std::mt19937&) {
      return right ? kK : 0;
    }));
    const auto got = run(*e, ps, kTokens);
    expect_matches_reference(ps, got, kTokens, right ? "adaptive, always right" : "adaptive, always wrong");
    const SpecDecodeStats& st = e->spec_decode_stats();
    if (right) {
      EXPECT_EQ(st.num_accepted_tokens, st.num_draft_tokens);
      EXPECT_GT(st.mean_acceptance_length(), 3.0);  // 1 + k per row but the last ones: never backed off
    } else {
      EXPECT_EQ(st.num_accepted_tokens, 0);
      // Fixed k verifies a draft in each of the ~40 rows per request; adaptive ~7 rows to back off, then a probe per 8.
      EXPECT_GT(st.num_drafts, 0);
      EXPECT_LE(st.num_drafts, 3 * 14) << "wrong drafts were not backed off";
    }
  }
}

// 0..k right drafts, varying per request and per step; requests joining mid-run; random budgets (prompts cut into
// chunks, with one-token tails, for models without chunked forms); preemptions; then the real n-gram proposer.
TEST_P(SpecDecode, MixedAcceptanceJoiningBudgetsAndPreemptionEqualPlain) {
  const auto ps = prompts(4);
  constexpr int kTokens = 17;
  for (const auto& p : ps) reference(p, kTokens);
  const std::vector<int> budgets = chunked_ ? std::vector<int>{128} : std::vector<int>{5, 9, 64};
  for (int budget : budgets) {
    auto e = spec_engine(budget);
    e->set_proposer(std::make_unique<ScriptedProposer>(&answers_, vocab_, [](const RequestState&, std::mt19937& g) {
      return static_cast<int>(g() % (kK + 1));
    }));
    const auto got = run(*e, ps, kTokens, {0, 2, 3, 7}, std::set<int>{6, 11});
    expect_matches_reference(ps, got, kTokens, "mixed drafter, budget " + std::to_string(budget));
    EXPECT_GT(e->spec_decode_stats().num_accepted_tokens, 0);
    EXPECT_LT(e->spec_decode_stats().num_accepted_tokens, e->spec_decode_stats().num_draft_tokens);
    EXPECT_GT(e->num_preemptions(), 0);
    // The same engine with the real n-gram proposer (prompts with a repeated phrase get matches).
    const int64_t before = e->spec_decode_stats().num_drafts;
    e->set_proposer(make_proposer(SpeculativeConfig::parse(spec_json(kK)), {}));
    const auto got2 = run(*e, ps, kTokens, {0, 1, 1, 4});
    expect_matches_reference(ps, got2, kTokens, "n-gram proposer, budget " + std::to_string(budget));
    if (!GetParam().dummy) EXPECT_GT(e->spec_decode_stats().num_drafts, before);  // (random weights may never repeat)
  }
}

// A pool with room for one request's state and KV blocks but not for its k state columns on top: speculative columns
// give way (drafts dropped) instead of failing the request or preempting it forever; the output still equals plain.
TEST_P(SpecDecode, SmallPoolGivesWayToRunningRequests) {
  const std::vector<int> p = random_tokens(40);
  constexpr int kTokens = 12;
  reference(p, kTokens);
  const int kv = reference_->kv_block_size();
  const int blocks = 2 + (kv > 0 ? (static_cast<int>(p.size()) + kTokens + kK + kv - 1) / kv : 0) + 1;
  auto e = spec_engine(64, blocks);
  e->set_proposer(std::make_unique<ScriptedProposer>(&answers_, vocab_, [](const RequestState&, std::mt19937&) { return kK; }));
  expect_matches_reference({p, p}, run(*e, {p, p}, kTokens, {0, 1}), kTokens, "pool of " + std::to_string(blocks) + " blocks");
}

// Prefix caching on: a second pass of the same prompts hits the cache and still equals the plain output.
TEST_P(SpecDecode, PrefixCacheHitsEqualPlain) {
  auto e = spec_engine(64, 0, /*prefix_caching=*/true);
  if (!e->prefix_cache_config().enabled()) GTEST_SKIP() << "prefix caching off for this model";
  const int bs = e->prefix_cache_config().block_size;
  std::vector<int> base = random_tokens(bs + 1);  // the second pass hits bs tokens: a one-token prompt tail
  const std::vector<std::vector<int>> ps = {base, base};
  constexpr int kTokens = 11;
  reference(base, kTokens);
  e->set_proposer(std::make_unique<ScriptedProposer>(&answers_, vocab_, [](const RequestState&, std::mt19937& g) {
    return static_cast<int>(g() % (kK + 1));
  }));
  const auto first = run(*e, {base}, kTokens);
  const auto second = run(*e, {base}, kTokens);
  expect_matches_reference({base}, first, kTokens, "first pass");
  expect_matches_reference({base}, second, kTokens, "second pass");
  EXPECT_GT(e->prefix_cache_stats().hits, 0);
  EXPECT_GT(e->spec_decode_stats().num_accepted_tokens, 0);
}

// Multi-step decode (num_scheduler_steps 4) with speculation: a step in which a request verifies drafts runs one
// model step (the verify pass); a step in which no request has drafts (the drafter gave none, the adaptive draft
// length backed off to 0, no n-gram match) runs the multi-step burst. Output equals plain greedy, ids and logprobs
// bit for bit, with requests joining mid-run; both kinds of step occur, never in one step (models with KV blocks
// never burst: their steps stay single).
TEST_P(SpecDecode, MultiStepDecodeWithVerifyRowsEqualsPlain) {
  const auto ps = prompts(3);
  constexpr int kTokens = 30, kSteps = 4;
  for (const auto& p : ps) reference(p, kTokens);
  const bool bursts = reference_->kv_block_size() == 0;
  auto scripted = [&](bool always_wrong) {
    return std::make_unique<ScriptedProposer>(&answers_, vocab_, [always_wrong](const RequestState&, std::mt19937& g) {
      return always_wrong ? 0 : static_cast<int>(g() % (kK + 1));
    });
  };
  struct Drafter {
    std::string what;
    bool adaptive;
    std::function<std::unique_ptr<Proposer>()> make;
    bool must_verify;  // the drafter surely drafts (the real n-gram proposer may find no match on dummy weights)
  };
  const std::vector<Drafter> drafters = {
      {"drafts on every third step", false, [&] { return std::make_unique<EveryThirdStep>(scripted(false)); }, true},
      {"adaptive, always wrong", true, [&] { return scripted(true); }, true},
      {"adaptive n-gram", true, [] { return make_proposer(SpeculativeConfig::parse(spec_json(kK, true)), {}); }, false},
  };
  for (const Drafter& d : drafters) {
    auto e = spec_engine(8192, 64, false, kK, d.adaptive, kSteps);
    e->set_proposer(d.make());
    StepKinds kinds;
    const auto got = run(*e, ps, kTokens, {0, 3, 9}, {}, &kinds);
    expect_matches_reference(ps, got, kTokens, "K " + std::to_string(kSteps) + ", " + d.what);
    std::printf("[spec + multi-step] %s %s: %d verify steps, %d bursts\n", GetParam().name.c_str(), d.what.c_str(),
                kinds.verify, kinds.burst);
    EXPECT_EQ(kinds.verify_and_burst, 0) << d.what;
    if (d.must_verify) {
      EXPECT_GT(kinds.verify, 0) << d.what;
    }
    if (bursts) {
      EXPECT_GT(kinds.burst, 0) << d.what;
    } else {
      EXPECT_EQ(kinds.burst, 0) << d.what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, SpecDecode, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// Seeded sampling: the same tokens with and without speculation (each position's token is sampled as a plain step
// would, from the same logits and RNG draw); and, over many seeds, the token sampled where a draft was proposed
// follows the target distribution (chi-square against the plain engine's counts; accepting drafts unchecked would put
// all the mass on the draft and fail it).
TEST(SpecDecodeSampling, SeededTokensAndDistributionEqualPlain) {
  const SpecCase c{"tiny-mamba", false};
  if (!std::filesystem::exists(case_dir(c) / "config.json")) GTEST_SKIP() << "no model";
  EngineConfig plain_cfg = case_config(c);
  plain_cfg.enable_prefix_caching = false;
  plain_cfg.scheduler.max_num_seqs = 300;
  EngineConfig spec_cfg = plain_cfg;
  spec_cfg.speculative_config = spec_json(2);
  LLMEngine plain(plain_cfg), spec(spec_cfg);
  const std::vector<int> prompt = {510, 2146, 273, 253, 1533, 310};
  // The drafter always proposes the same two tokens after the first output token.
  struct Fixed final : Proposer {
    void propose(std::span<RequestState* const> reqs, int) override {
      for (RequestState* r : reqs) r->draft_token_ids = {253, 273};
    }
  };
  spec.set_proposer(std::make_unique<Fixed>());
  // Every seed is its own request, all in one batch (sampling is per request and batch-invariant).
  constexpr int kSeeds = 300;
  auto sample_all = [&](LLMEngine& e) {
    std::map<std::string, std::vector<int>> ids;
    for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
      Request r;
      r.request_id = "r" + std::to_string(seed);
      r.prompt_token_ids = prompt;
      r.params.temperature = 1.3;
      r.params.top_k = 12;
      r.params.seed = seed;
      r.params.max_tokens = 4;
      r.params.ignore_eos = true;
      e.add_request(r);
    }
    while (e.has_unfinished_requests())
      for (const auto& o : e.step())
        if (o.finished) ids[o.request_id] = o.outputs[0].token_ids;
    return ids;
  };
  const auto plain_ids = sample_all(plain), spec_ids = sample_all(spec);
  std::map<int, int> count_plain, count_spec;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    const std::string id = "r" + std::to_string(seed);
    const std::vector<int>& a = plain_ids.at(id);
    const std::vector<int>& b = spec_ids.at(id);
    ASSERT_EQ(a, b) << "seed " << seed;
    ++count_plain[a.at(1)], ++count_spec[b.at(1)];  // token 1: the first sampled where a draft was verified
  }
  EXPECT_GT(spec.spec_decode_stats().num_drafts, 0);
  // Chi-square of the spec counts against the plain frequencies (tokens seen fewer than 5 times pooled).
  double chi2 = 0;
  int dof = -1, pooled_plain = 0, pooled_spec = 0;
  for (const auto& [tok, n] : count_plain) {
    const int s = count_spec.count(tok) ? count_spec.at(tok) : 0;
    if (n < 5) {
      pooled_plain += n, pooled_spec += s;
      continue;
    }
    chi2 += (s - n) * (s - n) / static_cast<double>(n), ++dof;
  }
  for (const auto& [tok, s] : count_spec)
    if (!count_plain.count(tok)) pooled_spec += s;
  if (pooled_plain > 0) chi2 += (pooled_spec - pooled_plain) * (pooled_spec - pooled_plain) / static_cast<double>(pooled_plain), ++dof;
  EXPECT_GE(dof, 1);
  EXPECT_LT(chi2, 3.0 * std::max(1, dof) + 10.0) << "dof " << dof;
}

TEST(SpecDecodeConfig, BadConfigsNameTheField) {
  auto err = [](const std::string& json) {
    try {
      (void)SpeculativeConfig::parse(json);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(err("[1]").find("JSON object"), std::string::npos);
  EXPECT_NE(err(R"({"method": "eagle9", "num_speculative_tokens": 2})").find("unknown method"), std::string::npos);
  EXPECT_NE(err(R"({"method": "ngram"})").find("num_speculative_tokens"), std::string::npos);
  EXPECT_NE(err(R"({"method": "ngram", "num_speculative_tokens": 0})").find("[1, 16]"), std::string::npos);
  EXPECT_NE(err(R"({"method": "ngram", "num_speculative_tokens": 17})").find("[1, 16]"), std::string::npos);
  EXPECT_NE(err(R"({"method": "ngram", "num_speculative_tokens": "4"})").find("integer"), std::string::npos);
  EXPECT_NE(err(R"({"method": "ngram", "num_speculative_tokens": 4, "typo": 1})").find("unknown field \"typo\""), std::string::npos);
  EXPECT_NE(err(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2})")
                .find("prompt_lookup_min"), std::string::npos);
  EXPECT_NE(err(R"({"method": "draft_model", "num_speculative_tokens": 4})").find("\"model\""), std::string::npos);
  const SpeculativeConfig d = SpeculativeConfig::parse(R"({"method": "ngram", "num_speculative_tokens": 4})");
  EXPECT_EQ(d.prompt_lookup_min, 5);
  EXPECT_EQ(d.prompt_lookup_max, 5);
  const SpeculativeConfig one = SpeculativeConfig::parse(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})");
  EXPECT_EQ(one.prompt_lookup_min, 3);
}

// vLLM's SpeculativeConfig infers a missing (or null) method from "model": "ngram" / "[ngram]" are prompt lookup,
// anything else a draft model folder; with neither, the error says both.
TEST(SpecDecodeConfig, MethodIsInferredFromTheModelAsVllm) {
  const SpeculativeConfig d = SpeculativeConfig::parse(R"({"model": "/some/draft", "num_speculative_tokens": 3})");
  EXPECT_EQ(d.method, "draft_model");
  EXPECT_EQ(d.model, "/some/draft");
  EXPECT_EQ(d.num_speculative_tokens, 3);
  EXPECT_EQ(SpeculativeConfig::parse(R"({"method": null, "model": "/d", "num_speculative_tokens": 2})").method, "draft_model");
  for (const char* ngram : {R"({"model": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})",
                            R"({"model": "[ngram]", "num_speculative_tokens": 4, "prompt_lookup_max": 3})"}) {
    const SpeculativeConfig n = SpeculativeConfig::parse(ngram);
    EXPECT_EQ(n.method, "ngram");
    EXPECT_TRUE(n.model.empty());
    EXPECT_EQ(n.prompt_lookup_min, 3);
    EXPECT_EQ(n.prompt_lookup_max, 3);
  }
  try {
    (void)SpeculativeConfig::parse(R"({"num_speculative_tokens": 4})");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"method\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"model\""), std::string::npos) << e.what();
  }
}

// The adaptive draft length's rule (engine/draft_length.h) at constant acceptance rates.
TEST(SpecDecodeDraftLength, FollowsTheAcceptanceRate) {
  // d after `steps` rows whose drafts are all right (rate 1), or right then wrong (rate 0.5: the first draft of a row
  // is accepted and the second rejected, so the positions tested are accepted half the time).
  auto settle = [](double rate, int k, int steps) {
    DraftLength dl;
    int d = k;
    for (int s = 0; s < steps; ++s) {
      d = dl.limit(k);
      dl.observe(d, rate >= 1.0 ? d : std::min(d, 1));
    }
    return std::make_pair(d, dl.acceptance);
  };
  EXPECT_EQ(settle(1.0, 4, 50).first, 4);             // always right: every draft
  EXPECT_EQ(settle(1.0, 16, 50).first, 16);
  const auto half = settle(0.5, 4, 50);
  EXPECT_NEAR(half.second, 0.5, 0.05);
  EXPECT_EQ(half.first, 3);                            // 0.5^3 >= 0.1 > 0.5^4
  // Always wrong: backs off to no drafts, then a one-draft probe every kProbeInterval steps.
  DraftLength dl;
  std::vector<int> ds;
  for (int s = 0; s < 40; ++s) {
    ds.push_back(dl.limit(4));
    dl.observe(ds.back(), 0);
  }
  EXPECT_EQ(ds.front(), 4);
  const int rows_with_drafts = static_cast<int>(std::count_if(ds.begin(), ds.end(), [](int d) { return d > 0; }));
  EXPECT_LE(rows_with_drafts, 8 + (40 - 8) / DraftLength::kProbeInterval + 1);
  EXPECT_EQ(*std::max_element(ds.begin() + 20, ds.end()), 1);  // probes only
  // A probe that is accepted brings the drafts back.
  for (int s = 0; s < 10; ++s) {
    const int d = dl.limit(4);
    dl.observe(d, d);
  }
  EXPECT_EQ(dl.limit(4), 4);
}

TEST(SpecDecodeNgram, LatestEarlierMatchOfTheLongestNgram) {
  using V = std::vector<int32_t>;
  // Last 2-gram (7, 8) occurs at 1 and 5: the latest (5) is followed by 9, 7, 8.
  const V seq = {1, 7, 8, 2, 3, 7, 8, 9, 7, 8};
  EXPECT_EQ(NgramProposer::lookup(seq, 1, 2, 3), (V{9, 7, 8}));
  EXPECT_EQ(NgramProposer::lookup(seq, 1, 2, 1), (V{9}));
  // No 3-gram match with min 3: nothing.
  EXPECT_TRUE(NgramProposer::lookup(seq, 3, 3, 4).empty());
  // The continuation is cut at the sequence end.
  EXPECT_EQ(NgramProposer::lookup(V{4, 5, 4}, 1, 1, 5), (V{5, 4}));
  EXPECT_TRUE(NgramProposer::lookup(V{4}, 1, 3, 2).empty());
}

}  // namespace
}  // namespace ssmserve
