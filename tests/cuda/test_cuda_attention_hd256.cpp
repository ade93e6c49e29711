// Softmax attention with 256-wide heads on the GPU at model level (Qwen3-Next / Qwen3.5's head_dim; the op level is
// CudaPagedAttention.HeadDim256MatchesCpu in test_cuda_minimax_ops.cpp): a hybrid built from a spec (Mamba-2 + MLP,
// attention + MLP, Mamba-2, attention + MLP: dense FFNs, since the GPU's MoE experts run in bf16 even with fp32 weights
// and would hide attention errors below ~1e-2) whose attention has 8 query heads over 2 KV heads of head_dim 256 with
// Qwen's options (output gate, q / k RMSNorm, a quarter of each head rotated); dummy weights (the same values on both
// backends): the GPU runner against the CPU decoder (fp32 weights: the split-KV fp32 pass; bf16: prefill rows on the
// tensor-core pass) over ragged prefills, a continuing prefill and padded decode steps (tests/cuda/hybrid_schedule.h),
// and decode steps through CUDA graphs bit-identical to eager. Also prints the paged attention op's times at head_dim
// 128 and 256 (Qwen3-Next's 16 query / 2 KV heads): batch-1 decode over long contexts, a 2048-token prefill on both
// passes (not checked; skipped with SSMSERVE_CUDA_TEST_QUICK=1). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "checkpoint_fixtures.h"
#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/paged_attention.h"
#include "decoder_vs_cpu.h"
#include "hybrid_schedule.h"
#include "model/attention_metadata.h"
#include "model/causal_lm.h"
#include "model/decoder/decoder_lm.h"
#include "runtime/cuda_decoder.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;

constexpr int kLayers = 4, kHidden = 128, kVocab = 256;

ModelConfig hd256_config(const std::filesystem::path& dir) {
  const nlohmann::json j = {{"architectures", {"Hd256TestForCausalLM"}}, {"model_type", "hd256_test"},
                            {"vocab_size", kVocab}, {"hidden_size", kHidden}, {"num_hidden_layers", kLayers},
                            {"layer_norm_epsilon", 1e-6}, {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", true}};
  testing::write_file(dir / "config.json", j.dump());
  return ModelConfig::load(dir);
}

/// Layers: Mamba-2 + MoE, attention + MoE, Mamba-2, attention + MoE; attention heads of 256.
DecoderSpec hd256_spec(const ModelConfig& cfg) {
  DecoderSpec s;
  s.label = "Hd256";
  s.embedding = "model.embed_tokens.weight", s.final_norm = "model.norm.weight";
  s.tie_word_embeddings = true;
  s.norm_eps = 1e-6f;
  s.chunk_size = 16;
  s.module_params["mamba2"] = {{"num_heads", 4}, {"head_dim", 32}, {"state_size", 16}, {"n_groups", 2}, {"conv_kernel", 4}, {"chunk_size", 16}};
  s.module_params["attention"] = {
      {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"head_dim", 256},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}}},
      {"attn_output_gate", true}, {"qk_norm", true}, {"qk_norm_weight_offset", 1.0}, {"rms_norm_eps", 1e-6}};
  s.module_params["mlp"] = {{"intermediate_size", 128}, {"hidden_act", "silu"}};
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerSpec layer;
    const bool attn = l % 2 == 1;
    layer.mixer = {attn ? "attention" : "mamba2", p + "input_layernorm.weight", p + (attn ? "self_attn." : "mamba.")};
    layer.ffn = {"mlp", p + "post_attention_layernorm.weight", p + "mlp."};
    s.layers.push_back(layer);
  }
  return s;
}

class CudaAttentionHd256 : public ::testing::Test {
 protected:
  testing::TempDir dir_{"cuda-attention-hd256"};
  ModelConfig cfg_ = hd256_config(dir_.path());
  DecoderSpec spec_ = hd256_spec(cfg_);
};

// fp32 weights: the schedule of tests/cuda/test_cuda_qwen_modules.cpp (64-wide heads there).
TEST_F(CudaAttentionHd256, MatchesCpuDecoderF32) {
  REQUIRE_GPU();
  check_decoder_against_cpu(cfg_, spec_, {DType::F32}, {"head_dim 256", kVocab, 7, 1e-4});
}

// bf16 weights against the CPU decoder rounding its GEMM inputs to bf16 where the GPU does (round_gemm_inputs_bf16):
// emulated (noise of 1e-7 to 1e-4 of the row rms on every CPU GEMM output, 5 seeds each) <= 4.6e-3 per step, against
// 5.2e-3 between the rounding and the plain CPU decoder; the tensor-core attention pass's own bf16 rounding is not
// emulated.
TEST_F(CudaAttentionHd256, MatchesCpuDecoderBf16) {
  REQUIRE_GPU();
  check_decoder_against_cpu(cfg_, spec_, {DType::BF16}, {"head_dim 256", kVocab, 7, 1e-2});
}

