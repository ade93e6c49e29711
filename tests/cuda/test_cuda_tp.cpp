// Tensor parallelism on GPUs over NCCL (issue 9): the runners split over TP = 2 GPUs against TP = 1 on one GPU --
// logits of ragged prefill + padded decode steps (fp32 weights: to rounding; bf16: to bf16 tolerance) for
// tiny-mamba and Mamba-2 dummy shapes with n_groups 8 (groups split), and greedy generation through the engine
// (--device cuda --tensor-parallel-size 2: the same ids except after a near-tie, logprobs within bf16 tolerance);
// device sampling, multi-step decode and --swap-space at TP 2. The collectives are in test_cuda_tp_collectives.cpp,
// speculative decoding in test_cuda_tp_spec.cpp. Skips without 2 GPUs or NCCL.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>

#include "checkpoint_fixtures.h"
#include "engine_test_util.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "model/causal_lm.h"
#include "runtime/cuda_mamba.h"
#include "test_util.h"
#include "tp_test_util.h"

namespace ssmserve {
namespace {

using testing::model_dir;
using cudatest::load_one_and_two;
using cudatest::rel;
using cudatest::write_mamba2_groups_split;

/// Six steps (ragged prefill, a continuing prefill next to decodes, decodes padded to 8 rows) on both models.
void check_steps(CausalLM& one, CausalLM& two, double tol, const std::string& what) {
  const int V = one.config().vocab_size;
  StateCache c1(one.num_state_layers(), one.state_shape(), 6), c2(two.num_state_layers(), two.state_shape(), 6);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> tok(2, V - 1);
  auto ids = [&](int n) {
    std::vector<int32_t> v(n);
    for (auto& t : v) t = tok(rng);
    return v;
  };
  std::vector<ScheduledSeq> seqs = {{1, 0, 1, true}, {2, 0, 2, true}, {3, 0, 37, true}, {4, 0, 5, true}};
  std::vector<std::vector<int32_t>> toks = {ids(1), ids(2), ids(37), ids(5)};
  std::vector<int> computed = {1, 2, 37, 5};
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(::testing::Message() << what << " step " << step);
    MetadataOptions opt;
    opt.pad_decodes_to = step >= 2 ? 8 : 0;
    opt.chunk_size = one.chunk_size();
    ForwardBatch b = make_forward_batch(seqs, toks, opt);
    for (int i = 0; i < b.num_tokens(); ++i) b.logits_indices.push_back(i);
    std::vector<float> l1(b.logits_indices.size() * V), l2(l1.size());
    one.forward(b, c1, l1.data());
    two.forward(b, c2, l2.data());
    const double e = rel(l2, l1);
    std::printf("%s step %d: TP 2 vs TP 1 logits rel err %.3g\n", what.c_str(), step, e);
    EXPECT_LT(e, tol);
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int n = (step == 1 && s == 3) ? 9 : 1;
      seqs[s] = {seqs[s].state_block, computed[s], n, n > 1};
      toks[s] = ids(n);
      computed[s] += n;
    }
  }
}

void check(const ModelConfig& cfg, LoadFormat format, DType wd, double tol, const std::string& what) {
  auto [one, two] = load_one_and_two(cfg, format, wd);
  check_steps(*one, *two, tol, what);
}

TEST(CudaTensorParallel, TinyMambaF32AndBf16) {
  REQUIRE_TWO_GPUS();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  const ModelConfig cfg = ModelConfig::load(dir);
  check(cfg, LoadFormat::Auto, DType::F32, 1e-4, "tiny-mamba f32");
  check(cfg, LoadFormat::Auto, DType::BF16, 3e-2, "tiny-mamba bf16");
}

TEST(CudaTensorParallel, Mamba2DummyGroupsSplit) {
  REQUIRE_TWO_GPUS();
  testing::TempDir tmp("cuda-tp-m2");
  write_mamba2_groups_split(tmp.path());
  const ModelConfig cfg = ModelConfig::load(tmp.path());
  check(cfg, LoadFormat::Dummy, DType::F32, 1e-4, "mamba2 g8 f32");
  check(cfg, LoadFormat::Dummy, DType::BF16, 3e-2, "mamba2 g8 bf16");
}

