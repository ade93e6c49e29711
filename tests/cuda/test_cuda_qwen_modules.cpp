// Qwen3-Next / Qwen3.5's attention and MoE options on the GPU against the CPU modules (tests/model/test_qwen_modules.cpp
// checks the CPU against a double-precision reference). Model level: a hybrid built from a spec (Mamba-2 + MoE,
// attention + MoE, Mamba-2, attention + MoE) whose attention has attn_output_gate, qk_norm with
// qk_norm_weight_offset 1, partial rotary (a quarter of each 64-wide head) and M-RoPE fields, and whose MoE has
// moe_layout "qwen" with the sigmoid-gated shared expert; dummy weights (the same values on both backends, the
// per-expert names): the GPU runner against the CPU decoder (fp32 and bf16 weights) over ragged prefills, a
// continuing prefill and padded decode steps; decode steps through CUDA graphs bit-identical to eager. Op level: the
// per-head q / k RMSNorm (kernels/cuda/head_rms_norm.h) and the shared expert's gated add (activations.h) against
// their CPU forms, each bit-identical whatever the batch; head_rms_norm_qk (q and k heads in one launch) bit-identical
// to two launches. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "checkpoint_fixtures.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "decoder_vs_cpu.h"
#include "hybrid_schedule.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/head_rms_norm.h"
#include "model/attention_metadata.h"
#include "model/causal_lm.h"
#include "model/decoder/decoder_lm.h"
#include "runtime/cuda_decoder.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

constexpr int kLayers = 4, kHidden = 128, kVocab = 256;

ModelConfig qwen_config(const std::filesystem::path& dir) {
  const nlohmann::json j = {{"architectures", {"QwenModulesTestForCausalLM"}}, {"model_type", "qwen_modules_test"},
                            {"vocab_size", kVocab}, {"hidden_size", kHidden}, {"num_hidden_layers", kLayers},
                            {"layer_norm_epsilon", 1e-6}, {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", true}};
  testing::write_file(dir / "config.json", j.dump());
  return ModelConfig::load(dir);
}

/// Layers: Mamba-2 + MoE, attention + MoE, Mamba-2, attention + MoE; the Qwen options on every attention and MoE.
DecoderSpec qwen_spec(const ModelConfig& cfg) {
  DecoderSpec s;
  s.label = "QwenModules";
  s.embedding = "model.embed_tokens.weight", s.final_norm = "model.norm.weight";
  s.tie_word_embeddings = true;
  s.norm_eps = 1e-6f;
  s.chunk_size = 16;
  s.module_params["mamba2"] = {{"num_heads", 4}, {"head_dim", 32}, {"state_size", 16}, {"n_groups", 2}, {"conv_kernel", 4}, {"chunk_size", 16}};
  s.module_params["attention"] = {
      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25},
                           {"mrope_interleaved", true}, {"mrope_section", {3, 3, 2}}}},
      {"attn_output_gate", true}, {"qk_norm", true}, {"qk_norm_weight_offset", 1.0}, {"rms_norm_eps", 1e-6}};
  s.module_params["moe"] = {{"num_local_experts", 8}, {"num_experts_per_tok", 2}, {"intermediate_size", 64}, {"moe_layout", "qwen"},
                            {"shared_intermediate_size", 32}, {"shared_expert_gate", true}};
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerSpec layer;
    const bool attn = l % 2 == 1;
    layer.mixer = {attn ? "attention" : "mamba2", p + "input_layernorm.weight", p + (attn ? "self_attn." : "mamba.")};
    if (l != 2) layer.ffn = {"moe", p + "post_attention_layernorm.weight", p + "mlp."};
    s.layers.push_back(layer);
  }
  return s;
}

class CudaQwenModules : public ::testing::Test {
 protected:
  testing::TempDir dir_{"cuda-qwen-modules"};
  ModelConfig cfg_ = qwen_config(dir_.path());
  DecoderSpec spec_ = qwen_spec(cfg_);
};

// fp32 weights: the bound of tests/cuda/test_cuda_hybrid.cpp (the same schedule and the same GPU paths around the new
// options).
TEST_F(CudaQwenModules, MatchesCpuDecoderF32) {
  REQUIRE_GPU();
  check_decoder_against_cpu(cfg_, spec_, {DType::F32}, {"qwen modules", kVocab, 5, 1e-3});
}

