// Engine-level tests on the bundled tiny-mamba: seeded sampling is batch-independent, stop strings and
// max_tokens finish correctly, a pool with fewer state blocks than requests still serves everything in FCFS
// order, aborts free blocks, and bad requests are rejected with a clear error.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <map>

#include "core/error.h"
#include "engine/llm_engine.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using ::testing::HasSubstr;

EngineConfig tiny_config() {
  EngineConfig cfg;
  cfg.model = testing::model_dir("tiny-mamba");
  return cfg;
}

const std::vector<std::string> kPrompts = {"It is a truth universally acknowledged", "And the LORD said unto Moses,",
                                           "The", "Emma Woodhouse, handsome, clever, and rich"};

TEST(Engine, SeededSamplingIsBatchIndependent) {
  SSM_SKIP_IF_NO_MODEL(tiny_config().model);
  SamplingParams sp;
  sp.temperature = 0.9;
  sp.top_p = 0.95;
  sp.top_k = 50;
  sp.max_tokens = 24;
  sp.ignore_eos = true;
  std::vector<SamplingParams> params(kPrompts.size(), sp);
  for (size_t i = 0; i < params.size(); ++i) params[i].seed = 100 + i;
  EngineConfig cfg = tiny_config();
  cfg.scheduler.max_num_batched_tokens = 5;  // chunked prefill mixed with decodes
  LLM batched(cfg);
  const auto together = batched.generate(kPrompts, params);
  LLM alone_llm(tiny_config());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const auto alone = alone_llm.generate({kPrompts[i]}, {params[i]});
    EXPECT_EQ(together[i].outputs[0].token_ids, alone[0].outputs[0].token_ids) << kPrompts[i];
    EXPECT_EQ(together[i].outputs[0].text, alone[0].outputs[0].text);
  }
  // Same seed, same output; another seed, (almost surely) another output.
  auto again = alone_llm.generate({kPrompts[0]}, {params[0]});
  EXPECT_EQ(again[0].outputs[0].token_ids, together[0].outputs[0].token_ids);
  params[0].seed = 999;
  auto other = alone_llm.generate({kPrompts[0]}, {params[0]});
  EXPECT_NE(other[0].outputs[0].token_ids, together[0].outputs[0].token_ids);
}

TEST(Engine, StopStringAndLength) {
  SSM_SKIP_IF_NO_MODEL(tiny_config().model);
  LLM llm(tiny_config());
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 32;
  sp.ignore_eos = true;
  const auto full = llm.generate({"And the LORD said unto Moses,"}, sp)[0].outputs[0];
  EXPECT_EQ(full.finish_reason, FinishReason::Length);
  EXPECT_EQ(full.token_ids.size(), 32u);
  // Stop at a word that appears in the greedy continuation: the text ends right before it.
  const std::string text = full.text;
  const size_t pos = text.find(" and", 5);
  ASSERT_NE(pos, std::string::npos) << text;
  sp.stop = {" and"};
  const auto stopped = llm.generate({"And the LORD said unto Moses,"}, sp)[0].outputs[0];
  EXPECT_EQ(stopped.finish_reason, FinishReason::Stop);
  EXPECT_EQ(stopped.stop_reason, " and");
  EXPECT_EQ(stopped.text, text.substr(0, text.find(" and")));
  sp.include_stop_str_in_output = true;
  const auto incl = llm.generate({"And the LORD said unto Moses,"}, sp)[0].outputs[0];
  EXPECT_EQ(incl.text, text.substr(0, text.find(" and") + 4));
}

TEST(Engine, FewerStateBlocksThanRequests) {
  SSM_SKIP_IF_NO_MODEL(tiny_config().model);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 8;
  sp.ignore_eos = true;
  LLM reference(tiny_config());
  const auto want = reference.generate(kPrompts, sp);
  EngineConfig cfg = tiny_config();
  cfg.num_state_blocks = 2;  // one usable block: requests run one at a time
  cfg.enable_prefix_caching = false;  // (caching needs room for a cached block too)
  LLM small(cfg);
  const auto got = small.generate(kPrompts, sp);
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(got[i].outputs[0].token_ids, want[i].outputs[0].token_ids);
  EXPECT_EQ(small.engine().num_free_blocks(), 1);
}