TEST_F(CudaAttentionHd256, DecodeGraphsEqualEager) {
  REQUIRE_GPU();
  cuda::CudaModelOptions eager_opt, graph_opt;
  eager_opt.cuda_graphs = false;
  auto eager = cuda::load_cuda_decoder(cfg_, spec_, LoadFormat::Dummy, eager_opt);
  auto graphed = cuda::load_cuda_decoder(cfg_, spec_, LoadFormat::Dummy, graph_opt);
  const int blocks = HybridSchedule::pool_blocks(eager->kv_block_size());
  StateCache a(1, eager->state_shape(), blocks), b(1, graphed->state_shape(), blocks);
  HybridSchedule sched(eager->kv_block_size(), kVocab, 7);
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

// ---- Op timings (printed) -----------------------------------------------------------------------------------------

/// Mean microseconds of one call of f over 20 calls after 3 warm-ups (CUDA events on the default stream).
template <class F>
double time_us(F&& f) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  SSM_CUDA_CHECK(cudaEventCreate(&a));
  SSM_CUDA_CHECK(cudaEventCreate(&b));
  SSM_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < 20; ++i) f();
  SSM_CUDA_CHECK(cudaEventRecord(b));
  SSM_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  SSM_CUDA_CHECK(cudaEventDestroy(a));
  SSM_CUDA_CHECK(cudaEventDestroy(b));
  return 1e3 * ms / 20;
}

TEST(CudaAttentionHd256Timing, DecodeAndPrefill) {
  REQUIRE_GPU();
  if (quick()) GTEST_SKIP() << "timings";
  const int heads = 16, KVH = 2, group = heads / KVH, bs = 16, P = 2048;
  for (int D : {128, 256}) {
    for (int L : {4096, 32768}) {
      // One sequence of L cached tokens in blocks 1 .. L / bs (random values; a cheap LCG: 130 MB at 256 x 32k).
      const int nb = L / bs;
      const int64_t W = int64_t{KVH} * D, page_bytes = 2 * bs * W * 4;
      std::vector<float> host(static_cast<size_t>(page_bytes / 4) * (nb + 1));
      uint32_t x = 12345u + D + L;
      for (auto& v : host) x = x * 1664525u + 1013904223u, v = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
      DeviceBuffer cache(host.size() * 4);
      cache.upload(host.data(), host.size() * 4);
      const KvCacheView kv{static_cast<std::byte*>(cache.data()), page_bytes, 0, bs, KVH, D};
      std::vector<int32_t> table(nb);
      for (int b = 0; b < nb; ++b) table[b] = b + 1;
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      std::mt19937 rng(7);
      auto run = [&](const std::vector<int32_t>& qsl, const std::vector<int32_t>& sl, const cuda::PagedAttentionPlan& plan) {
        const int64_t T = qsl.back(), QW = int64_t{heads} * D;
        DeviceBuffer dq = to_device(rand_vec(rng, T * QW)), dout(T * QW * 4), dqsl = to_device(qsl), dsl = to_device(sl),
                     dtab = to_device(table), dtasks = to_device(plan.tasks.empty() ? std::vector<int32_t>{0} : plan.tasks),
                     ditems = to_device(plan.items.empty() ? std::vector<int32_t>{0} : plan.items),
                     dtc = to_device(plan.tc_tiles.empty() ? std::vector<int32_t>{0} : plan.tc_tiles),
                     ws(std::max<size_t>(16, cuda::paged_attention_workspace_floats(plan.num_items, KVH, D) * 4));
        const cuda::PagedAttentionArgs a{heads, scale, nb, dqsl.as<int32_t>(), dsl.as<int32_t>(), dtab.as<int32_t>(),
                                         dtasks.as<int32_t>(), ditems.as<int32_t>(), plan.num_tasks, plan.num_items,
                                         plan.tokens_per_task, plan.key_split, dtc.as<int32_t>(), plan.num_tc_tiles, plan.tc_tokens};
        return time_us([&] {
          SSM_CUDA_CHECK(cuda::paged_attention(dq.as<float>(), QW, dout.as<float>(), QW, kv, a, ws.as<float>(), nullptr));
        });
      };
      const double us = run({0, 1}, {L}, cuda::PagedAttentionPlan::decode(1, L, group));
      std::printf("paged attention head_dim %d, %d/%d heads: decode batch 1, context %5d: %8.1f us, %6.0f GB/s of KV\n", D,
                  heads, KVH, L, us, 2.0 * L * W * 4 / us * 1e-3);
      if (L != 4096) continue;
      const double flops = 4.0 * heads * D * (double(P) * (P + 1) / 2);
      const double tc = run({0, P}, {P}, cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, P}, std::vector<int32_t>{P}, group,
                                                                         cuda::kTcMinTokens));
      const double f32 = run({0, P}, {P}, cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, P}, std::vector<int32_t>{P}, group));
      std::printf("paged attention head_dim %d, %d/%d heads: prefill %d tokens: tensor cores %8.1f us (%5.1f TFLOP/s), "
                  "fp32 split-KV %8.1f us (%5.1f TFLOP/s)\n", D, heads, KVH, P, tc, flops / tc * 1e-6, f32, flops / f32 * 1e-6);
    }
  }
}

}  // namespace
}  // namespace ssmserve
