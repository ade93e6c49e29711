// The Mamba hybrids on the GPU (issue 30): Granite-4.0-H and Nemotron-H (the small trained checkpoints) and Bamba,
// Jamba, dense Granite with RoPE, Nemotron-H with grouped sigmoid routing and Falcon-H1 (dummy weights from
// tests/data/tiny-hybrids, the configs of the CPU goldens): the one GPU runner against the CPU decoder over ragged
// prefills, a continuing prefill and padded decode steps (fp32 and bf16 weights); decode steps through CUDA graphs
// bit-identical to eager; and on the trained checkpoints the engine's greedy generation on the GPU against the
// transformers goldens, alone and under chunked prefill. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "hybrid_schedule.h"
#include "engine/llm_engine.h"
#include "model/attention_metadata.h"
#include "model/causal_lm.h"
#include "runtime/cuda_decoder.h"
#include "runtime/cuda_mamba.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using testing::model_dir;
using testing::read_json;
using testing::source_dir;

struct HybridCase {
  const char* name;
  bool dummy;  // tests/data/tiny-hybrids/<name> with dummy weights, else ../shared/models/<name>
};

std::string case_name(const ::testing::TestParamInfo<HybridCase>& info) {
  std::string n = info.param.name;
  for (char& c : n)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

std::filesystem::path case_dir(const HybridCase& c) {
  return c.dummy ? source_dir() / "tests/data/tiny-hybrids" / c.name : model_dir(c.name);
}

class CudaHybridModel : public ::testing::TestWithParam<HybridCase> {
 protected:
  void SetUp() override {
    dir_ = case_dir(GetParam());
    if (!std::filesystem::exists(dir_ / "config.json")) GTEST_SKIP() << "no model at " << dir_;
    cfg_ = ModelConfig::load(dir_);
    format_ = GetParam().dummy ? LoadFormat::Dummy : LoadFormat::Auto;
  }
  void against_cpu(DType wd, double tol) {
    auto cpu = load_model(cfg_, format_);
    auto gpu = cuda::load_cuda_decoder(cfg_, architecture_spec(cfg_), format_, {wd});
    ASSERT_EQ(gpu->kv_block_size(), cpu->kv_block_size());
    StateCache cc(cpu->num_state_layers(), cpu->state_shape(), 32), gc(gpu->num_state_layers(), gpu->state_shape(), 32);
    cudatest::HybridSchedule sched(cpu->kv_block_size(), 50000, 5);
    const int V = cfg_.vocab_size;
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      ForwardBatch b = sched.batch(step, *cpu);
      std::vector<float> lc(b.logits_indices.size() * V), lg(lc.size());
      cpu->forward(b, cc, lc.data());
      gpu->forward(b, gc, lg.data());
      const double e = cudatest::logits_rel_err(lg, lc);
      std::printf("%s %s step %d: logits rel err %.3g\n", GetParam().name, wd == DType::F32 ? "f32" : "bf16", step, e);
      EXPECT_LT(e, tol);
      sched.advance(step);
    }
  }
  std::filesystem::path dir_;
  ModelConfig cfg_;
  LoadFormat format_ = LoadFormat::Auto;
};

// fp32 weights: every op in fp32 on the GPU, the MoE experts included (fp32 GEMVs, kernels/cuda/moe.h), so only the
// summation order differs from the CPU: 1e-4 (measured <= 1e-6 without MoE, 2.4e-6 for tiny-qwen3_next-dense on the
// H200). bf16 experts (x and the activations rounded) gave 1.6e-3 on the trained MoE checkpoints and 0.029 on dummy
// tiny-qwen3_next, its random router flipping top-k choices at logit margins of a few 1e-3 and the DeltaNet states
// carrying the difference on; this bound tells the two apart.
TEST_P(CudaHybridModel, MatchesCpuF32) {
  REQUIRE_GPU();
  against_cpu(DType::F32, 1e-4);
}

// bf16 weights: every GEMM input rounded to bf16 on the GPU (the CPU keeps fp32 activations), 5e-2. Known gap: dummy
// tiny-qwen3_next exceeds it, and not through its MoE. A CPU decoder with its GEMM inputs rounded to bf16 (all but the
// router's) reproduces the numbers measured on the H200 (0.21 and 0.073 at steps 4 and 5; with fp32 weights and bf16
// experts only, 0.029 and 0.0106 at steps 0 and 5) and gives 0.058 for tiny-qwen3_next-dense (no MoE) and 0.08 with
// every expert chosen (top_k = num_experts: no choice to flip), against <= 0.03 for dummy tiny-qwen3_5: the random
// Qwen3-Next weights amplify bf16 rounding; the random router then flips near-ties (first flips at logit margins 5e-4
// to 2e-2), and computing the experts from fp32 activations changes neither.
TEST_P(CudaHybridModel, MatchesCpuBf16) {
  REQUIRE_GPU();
  against_cpu(DType::BF16, 5e-2);
}