// A hybrid whose pool holds fewer KV tokens than a request asks for: that request stops at the pool's capacity
// (finish_reason "length", as at max_model_len) and the others of the batch still come back (a break test lost them).
TEST(Engine, HybridRequestBeyondThePoolStopsAtItsCapacity) {
  EngineConfig cfg;
  cfg.model = testing::model_dir("tiny-granitemoehybrid");
  SSM_SKIP_IF_NO_MODEL(cfg.model);
  cfg.num_state_blocks = 3;  // the null block, a state block and one KV block
  LLM llm(cfg);
  const int cap = llm.engine().pool_token_capacity();
  ASSERT_GT(cap, 8);
  SamplingParams shortp, longp;
  shortp.temperature = longp.temperature = 0;
  shortp.max_tokens = 5;
  longp.max_tokens = cap + 100;
  longp.ignore_eos = true;
  const auto got = llm.generate({"In the beginning", "hi", "Call me"}, {shortp, longp, shortp});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].outputs[0].token_ids.size(), 5u);
  EXPECT_EQ(got[2].outputs[0].token_ids.size(), 5u);
  EXPECT_EQ(got[1].outputs[0].finish_reason, FinishReason::Length);
  EXPECT_EQ(got[1].prompt_token_ids.size() + got[1].outputs[0].token_ids.size(), static_cast<size_t>(cap));
}

// A hybrid pool without room for one request (its state block and one KV block) and a --max-model-len above what
// the pool holds for one request are refused when the engine is built, for every front end (a break test found the
// Python LLM and `serve --num-state-blocks 2` accepting them and failing request by request).
TEST(Engine, HybridPoolTooSmallForOneRequestIsRefusedAtStartup) {
  EngineConfig cfg;
  cfg.model = testing::source_dir() / "tests/data/tiny-hybrids/tiny-bamba";
  cfg.load_format = LoadFormat::Dummy;
  cfg.enable_prefix_caching = false;  // (caching has its own, stricter bound)
  cfg.num_state_blocks = 2;
  EXPECT_THAT([&] { LLMEngine e(cfg); }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                                              "--num-state-blocks 2 leaves 1 usable block (block 0 is the null block): a "
                                              "request of this hybrid model needs its state block and at least one KV block")));
  cfg.num_state_blocks = 4;
  const int cap = LLMEngine(cfg).pool_token_capacity();
  ASSERT_GT(cap, 0);
  cfg.max_model_len = cap;  // exactly the pool: fine
  EXPECT_NO_THROW(LLMEngine e(cfg));
  cfg.max_model_len = cap + 1;
  EXPECT_THAT([&] { LLMEngine e(cfg); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                  "--max-model-len " + std::to_string(cap + 1) + " does not fit in the block pool, which holds at most " +
                  std::to_string(cap) + " tokens of one request")));
}

// A hybrid's default pool (a state and a KV block per sequence plus one whole context) still gets the speculative
// decoding and prefix caching allowances on top (a break test found the hybrid base replacing them).
TEST(Engine, HybridDefaultPoolKeepsTheSpeculativeAndCachedAllowances) {
  EngineConfig cfg;
  cfg.model = testing::source_dir() / "tests/data/tiny-hybrids/tiny-bamba";
  cfg.load_format = LoadFormat::Dummy;
  cfg.enable_prefix_caching = false;
  const int base = LLMEngine(cfg).num_state_blocks();
  const int seqs = cfg.scheduler.max_num_seqs;
  ASSERT_GT(base, 2 * seqs);
  cfg.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 3})";
  EXPECT_EQ(LLMEngine(cfg).num_state_blocks(), base + 3 * seqs);
  cfg.speculative_config.clear();
  cfg.enable_prefix_caching = true;
  EXPECT_EQ(LLMEngine(cfg).num_state_blocks(), base + std::max(64, seqs));
}

TEST(Engine, AbortFreesTheBlock) {
  SSM_SKIP_IF_NO_MODEL(tiny_config().model);
  LLMEngine engine(tiny_config());
  const int free0 = engine.num_free_blocks();
  Request r;
  r.request_id = "a";
  r.prompt = "Hello there";
  r.params.max_tokens = 100;
  engine.add_request(r);
  engine.step();
  EXPECT_EQ(engine.num_free_blocks(), free0 - 1);
  engine.abort_request("a");
  EXPECT_EQ(engine.num_free_blocks(), free0);
  EXPECT_FALSE(engine.has_unfinished_requests());
}