TEST(CudaTensorParallel, GreedyGenerationTinyMamba) {
  REQUIRE_TWO_GPUS();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  cuda::register_cuda_backend();
  std::vector<std::vector<int>> prompts = {{510, 5347, 273, 6181, 310}, {1231, 2220, 247, 673}, {}};
  for (int t = 0; t < 70; ++t) prompts[2].push_back((t * 7919 + 13) % 50000);
  SamplingParams sp;
  sp.temperature = 0.0;
  sp.ignore_eos = true;
  sp.logprobs = 2;
  sp.max_tokens = 24;
  auto run = [&](int tp) {
    return cudatest::generate_on_cuda(dir, prompts, sp, [&](EngineConfig& cfg) {
      cfg.tensor_parallel_size = tp;
      cfg.scheduler.max_num_batched_tokens = 29;  // chunked prefill next to decodes
    });
  };
  const auto ref = run(1), got = run(2);
  ASSERT_EQ(got.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const auto& r = ref[i].outputs.at(0);
    const auto& g = got[i].outputs.at(0);
    ASSERT_EQ(g.token_ids.size(), r.token_ids.size());
    for (size_t s = 0; s < r.token_ids.size(); ++s) {
      const double gap = r.logprobs.at(s).at(0).logprob - r.logprobs.at(s).at(1).logprob;
      if (g.token_ids[s] != r.token_ids[s]) {
        EXPECT_LT(gap, 0.05) << "prompt " << i << " step " << s << ": greedy token differs away from a near-tie";
        break;
      }
      worst = std::max(worst, std::abs(double(g.logprobs.at(s).at(0).logprob) - r.logprobs.at(s).at(0).logprob));
      EXPECT_NEAR(g.logprobs.at(s).at(0).logprob, r.logprobs.at(s).at(0).logprob, 0.05) << "prompt " << i << " step " << s;
    }
  }
  std::printf("tiny-mamba --device cuda TP 2 vs TP 1: max greedy logprob gap %.3g\n", worst);
}

// Device sampling under tensor parallelism: every rank all-gathers the logits slices on the device and samples
// whole rows, so a seeded run must give the tokens the host sampler gives on the same ranks' logits
// (SSMSERVE_DEVICE_SAMPLING=0 sends every sampled row through forward() and the host sampler), and its logprobs.
TEST(CudaTensorParallel, DeviceSamplingMatchesHostSampler) {
  REQUIRE_TWO_GPUS();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  cuda::register_cuda_backend();
  std::vector<std::vector<int>> prompts = {{510, 5347, 273, 6181, 310}, {1231, 2220, 247, 673}, {42}};
  SamplingParams sp;
  sp.temperature = 0.8;
  sp.top_p = 0.95;
  sp.top_k = 50;
  sp.seed = 1234;
  sp.ignore_eos = true;
  sp.logprobs = 1;
  sp.max_tokens = 20;
  auto run = [&](bool device) {
    if (!device) setenv("SSMSERVE_DEVICE_SAMPLING", "0", 1);  // read when the engine is built
    auto out = cudatest::generate_on_cuda(dir, prompts, sp, [](EngineConfig& cfg) { cfg.tensor_parallel_size = 2; });
    unsetenv("SSMSERVE_DEVICE_SAMPLING");
    return out;
  };
  const auto host = run(false), dev = run(true);
  ASSERT_EQ(dev.size(), host.size());
  for (size_t i = 0; i < host.size(); ++i) {
    const auto& h = host[i].outputs.at(0);
    const auto& d = dev[i].outputs.at(0);
    EXPECT_EQ(d.token_ids, h.token_ids) << "prompt " << i;
    for (size_t s = 0; s < std::min(h.logprobs.size(), d.logprobs.size()); ++s)
      EXPECT_NEAR(d.logprobs[s].at(0).logprob, h.logprobs[s].at(0).logprob, 1e-4) << "prompt " << i << " step " << s;
  }
}

