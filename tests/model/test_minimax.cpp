// MiniMax hybrid on the shared block pool: pages that held anything (poisoned with NaN here) and are reused as
// KV blocks are never read before being written; 50 requests one after another, and 50 at once, through a pool
// sized for about 4 at a time (states
// and KV blocks constantly recycled between the two kinds) give the outputs of the first run; the huge
// MiniMax-Text-01 config is refused with a clear error instead of exhausting memory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>

#include "core/error.h"
#include "engine/llm_engine.h"
#include "model/attention_metadata.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using testing::model_dir;

/// One prefill step of `prompt` through the model on `cache` with the given blocks; returns the last logits row.
std::vector<float> prefill_logits(CausalLM& model, StateCache& cache, const std::vector<int32_t>& prompt, int state_block,
                                  const std::vector<int32_t>& kv_blocks) {
  const std::vector<ScheduledSeq> seqs = {{state_block, 0, static_cast<int32_t>(prompt.size()), true}};
  const std::vector<std::vector<int32_t>> tokens = {prompt}, tables = {kv_blocks};
  MetadataOptions opt;
  ForwardBatch batch = make_forward_batch(seqs, tokens, opt);
  build_attention_metadata(seqs, tables, model.kv_block_size(), batch.meta, batch.linear_meta, batch.attn_meta);
  batch.logits_indices = {static_cast<int32_t>(prompt.size()) - 1};
  std::vector<float> logits(model.config().vocab_size);
  model.forward(batch, cache, logits.data());
  return logits;
}

TEST(MiniMax, PoolLayoutAndUnwrittenKvPagesAreNeverRead) {
  const auto dir = model_dir("tiny-minimax");
  SSM_SKIP_IF_NO_MODEL(dir);
  auto model = load_model(dir);
  // One page per block: 6 lightning layers x 4 heads x 64 x 64 fp32 = 384 KiB = 192 tokens of K and V in 2 layers,
  // rounded down to a power of two: 128.
  EXPECT_EQ(model->kv_block_size(), 128);
  EXPECT_EQ(model->num_state_layers(), 1);
  std::vector<int32_t> prompt(300);
  std::mt19937 rng(1);
  for (auto& t : prompt) t = 2 + static_cast<int32_t>(rng() % 50000);
  StateCache clean(1, model->state_shape(), 8);
  EXPECT_EQ(clean.page_bytes(), 384 * 1024);
  const auto want = prefill_logits(*model, clean, prompt, 1, {2, 3, 4});
  // Every byte of the pool NaN; only the state block is zeroed (as the scheduler does); the KV blocks are used
  // as they are, in another order.
  StateCache dirty(1, model->state_shape(), 8);
  std::vector<float> nan(static_cast<size_t>(dirty.page_bytes() / 4), NAN);
  for (int b = 0; b < 8; ++b) std::memcpy(static_cast<std::byte*>(dirty.ssm_state(0).data) + b * dirty.page_bytes(), nan.data(), dirty.page_bytes());
  dirty.zero_block(5);
  const auto got = prefill_logits(*model, dirty, prompt, 5, {7, 1, 6});
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "logit " << i;
}

TEST(MiniMax, FiftyRequestsThroughASmallPoolMatchTheFirstRun) {
  const auto dir = model_dir("tiny-minimax");
  SSM_SKIP_IF_NO_MODEL(dir);
  std::mt19937 rng(50);
  std::vector<std::vector<int>> prompts(5);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int len = i == 0 ? 250 : 1 + static_cast<int>(rng() % 120);
    for (int t = 0; t < len; ++t) prompts[i].push_back(2 + static_cast<int>(rng() % 50000));
  }
  SamplingParams sp;
  sp.temperature = 0, sp.max_tokens = 6, sp.ignore_eos = true, sp.logprobs = 0;
  // First run: each prompt alone in a roomy engine.
  EngineConfig cfg;
  cfg.model = dir;
  std::vector<RequestOutput> first;
  {
    LLM llm(cfg);
    for (const auto& p : prompts) first.push_back(llm.generate_ids({p}, sp).at(0));
  }
  // 50 requests one after another through one engine whose pool holds about 4 (no drift, no NaN).
  cfg.num_state_blocks = 10;
  {
    LLM llm(cfg);
    for (int i = 0; i < 50; ++i) {
      const auto o = llm.generate_ids({prompts[i % prompts.size()]}, sp).at(0);
      const auto& want = first[i % prompts.size()].outputs[0];
      ASSERT_EQ(o.outputs[0].token_ids, want.token_ids) << "sequential request " << i;
      for (size_t s = 0; s < want.logprobs.size(); ++s)
        ASSERT_EQ(o.outputs[0].logprobs[s].at(0).logprob, want.logprobs[s].at(0).logprob) << "sequential request " << i;
    }
  }
  // 50 requests at once, pool of 10 blocks (9 usable: about 4 requests of 2 blocks, the long one needs 3).
  cfg.num_state_blocks = 10;
  cfg.scheduler.max_num_batched_tokens = 128;
  LLMEngine engine(cfg);
  for (int i = 0; i < 50; ++i) {
    Request r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i % prompts.size()];
    r.params = sp;
    engine.add_request(r);
  }
  std::map<int, RequestOutput> got;
  for (int step = 0; engine.has_unfinished_requests(); ++step) {
    ASSERT_LT(step, 100000);
    for (auto& o : engine.step())
      if (o.finished) got[std::stoi(o.request_id)] = o;
  }
  ASSERT_EQ(got.size(), 50u);
  EXPECT_EQ(engine.num_free_blocks(), 9) << "blocks leaked";
  for (int i = 0; i < 50; ++i) {
    const auto& want = first[i % prompts.size()].outputs[0];
    const auto& have = got[i].outputs[0];
    ASSERT_EQ(have.token_ids, want.token_ids) << "request " << i;
    for (size_t s = 0; s < want.logprobs.size(); ++s) {
      ASSERT_TRUE(std::isfinite(have.logprobs[s].at(0).logprob));
      EXPECT_NEAR(have.logprobs[s].at(0).logprob, want.logprobs[s].at(0).logprob, 1e-4) << "request " << i << " step " << s;
    }
  }
}

