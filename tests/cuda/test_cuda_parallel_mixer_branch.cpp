// Falcon-H1's attention on the GPU runner's second branch beside its Mamba-2 mixer (CudaModelOptions::
// parallel_mixer_branch) at the 7B config's shapes (configs/falcon-h1-7b with dummy weights, 2 of its 44 layers and a
// 4096-row vocabulary): its plain residuals (the Mamba-2 output added on the main stream before the join, while the
// attention runs), long contexts (the tensor-core prefill pass on the branch beside the chunked SSD; split-KV decode
// with its partials in the branch's own workspace) and decode steps through CUDA graphs (each shape run eagerly,
// captured, replayed): logits bit-identical to one stream, in the default and the batch-invariant mode. The tiny
// Falcon-H1's scaled residuals: test_cuda_hybrid_models.cpp (ParallelMixerBranchEqualsOneStream). Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "model/batch_builder.h"
#include "model/causal_lm.h"
#include "model/decoder/decoder_spec.h"
#include "runtime/cuda_decoder.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using testing::read_json;
using testing::source_dir;

/// configs/falcon-h1-7b with 2 layers and a 4096-row vocabulary (dummy weights: the load reads no tensor).
ModelConfig falcon_h1_7b_two_layers() {
  const auto dir = source_dir() / "configs/falcon-h1-7b";
  nlohmann::json j = read_json(dir / "config.json");
  j["num_hidden_layers"] = 2;
  j["vocab_size"] = 4096;
  return ModelConfig::from_json(j, dir);
}

/// Logits of every real row of 10 steps: step 0 prefills 1500 and 300 tokens, step 1 decodes the first while the
/// second continues with 200, steps 2-9 decode both, padded to 4 rows at even steps (two decode shapes, each run
/// eagerly, then captured, then replayed when graphs are on). The same token ids every call.
std::vector<std::vector<float>> run_steps(CausalLM& m) {
  const int V = m.config().vocab_size, bs = m.kv_block_size();
  if (bs <= 0) {
    ADD_FAILURE() << "Falcon-H1 without a KV block size";
    return {};
  }
  const int per = 2100 / bs + 2;  // KV blocks per sequence (at most 1500 + 9 tokens), with room to spare
  StateCache cache(m.num_state_layers(), m.state_shape(), 4 + 2 * per);
  std::vector<std::vector<int32_t>> tables(2);
  for (int s = 0; s < 2; ++s)
    for (int b = 0; b < per; ++b) tables[s].push_back(3 + s + 2 * b);
  std::mt19937 rng(7);
  auto ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = static_cast<int32_t>(rng() % static_cast<unsigned>(V));
    return v;
  };
  std::vector<ScheduledSeq> seqs = {{1, 0, 1500, true}, {2, 0, 300, true}};
  std::vector<std::vector<int32_t>> toks = {ids(1500), ids(300)};
  std::vector<std::vector<float>> out;
  for (int step = 0; step < 10; ++step) {
    BatchBuilderOptions bo;
    bo.meta.chunk_size = m.chunk_size();
    bo.meta.pad_decodes_to = step >= 2 && step % 2 == 0 ? 4 : 0;
    bo.kv_block_size = bs;
    bo.linear_attention = m.has_linear_attention();
    ForwardBatch fb = build_forward_batch(seqs, toks, tables, bo);
    for (int i = 0; i < fb.num_tokens(); ++i)
      if (i < fb.meta.num_decodes || i >= fb.prefill_token_offset()) fb.logits_indices.push_back(i);
    out.emplace_back(fb.logits_indices.size() * static_cast<size_t>(V));
    m.forward(fb, cache, out.back().data());
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int n = step == 0 && s == 1 ? 200 : 1;
      seqs[s] = {seqs[s].state_block, seqs[s].num_computed_tokens + seqs[s].num_scheduled_tokens, n, n > 1};
      toks[s] = ids(n);
    }
  }
  return out;
}

/// The attention on the branch (a) against one stream (b), options otherwise `base`: every step's logits bit-identical.
void expect_branch_equals_one_stream(const ModelConfig& cfg, cuda::CudaModelOptions base, const char* what) {
  SCOPED_TRACE(what);
  const DecoderSpec spec = architecture_spec(cfg);
  cuda::CudaModelOptions on = base, off = base;
  on.parallel_mixer_branch = true, off.parallel_mixer_branch = false;
  auto a = cuda::load_cuda_decoder(cfg, spec, LoadFormat::Dummy, on);
  auto b = cuda::load_cuda_decoder(cfg, spec, LoadFormat::Dummy, off);
  // The branch is taken: its module's scratch pool is a second one, so the state budget is smaller (nothing is
  // allocated between the two reads of the free memory).
  const auto budget_on = a->device_state_budget(0.9, 8192, 16), budget_off = b->device_state_budget(0.9, 8192, 16);
  ASSERT_TRUE(budget_on && budget_off);
  EXPECT_LT(*budget_on, *budget_off) << "the runner with parallel_mixer_branch has no second scratch pool";
  const auto la = run_steps(*a), lb = run_steps(*b);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t s = 0; s < la.size(); ++s) {
    ASSERT_EQ(la[s].size(), lb[s].size());
    EXPECT_EQ(std::memcmp(la[s].data(), lb[s].data(), la[s].size() * sizeof(float)), 0)
        << "step " << s << ": logits with the attention on a second branch differ from one stream";
  }
}

TEST(CudaParallelMixerBranch, Falcon7bShapesEqualOneStream) {
  REQUIRE_GPU();
  const ModelConfig cfg = falcon_h1_7b_two_layers();
  const LayerSpec& l0 = architecture_spec(cfg).layers.at(0);
  ASSERT_TRUE(l0.parallel_mixer.present());
  ASSERT_TRUE(l0.mixer.plain_residual() && l0.parallel_mixer.plain_residual()) << "the 7B config's multipliers are 1";
  expect_branch_equals_one_stream(cfg, {}, "default options (bf16, graphs, PDL)");
  cuda::CudaModelOptions bi;
  bi.batch_invariant = true;
  expect_branch_equals_one_stream(cfg, bi, "batch-invariant");
}

}  // namespace
}  // namespace ssmserve
