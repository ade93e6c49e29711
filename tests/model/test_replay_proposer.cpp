// The benchmark-only replay drafter of speculative decoding (issue 29, engine/replay_proposer.h): at acceptance rate 1
// every draft is the recorded greedy token (the engine accepts 100%), at rate 0 none is (0%), in between each position
// is right with that chance; the output equals plain greedy output bit for bit at every rate; its config is checked
// and only engines with allow_benchmark_proposers (bench latency) accept the method.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"
#include "engine/llm_engine.h"
#include "engine/replay_proposer.h"
#include "engine/request.h"
#include "test_util.h"

namespace ssmserve {
namespace {

constexpr int kK = 4;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ReplayProposer, DraftsTheContinuationAtTheChosenRate) {
  const std::vector<int> prompt = {5, 6, 7};
  std::vector<int> cont(2000);
  std::mt19937 rng(3);
  for (int& t : cont) t = static_cast<int>(rng() % 100);
  auto conts = std::make_shared<ReplayProposer::Continuations>();
  (*conts)[prompt] = cont;
  const ReplayProposer right(conts, 100, 1.0, 0), wrong(conts, 100, 0.0, 0), half(conts, 100, 0.5, 7);
  int hits = 0;
  for (int pos = 0; pos < 2000; ++pos) {
    const int t = cont[static_cast<size_t>(pos)];
    EXPECT_EQ(right.draft(prompt, pos, t), t);
    const int w = wrong.draft(prompt, pos, t);
    EXPECT_NE(w, t);
    EXPECT_TRUE(w >= 0 && w < 100) << w;
    hits += half.draft(prompt, pos, t) == t;
    EXPECT_EQ(half.draft(prompt, pos, t), half.draft(prompt, pos, t));  // a hash of (seed, prompt, position)
  }
  EXPECT_NEAR(hits / 2000.0, 0.5, 0.05);

  // propose(): k drafts from the request's next output position, none past the continuation's end or for an
  // unknown prompt, none without continuations.
  Request req;
  req.request_id = "r";
  req.prompt_token_ids = prompt;
  RequestState st(req);
  st.output_token_ids = {cont[0], cont[1]};
  RequestState* reqs[] = {&st};
  ReplayProposer p(conts, 100, 1.0, 0);
  p.propose(reqs, kK);
  EXPECT_EQ(st.draft_token_ids, std::vector<int32_t>(cont.begin() + 2, cont.begin() + 2 + kK));
  st.output_token_ids.assign(cont.begin(), cont.end() - 1);
  p.propose(reqs, kK);
  EXPECT_EQ(st.draft_token_ids.size(), 1u);
  Request other = req;
  other.prompt_token_ids = {1};
  RequestState unknown(other);
  RequestState* reqs2[] = {&unknown};
  p.propose(reqs2, kK);
  EXPECT_TRUE(unknown.draft_token_ids.empty());
  EXPECT_EQ(p.num_diverged(), 0);
  Request req2 = req;
  req2.request_id = "r2";
  RequestState left(req2);
  left.output_token_ids = {cont[0], (cont[1] + 1) % 100, cont[2]};  // left its continuation at output token 1
  RequestState* reqs3[] = {&left};
  p.propose(reqs3, kK);
  left.output_token_ids.push_back(cont[3]);
  p.propose(reqs3, kK);
  EXPECT_EQ(p.num_diverged(), 1);  // counted once
  ReplayProposer empty(nullptr, 100, 1.0, 0);
  empty.propose(reqs, kK);
  EXPECT_TRUE(st.draft_token_ids.empty());
}

TEST(ReplayProposer, ConfigErrorsNameTheField) {
  auto parse = [](const std::string& j) { return error_of([&] { (void)SpeculativeConfig::parse(j); }); };
  const SpeculativeConfig c =
      SpeculativeConfig::parse(R"({"method": "replay", "num_speculative_tokens": 4, "acceptance_rate": 0.5, "seed": 9})");
  EXPECT_EQ(c.method, "replay");
  EXPECT_TRUE(c.benchmark_only());
  EXPECT_EQ(c.acceptance_rate, 0.5);
  EXPECT_EQ(c.seed, 9u);
  EXPECT_EQ(SpeculativeConfig::parse(R"({"method": "replay", "num_speculative_tokens": 2})").acceptance_rate, 1.0);
  EXPECT_NE(parse(R"({"method": "replay", "num_speculative_tokens": 4, "acceptance_rate": 1.5})").find("\"acceptance_rate\" must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(parse(R"({"method": "replay", "num_speculative_tokens": 4, "acceptance_rate": "x"})").find("\"acceptance_rate\" must be a number"),
            std::string::npos);
  EXPECT_NE(parse(R"({"method": "replay", "num_speculative_tokens": 4, "seed": -1})").find("\"seed\" must be >= 0"), std::string::npos);
  EXPECT_NE(parse(R"({"method": "replay", "num_speculative_tokens": 0})").find("num_speculative_tokens"), std::string::npos);
  EXPECT_NE(parse(R"({"method": "replay", "num_speculative_tokens": 4, "model": "x"})").find("method replay takes"),
            std::string::npos);
  EXPECT_NE(parse(R"({"method": "ngram", "num_speculative_tokens": 4, "acceptance_rate": 1})").find("for method replay"),
            std::string::npos);
  EXPECT_NE(error_of([] { ReplayProposer(nullptr, 1, 1.0, 0); }).find("vocabulary"), std::string::npos);

  // Only engines that allow benchmark proposers (bench latency) take the method.
  EngineConfig cfg;
  cfg.model = testing::model_dir("tiny-mamba");
  cfg.speculative_config = R"({"method": "replay", "num_speculative_tokens": 4})";
  const std::string refused = error_of([&] { cfg.validate(); });
  EXPECT_NE(refused.find("method \"replay\" is a benchmark-only drafter"), std::string::npos) << refused;
  EXPECT_NE(error_of([&] { LLMEngine e(cfg); }).find("benchmark-only"), std::string::npos);
  cfg.allow_benchmark_proposers = true;
  EXPECT_EQ(error_of([&] { cfg.validate(); }), "no error");
}

class ReplayEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(testing::model_dir("tiny-mamba") / "config.json")) GTEST_SKIP() << "no tiny-mamba";
  }

  static EngineConfig config(const std::string& spec) {
    EngineConfig cfg;
    cfg.model = testing::model_dir("tiny-mamba");
    cfg.num_threads = 2;
    cfg.num_state_blocks = 32;
    cfg.enable_prefix_caching = false;
    cfg.speculative_config = spec;
    cfg.allow_benchmark_proposers = !spec.empty();
    return cfg;
  }

  /// Runs the prompts greedily (logprobs on) and returns each one's output ids and chosen-token logprobs.
  static std::map<std::vector<int>, std::pair<std::vector<int>, std::vector<float>>> run(LLMEngine& e,
                                                                                        const std::vector<std::vector<int>>& prompts) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      Request r;
      r.request_id = "p" + std::to_string(i);
      r.prompt_token_ids = prompts[i];
      r.params.temperature = 0;
      r.params.max_tokens = kTokens;
      r.params.ignore_eos = true;
      r.params.logprobs = 0;
      e.add_request(r);
    }
    std::map<std::vector<int>, std::pair<std::vector<int>, std::vector<float>>> out;
    while (e.has_unfinished_requests())
      for (const RequestOutput& o : e.step())
        if (o.finished) {
          auto& [ids, lps] = out[o.prompt_token_ids];
          ids = o.outputs[0].token_ids;
          for (const auto& step : o.outputs[0].logprobs) lps.push_back(step.at(0).logprob);
        }
    return out;
  }

  static constexpr int kTokens = 40;
  const std::vector<std::vector<int>> prompts_ = {{11, 12, 13, 14}, {300, 7, 9}, {42}};
};

