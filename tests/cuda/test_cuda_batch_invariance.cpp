// GPU batch invariance through the engine (issue 7; the engine core's test, smaller sweep): in batch-invariant mode
// every request of random schedules (token budgets, max_num_seqs, preemption) gives the tokens and logprobs of
// running alone, bit for bit, for tiny-mamba, the Mamba-2 dummy shapes and every hybrid layout. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "engine/llm_engine.h"
#include "runtime/cuda_mamba.h"
#include "test_util.h"

namespace ssmserve {
namespace {
using namespace cudatest;

struct Outcome {
  std::vector<int> ids;
  std::vector<float> logprobs;
};

Outcome outcome_of(const RequestOutput& out) {
  Outcome o{out.outputs[0].token_ids, {}};
  for (const auto& step : out.outputs[0].logprobs) o.logprobs.push_back(step.at(0).logprob);
  return o;
}

void check_batch_invariance(const std::filesystem::path& dir, LoadFormat format, const std::filesystem::path& tokenizer = {}) {
  cuda::register_cuda_backend();
  ::setenv("SSMSERVE_BATCH_INVARIANT", "1", 1);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.ignore_eos = true;
  greedy.logprobs = 0;
  EngineConfig base;
  base.model = dir;
  base.load_format = format;
  base.tokenizer = tokenizer;
  base.device = "cuda";
  LLMEngine reference(base);
  std::map<std::pair<std::vector<int>, int>, Outcome> solo;
  auto alone = [&](const std::vector<int>& prompt, int max_tokens) {
    auto key = std::make_pair(prompt, max_tokens);
    if (auto it = solo.find(key); it != solo.end()) return it->second;
    Request r;
    r.request_id = "ref";
    r.prompt_token_ids = prompt;
    r.params = greedy;
    r.params.max_tokens = max_tokens;
    reference.add_request(r);
    Outcome o;
    while (reference.has_unfinished_requests())
      for (const auto& out : reference.step())
        if (out.finished) o = outcome_of(out);
    return solo[key] = o;
  };
  const int budgets[] = {7, 61, 512, 4096};
  const int max_seqs[] = {3, 16};
  std::mt19937 rng(20261129);
  int bitwise = 0, total = 0;
  for (int trial = 0; trial < (quick() ? 2 : 6); ++trial) {
    const int budget = budgets[trial % 4], seqs = max_seqs[(trial / 2) % 2];
    const int n = 1 + static_cast<int>(rng() % 12);
    std::vector<std::vector<int>> prompts(n);
    std::vector<int> max_tokens(n), arrival(n);
    int longest = 0;
    for (int i = 0; i < n; ++i) {
      const int len = 1 + static_cast<int>(rng() % (rng() % 4 == 0 ? 300 : 40));
      for (int t = 0; t < len; ++t) prompts[i].push_back(2 + static_cast<int>(rng() % 50000));
      max_tokens[i] = 1 + static_cast<int>(rng() % 10);
      arrival[i] = static_cast<int>(rng() % 6);
      longest = std::max(longest, len + max_tokens[i]);
    }
    // Every third trial a pool of a few blocks (preemptions): 3 state blocks, plus for a hybrid the KV blocks of the
    // longest request, so that any one request fits alone (the engine refuses a prompt the pool cannot hold).
    const int kv = reference.kv_block_size();
    const int blocks = trial % 3 == 2 ? 3 + (kv > 0 ? (longest + kv - 1) / kv : 0) : 0;
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": budget " << budget << ", max_num_seqs " << seqs << ", "
                                    << n << " prompts");
    EngineConfig cfg = base;
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.scheduler.max_num_seqs = seqs;
    cfg.num_state_blocks = blocks;
    LLMEngine engine(cfg);
    std::map<std::string, Outcome> got;
    int added = 0;
    for (int step = 0; added < n || engine.has_unfinished_requests(); ++step) {
      for (int i = 0; i < n; ++i)
        if (arrival[i] == step || (step > 6 && i >= added && arrival[i] > step)) {
          Request r;
          r.request_id = std::to_string(i);
          r.prompt_token_ids = prompts[i];
          r.params = greedy;
          r.params.max_tokens = max_tokens[i];
          engine.add_request(r);
          ++added;
        }
      if (blocks > 0 && step % 5 == 4 && step < 20) engine.preempt_newest_request();
      for (const auto& out : engine.step())
        if (out.finished) got[out.request_id] = outcome_of(out);
      ASSERT_LT(step, 100000) << "no progress";
    }
    ASSERT_EQ(static_cast<int>(got.size()), n);
    for (int i = 0; i < n; ++i) {
      const Outcome want = alone(prompts[i], max_tokens[i]);
      const Outcome& have = got[std::to_string(i)];
      ASSERT_EQ(have.ids, want.ids) << "request " << i << " (prompt length " << prompts[i].size() << ")";
      // Batch-invariant mode promises bits, not a tolerance: every logprob equal to the solo run's.
      EXPECT_EQ(have.logprobs, want.logprobs) << "request " << i << " (prompt length " << prompts[i].size() << ")";
      bitwise += have.logprobs == want.logprobs;
      ++total;
    }
  }
  ::unsetenv("SSMSERVE_BATCH_INVARIANT");
  std::printf("batch invariance %s: %d of %d requests bit-identical to their solo run\n", dir.filename().c_str(),
              bitwise, total);
  ::testing::Test::RecordProperty("bitwise", bitwise);
  ::testing::Test::RecordProperty("requests", total);
}

TEST(CudaBatchInvariance, Mamba1RandomSchedulesEqualRunningAlone) {
  REQUIRE_GPU();
  const auto dir = testing::model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  check_batch_invariance(dir, LoadFormat::Auto);
}

TEST(CudaBatchInvariance, Mamba2DummyRandomSchedulesEqualRunningAlone) {
  REQUIRE_GPU();
  check_batch_invariance(testing::source_dir() / "tests/cuda/configs/tiny-mamba2", LoadFormat::Dummy);
}

// The hybrids (dummy weights, tests/data/tiny-hybrids): Mamba-2 + attention (NoPE) + relu^2 MLP + sigmoid-routed
// MoE with a shared expert (Nemotron-H), Mamba-1 with inner norms + attention + MoE (Jamba), Mamba-2 in parallel
// with RoPE attention (Falcon-H1), Mamba-2 + attention (Bamba), Granite-4.0-H dense, lightning + attention + MoE
// (MiniMax), gated DeltaNet + gated attention (Qwen3.5) and with MoE (Qwen3-Next), all bit for bit as the Mamba
// models. Batch-invariant mode puts every query of the softmax layers on the fp32 split-KV pass with fixed 512-key
// splits, every MoE pair on the per-pair GEMVs, the fp32 router GEMM on the plain kernel, and the DeltaNet and
// lightning prefill rows on the decode kernels' per-token step (16 of 16 requests bit-identical for each on the
// H200, session 25, quick mode).
class CudaHybridBatchInvariance : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaHybridBatchInvariance, RandomSchedulesEqualRunningAlone) {
  REQUIRE_GPU();
  check_batch_invariance(testing::source_dir() / "tests/data/tiny-hybrids" / GetParam(), LoadFormat::Dummy,
                         testing::model_dir("tiny-mamba"));
}

INSTANTIATE_TEST_SUITE_P(Hybrids, CudaHybridBatchInvariance,
                         ::testing::Values("tiny-nemotron_h-pattern", "tiny-jamba", "tiny-falcon_h1", "tiny-bamba",
                                           "tiny-granite-dense", "tiny-minimax-dummy", "tiny-qwen3_5", "tiny-qwen3_next"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string n = i.param;
                           for (char& c : n)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace ssmserve
