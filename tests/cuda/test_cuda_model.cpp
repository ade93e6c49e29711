// GPU model runner against the CPU backend on the bundled tiny-mamba: logits of ragged prefill + padded decode
// steps (fp32 weights: to rounding; bf16: to bf16 tolerance), and greedy generation through the engine on the
// golden prompts (--device cuda vs cpu: same ids except after a near-tie, logprobs within bf16 tolerance);
// Mamba-2 with dummy weights at the tiny-mamba2 and mamba2-2.7b shapes; decode through CUDA graphs equal to eager.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "engine_test_util.h"
#include "engine/llm_engine.h"
#include "model/causal_lm.h"
#include "runtime/cuda_mamba.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using testing::model_dir;
using testing::read_json;
using testing::source_dir;

/// One step over `seqs` (each with its new token ids), logits for every token row.
ForwardBatch make_step(const std::vector<ScheduledSeq>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                       int pad_decodes_to, int chunk_size) {
  MetadataOptions opt;
  opt.pad_decodes_to = pad_decodes_to;
  opt.chunk_size = chunk_size;
  ForwardBatch b = make_forward_batch(seqs, tokens, opt);
  for (int i = 0; i < b.num_tokens(); ++i) b.logits_indices.push_back(i);
  return b;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

/// Runs the same 6 steps (ragged prefill, then decodes padded to 8 rows with a continuing 9-token prefill at step
/// 2) on the CPU model and `gpu`, checking the GPU logits' relative error against `tol` each step.
void check_steps(CausalLM& cpu_model, CausalLM& gpu_model, double tol, const char* what);

void check_logits(DType weight_dtype, double tol) {
  REQUIRE_GPU();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  const ModelConfig cfg = ModelConfig::load(dir);
  auto cpu = load_model(cfg, LoadFormat::Auto);
  auto gpu = cuda::load_mamba_cuda(cfg, LoadFormat::Auto, {weight_dtype});
  check_steps(*cpu, *gpu, tol, weight_dtype == DType::F32 ? "tiny-mamba f32" : "tiny-mamba bf16");
}

void check_steps(CausalLM& cpu_model, CausalLM& gpu_model, double tol, const char* what) {
  CausalLM* cpu = &cpu_model;
  CausalLM* gpu = &gpu_model;
  const ModelConfig& cfg = cpu->config();
  const int V = cfg.vocab_size;
  StateCache cc(cpu->num_state_layers(), cpu->state_shape(), 6), gc(gpu->num_state_layers(), gpu->state_shape(), 6);
  std::mt19937 rng(cuda::gpu_available() ? 7 : 0);
  std::uniform_int_distribution<int> tok(2, 50000);
  auto ids = [&](int n) {
    std::vector<int32_t> v(n);
    for (auto& t : v) t = tok(rng);
    return v;
  };
  // Step 1: ragged prefill (lengths 1, 2 < d_conv - 1 + 1, 37, 5) on blocks 1..4.
  std::vector<ScheduledSeq> seqs = {{1, 0, 1, true}, {2, 0, 2, true}, {3, 0, 37, true}, {4, 0, 5, true}};
  std::vector<std::vector<int32_t>> toks = {ids(1), ids(2), ids(37), ids(5)};
  std::vector<int> computed = {1, 2, 37, 5};
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ForwardBatch b = make_step(seqs, toks, step >= 2 ? 8 : 0, cpu->chunk_size());  // decodes padded to 8 rows
    std::vector<float> lc(b.logits_indices.size() * V), lg(lc.size());
    cpu->forward(b, cc, lc.data());
    gpu->forward(b, gc, lg.data());
    const double e = rel(lg, lc);
    std::printf("%s step %d: logits rel err %.3g\n", what, step, e);
    EXPECT_LT(e, tol);
    // Next step: every sequence decodes one token, plus (step 1) a continuing prefill of 9 tokens on block 4.
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int n = (step == 1 && s == 3) ? 9 : 1;
      seqs[s] = {seqs[s].state_block, computed[s], n, n > 1};
      toks[s] = ids(n);
      computed[s] += n;
    }
  }
}

TEST(CudaMambaModel, LogitsMatchCpuWithF32Weights) { check_logits(DType::F32, 1e-4); }
TEST(CudaMambaModel, LogitsMatchCpuWithBf16Weights) { check_logits(DType::BF16, 3e-2); }

/// Mamba-2 with dummy weights (the same values on both backends) from a config alone.
void check_mamba2_dummy(const std::filesystem::path& cfg_dir, DType weight_dtype, double tol) {
  REQUIRE_GPU();
  SSM_SKIP_IF_NO_MODEL(cfg_dir);
  const ModelConfig cfg = ModelConfig::load(cfg_dir);
  auto cpu = load_model(cfg, LoadFormat::Dummy);
  auto gpu = cuda::load_mamba2_cuda(cfg, LoadFormat::Dummy, {weight_dtype});
  const std::string what = cfg_dir.filename().string() + (weight_dtype == DType::F32 ? " f32" : " bf16");
  check_steps(*cpu, *gpu, tol, what.c_str());
}