TEST(Engine, RejectsBadRequests) {
  SSM_SKIP_IF_NO_MODEL(tiny_config().model);
  LLMEngine engine(tiny_config());
  auto msg = [&](Request r) {
    try {
      engine.add_request(std::move(r));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Request empty;
  empty.request_id = "e";
  EXPECT_THAT(msg(empty), HasSubstr("empty"));
  Request bad_id;
  bad_id.request_id = "b";
  bad_id.prompt_token_ids = {1, 50280};
  EXPECT_THAT(msg(bad_id), HasSubstr("outside the vocabulary"));
  Request bad_temp;
  bad_temp.request_id = "t";
  bad_temp.prompt = "x";
  bad_temp.params.temperature = -1;
  EXPECT_THAT(msg(bad_temp), HasSubstr("temperature"));
  Request ok;
  ok.request_id = "dup";
  ok.prompt = "x";
  EXPECT_EQ(msg(ok), "no error");
  EXPECT_THAT(msg(ok), HasSubstr("already in use"));
}

}  // namespace
}  // namespace ssmserve

namespace ssmserve {
namespace {

// Decode batches padded to a fixed size (as CUDA graphs need): the padded rows point at the null block and
// change no live state or output.
TEST(Engine, PaddedDecodeBatchesChangeNothing) {
  SSM_SKIP_IF_NO_MODEL(tiny_config().model);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 12;
  sp.ignore_eos = true;
  sp.logprobs = 1;
  LLM plain(tiny_config());
  const auto want = plain.generate(kPrompts, sp);
  for (int pad : {1, 5, 8}) {
    EngineConfig cfg = tiny_config();
    cfg.pad_decode_batches_to = pad;
    LLM padded(cfg);
    const auto got = padded.generate(kPrompts, sp);
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      EXPECT_EQ(got[i].outputs[0].token_ids, want[i].outputs[0].token_ids) << "pad " << pad;
      EXPECT_EQ(got[i].outputs[0].logprobs.back().at(0).logprob, want[i].outputs[0].logprobs.back().at(0).logprob);
    }
  }
}

}  // namespace
}  // namespace ssmserve