TEST_P(CudaHybridModel, DecodeGraphsEqualEager) {
  REQUIRE_GPU();
  cuda::CudaModelOptions eager_opt, graph_opt;
  eager_opt.cuda_graphs = false;
  const DecoderSpec spec = architecture_spec(cfg_);
  auto eager = cuda::load_cuda_decoder(cfg_, spec, format_, eager_opt);
  auto graphed = cuda::load_cuda_decoder(cfg_, spec, format_, graph_opt);
  StateCache a(eager->num_state_layers(), eager->state_shape(), 32), b(graphed->num_state_layers(), graphed->state_shape(), 32);
  cudatest::HybridSchedule sched(eager->kv_block_size(), 50000, 5);
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ForwardBatch fb = sched.batch(step, *eager);
    std::vector<float> la(fb.logits_indices.size() * cfg_.vocab_size), lb(la.size());
    eager->forward(fb, a, la.data());
    graphed->forward(fb, b, lb.data());
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "graph logits differ from eager";
    sched.advance(step);
  }
}

INSTANTIATE_TEST_SUITE_P(Hybrids, CudaHybridModel,
                         ::testing::Values(HybridCase{"tiny-granitemoehybrid", false}, HybridCase{"tiny-nemotron_h", false},
                                           HybridCase{"tiny-bamba", true}, HybridCase{"tiny-jamba", true},
                                           HybridCase{"tiny-granite-dense", true}, HybridCase{"tiny-nemotron_h-pattern", true},
                                           HybridCase{"tiny-falcon_h1", true}, HybridCase{"tiny-qwen3_5_moe", false},
                                           HybridCase{"tiny-qwen3_5", true}, HybridCase{"tiny-qwen3_next", true},
                                           HybridCase{"tiny-qwen3_next-dense", true}),
                         case_name);

/// The engine on the GPU against the transformers goldens: greedy ids identical (a divergence only at a reference
/// top-2 gap below 0.05) and greedy logprobs within 0.05, all prompts batched, with and without chunked prefill.
/// Trained checkpoints only: the engine runs bf16 weights, whose rounding flips near-ties on random dummy weights.
class CudaHybridGolden : public ::testing::TestWithParam<HybridCase> {};

TEST_P(CudaHybridGolden, GreedyMatchesTransformers) {
  REQUIRE_GPU();
  const auto dir = case_dir(GetParam());
  SSM_SKIP_IF_NO_MODEL(dir);
  cuda::register_cuda_backend();
  const std::string name = GetParam().name;
  const auto golden = read_json(source_dir() / "tests/data/goldens" / (name + ".json"));
  std::vector<std::vector<int>> prompts;
  for (const auto& p : golden["prompts"]) prompts.push_back(p["prompt_token_ids"].get<std::vector<int>>());
  SamplingParams sp;
  sp.temperature = 0.0;
  sp.ignore_eos = true;
  sp.logprobs = 1;
  sp.max_tokens = static_cast<int>(golden["prompts"][0]["greedy_token_ids"].size());
  for (int budget : {2048, 7}) {
    SCOPED_TRACE(::testing::Message() << "budget " << budget);
    EngineConfig cfg;
    cfg.model = dir;
    cfg.device = "cuda";
    cfg.scheduler.max_num_batched_tokens = budget;
    LLM llm(cfg);
    const auto got = llm.generate_ids(prompts, sp);
    ASSERT_EQ(got.size(), prompts.size());
    int identical = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const auto& g = golden["prompts"][i];
      const auto& o = got[i].outputs.at(0);
      bool same = true;
      for (size_t s = 0; s < o.token_ids.size(); ++s) {
        if (o.token_ids[s] != g["greedy_token_ids"][s].get<int>()) {
          EXPECT_LT(g["top2_gap"][s].get<double>(), 0.05) << "prompt " << i << " step " << s << ": greedy token differs away from a near-tie";
          same = false;
          break;
        }
        EXPECT_NEAR(o.logprobs.at(s).at(0).logprob, g["greedy_logprobs"][s].get<double>(), 0.05) << "prompt " << i << " step " << s;
      }
      identical += same;
    }
    std::printf("%s budget %d: %d of %zu greedy continuations identical to transformers\n", name.c_str(), budget, identical, got.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, CudaHybridGolden,
                         ::testing::Values(HybridCase{"tiny-granitemoehybrid", false}, HybridCase{"tiny-nemotron_h", false},
                                           HybridCase{"tiny-qwen3_5_moe", false}),
                         case_name);

}  // namespace
}  // namespace ssmserve