// bf16 weights against the CPU decoder rounding its GEMM inputs to bf16 where the GPU does (round_gemm_inputs_bf16):
// emulated (noise of 1e-7 to 1e-4 of the row rms on every CPU GEMM output, 5 seeds each) <= 4.6e-3 per step and a
// median over the steps <= 4e-3, but once in 20 runs a router near-tie flipped at step 0 (0.031): a per-step bound that
// admits it and a median that does not (0.027 between the rounding and the plain CPU decoder at step 0).
TEST_F(CudaQwenModules, MatchesCpuDecoderBf16) {
  REQUIRE_GPU();
  check_decoder_against_cpu(cfg_, spec_, {DType::BF16}, {"qwen modules", kVocab, 5, 4e-2, 8e-3});
}

TEST_F(CudaQwenModules, DecodeGraphsEqualEager) {
  REQUIRE_GPU();
  cuda::CudaModelOptions eager_opt, graph_opt;
  eager_opt.cuda_graphs = false;
  auto eager = cuda::load_cuda_decoder(cfg_, spec_, LoadFormat::Dummy, eager_opt);
  auto graphed = cuda::load_cuda_decoder(cfg_, spec_, LoadFormat::Dummy, graph_opt);
  StateCache a(1, eager->state_shape(), 32), b(1, graphed->state_shape(), 32);
  HybridSchedule sched(eager->kv_block_size(), kVocab, 5);
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ForwardBatch fb = sched.batch(step, *eager);
    std::vector<float> la(fb.logits_indices.size() * kVocab), lb(la.size());
    eager->forward(fb, a, la.data());
    graphed->forward(fb, b, lb.data());
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "graph logits differ from eager";
    sched.advance(step);
  }
}

// ---- Ops ---------------------------------------------------------------------------------------------------------