TEST(CudaMamba2Model, TinyShapeDummyWeightsF32) {
  check_mamba2_dummy(source_dir() / "tests/cuda/configs/tiny-mamba2", DType::F32, 1e-4);
}
TEST(CudaMamba2Model, TinyShapeDummyWeightsBf16) {
  check_mamba2_dummy(source_dir() / "tests/cuda/configs/tiny-mamba2", DType::BF16, 3e-2);
}
TEST(CudaMamba2Model, Mamba2_2_7bShapeDummyWeightsBf16) {
  if (cudatest::quick()) GTEST_SKIP() << "full size only";
  check_mamba2_dummy(source_dir() / "configs/mamba2-2.7b", DType::BF16, 5e-2);
}

/// The same prefill + 10 decode steps (alternately padded to 8 rows and unpadded, so two graph shapes are each
/// run eagerly, captured and replayed) on `eager` and `graphed`: logits must be bit-identical.
void check_graphs_equal_eager(CausalLM& eager, CausalLM& graphed, double tol = 0) {
  const int V = eager.config().vocab_size;
  StateCache a(eager.num_state_layers(), eager.state_shape(), 6), b(graphed.num_state_layers(), graphed.state_shape(), 6);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> tok(2, 50000);
  std::vector<ScheduledSeq> seqs = {{1, 0, 3, true}, {2, 0, 1, true}, {3, 0, 20, true}, {5, 0, 2, true}};
  std::vector<std::vector<int32_t>> toks;
  for (const auto& q : seqs) {
    toks.emplace_back(q.num_scheduled_tokens);
    for (auto& t : toks.back()) t = tok(rng);
  }
  for (int step = 0; step < 11; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ForwardBatch fb = make_step(seqs, toks, step % 2 ? 8 : 0, eager.chunk_size());
    fb.logits_indices.resize(seqs.size());  // one row per sequence (the last token of each)
    for (size_t i = 0; i < seqs.size(); ++i) fb.logits_indices[i] = fb.meta.query_start_loc[i + 1] - 1;
    std::vector<float> la(seqs.size() * V), lb(la.size());
    eager.forward(fb, a, la.data());
    graphed.forward(fb, b, lb.data());
    if (tol == 0) {
      ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "graph logits differ from eager";
    } else {  // max |a - b| within tol x max |a|
      double mx = 0, ma = 0;
      for (size_t i = 0; i < la.size(); ++i)
        mx = std::max(mx, std::fabs(static_cast<double>(la[i]) - lb[i])), ma = std::max(ma, std::fabs(static_cast<double>(la[i])));
      ASSERT_LE(mx, tol * ma) << "logits differ beyond the tolerance";
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i] = {seqs[i].state_block, seqs[i].num_computed_tokens + seqs[i].num_scheduled_tokens, 1, false};
      toks[i] = {tok(rng)};
    }
  }
}

TEST(CudaGraphs, DecodeStepsEqualEagerMamba1) {
  REQUIRE_GPU();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  const ModelConfig cfg = ModelConfig::load(dir);
  cuda::CudaModelOptions eager_opt, graph_opt;
  eager_opt.cuda_graphs = false;
  auto eager = cuda::load_mamba_cuda(cfg, LoadFormat::Auto, eager_opt);
  auto graphed = cuda::load_mamba_cuda(cfg, LoadFormat::Auto, graph_opt);
  check_graphs_equal_eager(*eager, *graphed);
}

/// The dataflow decode kernel: inside the decode graphs the same logits as eagerly, bit for bit, and within bf16
/// tolerance of the op-by-op chain (another summation order).
TEST(CudaGraphs, DataflowDecodeMamba1) {
  REQUIRE_GPU();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  const ModelConfig cfg = ModelConfig::load(dir);
  cuda::CudaModelOptions chain_opt, eager_opt, graph_opt;
  chain_opt.cuda_graphs = false, chain_opt.dataflow_decode = false;
  eager_opt.cuda_graphs = false, eager_opt.dataflow_decode = true;
  graph_opt.dataflow_decode = true;
  auto chain = cuda::load_mamba_cuda(cfg, LoadFormat::Auto, chain_opt);
  auto eager = cuda::load_mamba_cuda(cfg, LoadFormat::Auto, eager_opt);
  auto graphed = cuda::load_mamba_cuda(cfg, LoadFormat::Auto, graph_opt);
  check_graphs_equal_eager(*eager, *graphed);
  auto eager2 = cuda::load_mamba_cuda(cfg, LoadFormat::Auto, eager_opt);
  check_graphs_equal_eager(*chain, *eager2, 2e-2);
}