TEST(MiniMax, PromptLargerThanThePoolIsRejectedAndGenerationStopsAtItsCapacity) {
  const auto dir = model_dir("tiny-minimax");
  SSM_SKIP_IF_NO_MODEL(dir);
  EngineConfig cfg;
  cfg.model = dir;
  cfg.num_state_blocks = 3;  // a state block + one KV block of 128 tokens
  LLMEngine engine(cfg);
  Request r;
  r.request_id = "big";
  r.prompt_token_ids.assign(400, 5);
  EXPECT_THROW(engine.add_request(r), Error);
  r.prompt_token_ids.assign(100, 5);
  r.params.max_tokens = 200;  // fits at first, would outgrow the pool while decoding: stops at its capacity
  r.params.ignore_eos = true;
  engine.add_request(r);
  RequestOutput last;
  for (int i = 0; i < 1000 && engine.has_unfinished_requests(); ++i)
    for (const RequestOutput& o : engine.step())
      if (o.finished) last = o;
  ASSERT_TRUE(last.finished);
  EXPECT_EQ(last.outputs[0].finish_reason, FinishReason::Length);
  EXPECT_EQ(100 + static_cast<int>(last.outputs[0].token_ids.size()), engine.pool_token_capacity());
}

TEST(MiniMax, GenerationStopsAtTheContext) {
  // The checkpoint with max_position_embeddings 300: a prompt of 298 tokens with max_tokens 10 generates 2 tokens
  // (finish "length"), as vLLM; the engine ran past the context when a caller (the Python API) did not cap
  // max_tokens itself as the CLI and the server do.
  const auto dir = model_dir("tiny-minimax");
  SSM_SKIP_IF_NO_MODEL(dir);
  const auto tmp = std::filesystem::temp_directory_path() / ("ssmserve-minimax-ctx-" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    std::filesystem::create_symlink(dir / f, tmp / f);
  auto config = testing::read_json(dir / "config.json");
  config["max_position_embeddings"] = 300;
  std::ofstream(tmp / "config.json") << config.dump();
  {
    EngineConfig cfg;
    cfg.model = tmp;
    LLMEngine engine(cfg);
    ASSERT_EQ(engine.model_config().max_model_len, 300);
    Request r;
    r.request_id = "long";
    for (int i = 0; i < 298; ++i) r.prompt_token_ids.push_back(100 + (i * 7919) % 50000);
    r.params.max_tokens = 10;
    r.params.min_tokens = 5;
    r.params.ignore_eos = true;
    engine.add_request(r);
    std::optional<RequestOutput> last;
    while (engine.has_unfinished_requests())
      for (auto& o : engine.step()) last = std::move(o);
    ASSERT_TRUE(last && last->finished);
    EXPECT_EQ(last->outputs[0].token_ids.size(), 2u);
    EXPECT_EQ(last->outputs[0].finish_reason, FinishReason::Length);
  }
  std::filesystem::remove_all(tmp);
}

TEST(MiniMax, HugeDummyConfigIsRefusedClearly) {
  const auto dir = testing::source_dir() / "configs" / "minimax-text-01";
  try {
    auto m = load_model(dir, LoadFormat::Dummy);
    SUCCEED() << "this machine holds MiniMax-Text-01's dummy weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GiB"), std::string::npos) << e.what();
  }
}

TEST(MiniMax, ConfigValidation) {
  const auto dir = model_dir("tiny-minimax");
  SSM_SKIP_IF_NO_MODEL(dir);
  auto cfg = testing::read_json(dir / "config.json");
  auto bad = cfg;
  bad["layer_types"][0] = "mamba";
  EXPECT_THROW(load_model(ModelConfig::from_json(bad, dir), LoadFormat::Dummy), Error);
  bad = cfg;
  bad["layer_types"].erase(0);
  EXPECT_THROW(load_model(ModelConfig::from_json(bad, dir), LoadFormat::Dummy), Error);
  bad = cfg;
  bad["rope_parameters"]["rope_type"] = "yarn";
  EXPECT_THROW(load_model(ModelConfig::from_json(bad, dir), LoadFormat::Dummy), Error);
  bad = cfg;
  bad["num_key_value_heads"] = 3;
  EXPECT_THROW(load_model(ModelConfig::from_json(bad, dir), LoadFormat::Dummy), Error);
  for (const char* f : {"block_size", "head_dim", "num_attention_heads", "num_local_experts"}) {
    bad = cfg;
    bad[f] = (1 << 24) - 1;
    EXPECT_THROW(load_model(ModelConfig::from_json(bad, dir), LoadFormat::Dummy), Error) << f;
  }
  bad = cfg;
  bad["head_dim"] = 63;
  EXPECT_THROW(load_model(ModelConfig::from_json(bad, dir), LoadFormat::Dummy), Error);
  // The original attn_type_list (0 = linear, 1 = softmax) is accepted in place of layer_types.
  auto orig = cfg;
  orig.erase("layer_types");
  orig["attn_type_list"] = {0, 0, 0, 1, 0, 0, 0, 1};
  auto m = load_model(ModelConfig::from_json(orig, dir), LoadFormat::Dummy);
  EXPECT_EQ(m->kv_block_size(), 128);
}

}  // namespace
}  // namespace ssmserve