namespace ssmserve {
namespace {

/// Runs `prompts` through an engine step by step, checking that every request's streamed delta_token_ids add up
/// to its final token ids; returns the final outputs in prompt order.
std::vector<RequestOutput> run_streamed(LLMEngine& engine, const std::vector<std::string>& prompts,
                                        const std::vector<SamplingParams>& params, int* multi_steps) {
  std::map<std::string, size_t> index;
  std::vector<std::vector<int>> streamed(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.request_id = "r" + std::to_string(i);
    r.prompt = prompts[i];
    r.params = params[i];
    index[r.request_id] = i;
    engine.add_request(std::move(r));
  }
  std::vector<RequestOutput> done(prompts.size());
  while (engine.has_unfinished_requests()) {
    for (auto& o : engine.step()) {
      const size_t i = index.at(o.request_id);
      streamed[i].insert(streamed[i].end(), o.delta_token_ids.begin(), o.delta_token_ids.end());
      if (o.finished) done[i] = std::move(o);
    }
    if (engine.last_step_stats().num_model_steps > 1) ++*multi_steps;
  }
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(streamed[i], done[i].outputs.at(0).token_ids) << "request " << i;
  return done;
}

// Multi-step decode (num_scheduler_steps, vLLM's multi-step scheduling) on the CPU, where the engine loops the
// model's forward itself (host_greedy_steps): every output equals the single-step run's -- token ids, logprobs
// (bit for bit), text, finish reasons -- with max_tokens not a multiple of K (the tail runs single steps), a
// stop string and EOS that end requests inside a K-step burst (tokens after the stop dropped), requests admitted
// while others decode (mixed steps run single), and for Mamba-1 and Mamba-2.
TEST(Engine, MultiStepDecodeMatchesSingleSteps) {
  for (const char* name : {"tiny-mamba", "tiny-mamba2"}) {
    SCOPED_TRACE(name);
    EngineConfig base;
    base.model = testing::model_dir(name);
    SSM_SKIP_IF_NO_MODEL(base.model);
    base.scheduler.max_num_seqs = 2;  // the later prompts start while the first ones decode
    std::vector<SamplingParams> params(kPrompts.size());
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].temperature = 0;
      params[i].max_tokens = std::vector<int>{13, 7, 24, 10}[i];
      params[i].ignore_eos = i != 1;
      params[i].logprobs = static_cast<int>(i % 3);
    }
    LLMEngine single_engine(base);
    int multi = 0;
    const auto want = run_streamed(single_engine, kPrompts, params, &multi);
    EXPECT_EQ(multi, 0);
    // A stop string inside prompt 2's greedy continuation, so it ends mid-burst.
    const std::string& t2 = want[2].outputs[0].text;
    if (t2.size() > 12) {
      params[2].stop = {t2.substr(t2.size() / 2, 2)};
    }
    LLMEngine single_again(base);
    const auto want_stop = run_streamed(single_again, kPrompts, params, &multi);
    if (!params[2].stop.empty()) EXPECT_EQ(want_stop[2].outputs[0].finish_reason, FinishReason::Stop);
    for (int K : {2, 4, 5}) {
      SCOPED_TRACE(::testing::Message() << "K " << K);
      EngineConfig cfg = base;
      cfg.num_scheduler_steps = K;
      LLMEngine engine(cfg);
      int got_multi = 0;
      const auto got = run_streamed(engine, kPrompts, params, &got_multi);
      EXPECT_GT(got_multi, 0);
      for (size_t i = 0; i < kPrompts.size(); ++i) {
        const auto& g = got[i].outputs.at(0);
        const auto& w = want_stop[i].outputs.at(0);
        EXPECT_EQ(g.token_ids, w.token_ids) << "request " << i;
        EXPECT_EQ(g.text, w.text) << "request " << i;
        EXPECT_EQ(g.finish_reason, w.finish_reason) << "request " << i;
        EXPECT_EQ(g.stop_reason, w.stop_reason) << "request " << i;
        ASSERT_EQ(g.logprobs.size(), w.logprobs.size()) << "request " << i;
        for (size_t s = 0; s < w.logprobs.size(); ++s) {
          ASSERT_EQ(g.logprobs[s].size(), w.logprobs[s].size());
          for (size_t k = 0; k < w.logprobs[s].size(); ++k) {
            EXPECT_EQ(g.logprobs[s][k].id, w.logprobs[s][k].id);
            EXPECT_EQ(g.logprobs[s][k].logprob, w.logprobs[s][k].logprob);
          }
        }
      }
    }
  }
}

// A burst never runs past the fewest tokens a request still needs: max_tokens 11 with K 8 runs the prefill (token
// 1), a burst of 8, then 2 (the 2 left, a power of two) -- not a second burst of 8 for 2 tokens.
TEST(Engine, MultiStepBurstsStopAtMaxTokens) {
  SSM_SKIP_IF_NO_MODEL(tiny_config().model);
  EngineConfig cfg = tiny_config();
  cfg.num_scheduler_steps = 8;
  LLMEngine engine(cfg);
  Request r;
  r.request_id = "a";
  r.prompt = kPrompts[0];
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = 11;
  engine.add_request(std::move(r));
  std::vector<int> model_steps, tokens;
  while (engine.has_unfinished_requests()) {
    const auto outs = engine.step();
    model_steps.push_back(engine.last_step_stats().num_model_steps);
    tokens.push_back(outs.empty() ? 0 : static_cast<int>(outs[0].delta_token_ids.size()));
  }
  EXPECT_EQ(model_steps, (std::vector<int>{1, 8, 2}));
  EXPECT_EQ(tokens, (std::vector<int>{1, 8, 2}));
}

TEST(Engine, MultiStepDecodeRejectsBadStepCounts) {
  for (int K : {0, -1, kMaxSchedulerSteps + 1}) {
    EngineConfig cfg;
    cfg.num_scheduler_steps = K;
    EXPECT_THROW(cfg.validate(), Error) << K;
  }
}

}  // namespace
}  // namespace ssmserve