TEST(CudaQwenOps, HeadRmsNormMatchesCpuAndIsBatchInvariant) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // Qwen3.5 (16 query heads / 2 KV heads of 256), Qwen3-Next (16 / 2 of 256), 64- and 128-wide heads.
  for (int D : {64, 128, 256}) {
    for (int heads : {2, 16}) {
      SCOPED_TRACE(::testing::Message() << "head_dim " << D << " heads " << heads);
      const int64_t T = 37, W = int64_t{heads} * D, xs = W + 32;  // a strided row, as q inside a wider buffer
      auto x = rand_vec(rng, T * xs, -3.0f, 3.0f);
      auto w = rand_vec(rng, D, 0.5f, 1.5f);
      std::vector<float> ref = x;
      for (int64_t t = 0; t < T; ++t) cpu::rms_norm(ref.data() + t * xs, w.data(), 1e-6f, heads, D, ref.data() + t * xs);
      DeviceBuffer dx = to_device(x), dw = to_device(w);
      SSM_CUDA_CHECK(cuda::head_rms_norm(dx.as<float>(), xs, T, heads, D, dw.as<float>(), 1e-6f, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = to_host<float>(dx, T * xs);
      EXPECT_LT(rel_err(got.data(), xs, ref.data(), xs, T, xs), 1e-6);
      for (int64_t t = 0; t < T; ++t)  // the padding columns untouched
        for (int64_t c = W; c < xs; ++c) ASSERT_EQ(got[t * xs + c], x[t * xs + c]);
      // Token 5 alone gives the bits it got inside the batch of 37.
      DeviceBuffer one = to_device(std::vector<float>(x.begin() + 5 * xs, x.begin() + 6 * xs));
      SSM_CUDA_CHECK(cuda::head_rms_norm(one.as<float>(), xs, 1, heads, D, dw.as<float>(), 1e-6f, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto alone = to_host<float>(one, xs);
      EXPECT_EQ(std::memcmp(alone.data(), got.data() + 5 * xs, xs * sizeof(float)), 0);
    }
  }
  DeviceBuffer d(64 * 4);
  EXPECT_EQ(cuda::head_rms_norm(d.as<float>(), 32, 1, 1, 63, d.as<float>(), 1e-6f, nullptr), cudaErrorInvalidValue);  // odd D
  EXPECT_EQ(cuda::head_rms_norm(d.as<float>(), 32, 1, 2, 32, d.as<float>(), 1e-6f, nullptr), cudaErrorInvalidValue);  // stride
}

// The fused attention projection's q / k norms in one launch (cuda_attention.cpp): rows [q heads | k heads | v ...]
// at a wider stride, bit-identical to head_rms_norm on the q heads, then on the k heads, and v untouched.
TEST(CudaQwenOps, HeadRmsNormQkEqualsTwoLaunches) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int D : {64, 256}) {
    const int qh = 16, kh = 2;
    const int64_t T = 19, xs = int64_t{qh + 2 * kh} * D + 16;  // q, k, v heads and padding per row
    auto x = rand_vec(rng, T * xs, -3.0f, 3.0f);
    auto wq = rand_vec(rng, D, 0.5f, 1.5f), wk = rand_vec(rng, D, 0.5f, 1.5f);
    DeviceBuffer a = to_device(x), b = to_device(x), dq = to_device(wq), dk = to_device(wk);
    SSM_CUDA_CHECK(cuda::head_rms_norm(a.as<float>(), xs, T, qh, D, dq.as<float>(), 1e-6f, nullptr));
    SSM_CUDA_CHECK(cuda::head_rms_norm(a.as<float>() + int64_t{qh} * D, xs, T, kh, D, dk.as<float>(), 1e-6f, nullptr));
    SSM_CUDA_CHECK(cuda::head_rms_norm_qk(b.as<float>(), xs, T, qh, kh, D, dq.as<float>(), dk.as<float>(), 1e-6f, nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto two = to_host<float>(a, T * xs), one = to_host<float>(b, T * xs);
    EXPECT_EQ(std::memcmp(two.data(), one.data(), two.size() * sizeof(float)), 0) << "head_dim " << D;
    for (int64_t t = 0; t < T; ++t)  // v and the padding untouched
      for (int64_t c = int64_t{qh + kh} * D; c < xs; ++c) ASSERT_EQ(one[t * xs + c], x[t * xs + c]);
  }
  DeviceBuffer d(64 * 4);
  EXPECT_EQ(cuda::head_rms_norm_qk(d.as<float>(), 64, 1, 1, 2, 32, d.as<float>(), d.as<float>(), 1e-6f, nullptr),
            cudaErrorInvalidValue);  // stride < 3 heads
  EXPECT_EQ(cuda::head_rms_norm_qk(d.as<float>(), 64, 1, 1, 1, 32, d.as<float>(), nullptr, 1e-6f, nullptr),
            cudaErrorInvalidValue);  // no k weight
}

TEST(CudaQwenOps, SharedExpertGatedAddMatchesCpuAndIsBatchInvariant) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t H : {int64_t{128}, int64_t{2048}, int64_t{200}}) {  // 200: a tail of the 256-thread block
    SCOPED_TRACE(::testing::Message() << "hidden " << H);
    const int64_t T = 19, xs = H + 4, ys = H + 8, os = H + 12;
    auto x = rand_vec(rng, T * xs), y = rand_vec(rng, T * ys), out = rand_vec(rng, T * os);
    auto w = rand_vec(rng, H, -2.0f / std::sqrt(static_cast<float>(H)), 2.0f / std::sqrt(static_cast<float>(H)));
    std::vector<float> ref = out;
    for (int64_t t = 0; t < T; ++t) {  // model/ffns/moe_ffn.cpp's arithmetic
      double d = 0;
      for (int64_t c = 0; c < H; ++c) d += static_cast<double>(x[t * xs + c]) * w[c];
      const double s = 1.0 / (1.0 + std::exp(-d));
      for (int64_t c = 0; c < H; ++c) ref[t * os + c] = static_cast<float>(out[t * os + c] + s * y[t * ys + c]);
    }
    DeviceBuffer dx = to_device(x), dy = to_device(y), dw = to_device(w), dout = to_device(out);
    SSM_CUDA_CHECK(cuda::sigmoid_gated_add(dout.as<float>(), os, dy.as<float>(), ys, dx.as<float>(), xs, dw.as<float>(), T, H, nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<float>(dout, T * os);
    EXPECT_LT(rel_err(got.data(), os, ref.data(), os, T, H), 1e-6);
    // Row 7 alone: the same bits.
    DeviceBuffer ox = to_device(std::vector<float>(x.begin() + 7 * xs, x.begin() + 8 * xs)),
                 oy = to_device(std::vector<float>(y.begin() + 7 * ys, y.begin() + 8 * ys)),
                 oo = to_device(std::vector<float>(out.begin() + 7 * os, out.begin() + 8 * os));
    SSM_CUDA_CHECK(cuda::sigmoid_gated_add(oo.as<float>(), os, oy.as<float>(), ys, ox.as<float>(), xs, dw.as<float>(), 1, H, nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto alone = to_host<float>(oo, os);
    EXPECT_EQ(std::memcmp(alone.data(), got.data() + 7 * os, H * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace ssmserve