// Multi-step decode at TP 2 (every rank runs K steps in one graph, feeding the all-gathered picks forward): the
// same tokens and logprobs as single steps at TP 2.
TEST(CudaTensorParallel, MultiStepDecodeEqualsSingleSteps) {
  REQUIRE_TWO_GPUS();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  cuda::register_cuda_backend();
  std::vector<std::vector<int>> prompts = {{510, 5347, 273, 6181, 310}, {1231, 2220, 247, 673}, {42}};
  SamplingParams sp;
  sp.temperature = 0.0;
  sp.ignore_eos = true;
  sp.logprobs = 2;
  sp.max_tokens = 17;
  auto run = [&](int K) {
    return cudatest::generate_on_cuda(dir, prompts, sp, [&](EngineConfig& cfg) {
      cfg.tensor_parallel_size = 2;
      cfg.num_scheduler_steps = K;
    });
  };
  cudatest::expect_identical_outputs(run(4), run(1), "TP 2, K 4 vs 1");
}

// --swap-space at TP 2 (issue 28 item 4): every rank keeps its shard of an evicted cached state in its own pinned host
// slots and brings it back on a hit. A pool of 4 blocks and distinct prompts evict the first prompt's states; a
// later request with that prefix swaps them in on both ranks and gives the ids of the uncached TP 2 run.
TEST(CudaTensorParallel, SwapSpaceBringsEvictedStatesBackOnEveryRank) {
  REQUIRE_TWO_GPUS();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  cuda::register_cuda_backend();
  auto config = [&](bool caching) {
    EngineConfig c;
    c.model = dir;
    c.device = "cuda";
    c.tensor_parallel_size = 2;
    c.enable_prefix_caching = caching;
    c.mamba_cache_mode = "align";
    c.num_state_blocks = caching ? 4 : 8;
    c.scheduler.max_num_seqs = 1;
    c.swap_space = caching ? 0.25 : 0.0;
    return c;
  };
  LLMEngine plain(config(false)), cached(config(true));
  const int bs = cached.prefix_cache_config().block_size;
  ASSERT_GT(bs, 0);
  std::mt19937 rng(31);
  auto tokens = [&](int n) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int& t : v) t = 2 + static_cast<int>(rng() % 4000);
    return v;
  };
  auto run = [](LLMEngine& e, const std::vector<int>& prompt, int max_tokens) {
    Request r;
    static int n = 0;
    r.request_id = "tp-swap-" + std::to_string(n++);
    r.prompt_token_ids = prompt;
    r.params.temperature = 0.0;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.params.logprobs = 0;
    e.add_request(r);
    RequestOutput out;
    while (e.has_unfinished_requests())
      for (auto& o : e.step())
        if (o.finished) out = std::move(o);
    return out;
  };
  const std::vector<int> first = tokens(2 * bs + 9);
  run(cached, first, 2);
  for (int i = 0; i < 4; ++i) run(cached, tokens(2 * bs + 3), 2);  // evicts the first prompt's states
  ASSERT_GT(cached.host_tier_stats().swap_outs, 0) << "no host tier at TP 2";
  for (int len : {2 * bs + 5, 2 * bs + 9}) {
    std::vector<int> p(first.begin(), first.begin() + len);
    const RequestOutput want = run(plain, p, 6), got = run(cached, p, 6);
    EXPECT_EQ(got.num_cached_tokens, (len - 1) / bs * bs) << "prefix of " << len;
    ASSERT_EQ(got.outputs.at(0).token_ids, want.outputs.at(0).token_ids) << "prefix of " << len;
    for (size_t k = 0; k < want.outputs[0].logprobs.size(); ++k)
      EXPECT_NEAR(got.outputs[0].logprobs[k].at(0).logprob, want.outputs[0].logprobs[k].at(0).logprob, 2e-2) << k;
  }
  EXPECT_EQ(cached.host_tier_stats().swap_ins, 2);
  std::printf("[tp swap] tiny-mamba TP 2: %lld swapped out, %lld swapped in\n",
              static_cast<long long>(cached.host_tier_stats().swap_outs),
              static_cast<long long>(cached.host_tier_stats().swap_ins));
}

}  // namespace
}  // namespace ssmserve