TEST(CudaGraphs, DecodeStepsEqualEagerMamba2) {
  REQUIRE_GPU();
  const auto dir = source_dir() / "tests/cuda/configs/tiny-mamba2";
  const ModelConfig cfg = ModelConfig::load(dir);
  cuda::CudaModelOptions eager_opt, graph_opt;
  eager_opt.cuda_graphs = false;
  auto eager = cuda::load_mamba2_cuda(cfg, LoadFormat::Dummy, eager_opt);
  auto graphed = cuda::load_mamba2_cuda(cfg, LoadFormat::Dummy, graph_opt);
  check_graphs_equal_eager(*eager, *graphed);
}

TEST(CudaMambaModel, GreedyGenerationMatchesCpuOnGoldenPrompts) {
  REQUIRE_GPU();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  cuda::register_cuda_backend();
  const auto golden = read_json(source_dir() / "tests/data/goldens/tiny-mamba.json");
  std::vector<std::vector<int>> prompts;
  for (const auto& p : golden["prompts"]) prompts.push_back(p["prompt_token_ids"].get<std::vector<int>>());
  SamplingParams sp;
  sp.temperature = 0.0;
  sp.ignore_eos = true;
  sp.logprobs = 2;
  sp.max_tokens = static_cast<int>(golden["prompts"][0]["greedy_token_ids"].size());
  auto run = [&](const std::string& device, int budget) {
    EngineConfig cfg;
    cfg.model = dir;
    cfg.device = device;
    cfg.scheduler.max_num_batched_tokens = budget;
    LLM llm(cfg);
    return llm.generate_ids(prompts, sp);
  };
  const auto ref = run("cpu", 2048);
  for (int budget : {2048, 7}) {
    SCOPED_TRACE(::testing::Message() << "budget " << budget);
    const auto got = run("cuda", budget);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const auto& r = ref[i].outputs.at(0);
      const auto& g = got[i].outputs.at(0);
      ASSERT_EQ(g.token_ids.size(), r.token_ids.size());
      for (size_t s = 0; s < r.token_ids.size(); ++s) {
        const double gap = r.logprobs.at(s).at(0).logprob - r.logprobs.at(s).at(1).logprob;
        if (g.token_ids[s] != r.token_ids[s]) {
          EXPECT_LT(gap, 0.05) << "prompt " << i << " step " << s << ": greedy token differs away from a near-tie";
          break;  // the continuations legitimately diverge after a near-tie
        }
        EXPECT_NEAR(g.logprobs.at(s).at(0).logprob, r.logprobs.at(s).at(0).logprob, 0.05) << "prompt " << i << " step " << s;
      }
    }
  }
}

}  // namespace
// Multi-step decode on the device (num_scheduler_steps: K steps in one graph, each step's picks fed into the next
// step's input ids by the greedy kernel, GreedyFeed): the same tokens and logprobs, bit for bit, as single steps, for
// Mamba-1 (op chain and the dataflow kernel) and Mamba-2, with requests admitted while others decode and
// max_tokens not a multiple of K.
TEST(CudaMultiStep, DecodeEqualsSingleSteps) {
  REQUIRE_GPU();
  cuda::register_cuda_backend();
  // tiny-mamba (bundled) and a dummy-weight model of tiny-mamba2's shape (its config travels with the repository).
  for (const char* name : {"tiny-mamba", "tiny-mamba2"}) {
    const bool mamba2 = std::string(name) == "tiny-mamba2";
    const auto dir = mamba2 ? testing::source_dir() / "tests/cuda/configs/tiny-mamba2" : model_dir(name);
    SSM_SKIP_IF_NO_MODEL(dir);
    for (const char* dataflow : {"0", "1"}) {
      if (mamba2 && dataflow[0] == '1') continue;
      SCOPED_TRACE(::testing::Message() << name << " dataflow " << dataflow);
      setenv("SSMSERVE_DECODE_DATAFLOW", dataflow, 1);
      std::vector<std::vector<int>> prompts = {{510, 5347, 273, 6181, 310}, {1231, 2220, 247, 673}, {42}, {7, 8, 9}};
      SamplingParams sp;
      sp.temperature = 0.0;
      sp.ignore_eos = true;
      sp.logprobs = 3;
      sp.max_tokens = 19;
      auto run = [&](int K) {
        return cudatest::generate_on_cuda(dir, prompts, sp, [&](EngineConfig& cfg) {
          cfg.scheduler.max_num_seqs = 3;
          cfg.num_scheduler_steps = K;
          if (mamba2) cfg.load_format = LoadFormat::Dummy;
        });
      };
      const auto want = run(1);
      for (int K : {2, 4}) cudatest::expect_identical_outputs(run(K), want, "K " + std::to_string(K));
      unsetenv("SSMSERVE_DECODE_DATAFLOW");
    }
  }
}

}  // namespace ssmserve
