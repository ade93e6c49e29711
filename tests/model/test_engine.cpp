// Engine-level tests on the bundled tiny-mamba: seeded sampling is batch-independent, stop strings and
// max_tokens finish correctly, a pool with fewer state blocks than requests still serves everything in FCFS
// order, aborts free blocks, and bad requests are rejected with a clear error.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

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
  LLM small(cfg);
  const auto got = small.generate(kPrompts, sp);
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(got[i].outputs[0].token_ids, want[i].outputs[0].token_ids);
  EXPECT_EQ(small.engine().num_free_blocks(), 1);
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
