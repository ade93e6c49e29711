// A hybrid built from a config alone on the GPU (issue 27): Mamba-2 and softmax-attention mixers interleaved, MoE
// FFNs on some layers and none on others, an embedding multiplier and logits scaling, dummy weights (the same values on both backends):
// the one GPU runner against the CPU decoder over ragged prefills, a continuing prefill and padded decode steps; decode
// steps through CUDA graphs bit-identical to eager; device greedy picks equal to the argmax of the logits. Skips
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "checkpoint_fixtures.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "decoder_vs_cpu.h"
#include "hybrid_schedule.h"
#include "model/attention_metadata.h"
#include "model/causal_lm.h"
#include "model/decoder/decoder_lm.h"
#include "runtime/cuda_decoder.h"

namespace ssmserve {
namespace {

constexpr int kLayers = 4, kHidden = 128, kVocab = 256;

ModelConfig hybrid_config(const std::filesystem::path& dir) {
  const nlohmann::json j = {{"architectures", {"HybridTestForCausalLM"}}, {"model_type", "hybrid_test"}, {"vocab_size", kVocab},
                            {"hidden_size", kHidden}, {"num_hidden_layers", kLayers}, {"layer_norm_epsilon", 1e-5},
                            {"tie_word_embeddings", true}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                            {"head_dim", 64}, {"rope_theta", 10000.0}};
  testing::write_file(dir / "config.json", j.dump());
  return ModelConfig::load(dir);
}

/// Layers: Mamba-2 + MoE, attention, Mamba-2, attention + MoE.
DecoderSpec hybrid_spec(const ModelConfig& cfg) {
  DecoderSpec s;
  s.label = "Hybrid";
  s.embedding = "model.embed_tokens.weight", s.final_norm = "model.norm.weight";
  s.tie_word_embeddings = true;
  s.norm_eps = 1e-5f;
  s.embedding_multiplier = 1.5f;
  s.logits_scaling = 2.0f;
  s.chunk_size = 16;
  s.module_params["mamba2"] = {{"num_heads", 4}, {"head_dim", 32}, {"state_size", 16}, {"n_groups", 2}, {"conv_kernel", 4}, {"chunk_size", 16}};
  s.module_params["moe"] = {{"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"intermediate_size", 64}};
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerSpec layer;
    const bool attn = l % 2 == 1;
    layer.mixer = {attn ? "attention" : "mamba2", p + "input_layernorm.weight", p + (attn ? "self_attn." : "mamba.")};
    if (l == 0 || l == 3) layer.ffn = {"moe", p + "post_attention_layernorm.weight", p + "block_sparse_moe."};
    s.layers.push_back(layer);
  }
  return s;
}

class CudaHybrid : public ::testing::Test {
 protected:
  testing::TempDir dir_{"cuda-hybrid"};
  ModelConfig cfg_ = hybrid_config(dir_.path());
  DecoderSpec spec_ = hybrid_spec(cfg_);
};

TEST_F(CudaHybrid, MatchesCpuDecoderF32) {
  REQUIRE_GPU();
  cudatest::check_decoder_against_cpu(cfg_, spec_, {DType::F32}, {"hybrid", kVocab, 3, 1e-3});
}

// bf16 weights against the CPU decoder rounding its GEMM inputs to bf16 where the GPU does (round_gemm_inputs_bf16):
// emulated (noise of 1e-7 to 1e-4 of the row rms on every CPU GEMM output, 5 seeds each) <= 3.8e-3 per step, against
// 4.6e-3 between the rounding and the plain CPU decoder.
TEST_F(CudaHybrid, MatchesCpuDecoderBf16) {
  REQUIRE_GPU();
  cudatest::check_decoder_against_cpu(cfg_, spec_, {DType::BF16}, {"hybrid", kVocab, 3, 1e-2});
}

TEST_F(CudaHybrid, DecodeGraphsEqualEagerAndGreedyIsArgmax) {
  REQUIRE_GPU();
  cuda::CudaModelOptions eager_opt, graph_opt;
  eager_opt.cuda_graphs = false;
  auto eager = cuda::load_cuda_decoder(cfg_, spec_, LoadFormat::Dummy, eager_opt);
  auto graphed = cuda::load_cuda_decoder(cfg_, spec_, LoadFormat::Dummy, graph_opt);
  StateCache a(1, eager->state_shape(), 32), b(1, graphed->state_shape(), 32);
  cudatest::HybridSchedule sched(eager->kv_block_size(), kVocab, 3);
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ForwardBatch fb = sched.batch(step, *eager);
    std::vector<float> la(fb.logits_indices.size() * kVocab), lb(la.size());
    eager->forward(fb, a, la.data());
    if (step < 4) {
      graphed->forward(fb, b, lb.data());
      ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "graph logits differ from eager";
    } else {  // the same steps as device greedy picks: the argmax of the eager logits (lowest id on ties)
      std::vector<GreedyPick> picks;
      ASSERT_TRUE(graphed->forward_greedy(fb, b, 2, picks));
      for (size_t r = 0; r < picks.size(); ++r) {
        const float* row = la.data() + r * kVocab;
        EXPECT_EQ(picks[r].token, static_cast<int>(std::max_element(row, row + kVocab) - row)) << "row " << r;
      }
    }
    sched.advance(step);
  }
}

TEST_F(CudaHybrid, LayerTypeTheGpuLacksIsAClearError) {
  REQUIRE_GPU();
  spec_.layers[1].ffn = {"gated_deltanet", "model.layers.1.post_attention_layernorm.weight", "model.layers.1.mlp."};
  try {
    cuda::load_cuda_decoder(cfg_, spec_, LoadFormat::Dummy);
    ADD_FAILURE() << "an unregistered layer type accepted on cuda";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer type \"gated_deltanet\" does not run on the GPU yet"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ssmserve