TEST_F(ReplayEngine, AcceptanceFollowsTheRateAndOutputEqualsPlain) {
  LLMEngine plain(config(""));
  const auto want = run(plain, prompts_);
  auto conts = std::make_shared<ReplayProposer::Continuations>();
  for (const auto& [prompt, o] : want) (*conts)[prompt] = o.first;

  // Every draft verified (no adaptive draft length), so the counters follow the rate exactly.
  LLMEngine spec(config(R"({"method": "replay", "num_speculative_tokens": 4, "adaptive_draft_length": false})"));
  // The engine's own replay proposer has no continuations: it drafts nothing.
  EXPECT_EQ(run(spec, prompts_), want);
  EXPECT_EQ(spec.spec_decode_stats().num_drafts, 0);
  const int vocab = spec.model_config().vocab_size;
  for (const double rate : {1.0, 0.0, 0.5}) {
    const SpecDecodeStats before = spec.spec_decode_stats();
    auto proposer = std::make_unique<ReplayProposer>(conts, vocab, rate, 1);
    const ReplayProposer& replay = *proposer;
    spec.set_proposer(std::move(proposer));
    EXPECT_EQ(run(spec, prompts_), want) << "rate " << rate;  // ids and logprobs bit for bit
    EXPECT_EQ(replay.num_diverged(), 0);
    const SpecDecodeStats& after = spec.spec_decode_stats();
    const int64_t drafts = after.num_drafts - before.num_drafts, tokens = after.num_draft_tokens - before.num_draft_tokens,
                  accepted = after.num_accepted_tokens - before.num_accepted_tokens;
    ASSERT_GT(drafts, 0);
    const int64_t first_accepted = after.accepted_per_pos[0] - before.accepted_per_pos[0];
    if (rate == 1.0) {
      EXPECT_EQ(accepted, tokens);                               // 100%
      EXPECT_LE(drafts, 3 * ((kTokens - 1 + kK) / (kK + 1)));  // rows of k + 1 tokens
    } else if (rate == 0.0) {
      EXPECT_EQ(accepted, 0);                       // 0%
      EXPECT_GE(drafts, 3 * (kTokens - 2));         // one token per row (the last one may carry no draft)
      EXPECT_LE(drafts, 3 * (kTokens - 1));
    } else {
      // Each position is right with chance 1/2 given the ones before it were.
      EXPECT_NEAR(double(first_accepted) / double(drafts), 0.5, 0.2) << first_accepted << " of " << drafts;
    }
  }

  // The engine's default adaptive draft length: at rate 0 a request soon verifies no drafts but a probe now and
  // then; at rate 1 every draft. Output unchanged.
  LLMEngine adaptive(config(R"({"method": "replay", "num_speculative_tokens": 4})"));
  for (const double rate : {0.0, 1.0}) {
    adaptive.set_proposer(std::make_unique<ReplayProposer>(conts, vocab, rate, 1));
    const SpecDecodeStats before = adaptive.spec_decode_stats();
    EXPECT_EQ(run(adaptive, prompts_), want) << "adaptive, rate " << rate;
    const SpecDecodeStats& after = adaptive.spec_decode_stats();
    const int64_t tokens = after.num_draft_tokens - before.num_draft_tokens,
                  accepted = after.num_accepted_tokens - before.num_accepted_tokens;
    if (rate == 0.0) {
      EXPECT_EQ(accepted, 0);
      EXPECT_GT(tokens, 0);
      EXPECT_LT(tokens, 3 * (kTokens - 1));  // fewer than one draft per token (the non-adaptive count is k per token)
    } else {
      EXPECT_EQ(accepted, tokens);
    }
  }
}

}  // namespace
}  // namespace ssmserve
