// Model-level tests on the bundled tiny-mamba: a prefill of n tokens equals n decode steps (logits at every
// position and the final conv / SSM states of every layer), from a fresh state and from a non-zero state left
// by an earlier prompt; dummy weights load from a config alone.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <fmt/format.h>

#include "checkpoint_fixtures.h"
#include "core/error.h"
#include "model/causal_lm.h"
#include "model/checkpoint.h"
#include "model/weight.h"
#include "test_util.h"

namespace ssmserve {
namespace {

double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

// One sequence with `num_computed` tokens already in block `block` (a decode when it is one token on a state).
ForwardBatch one_sequence(const std::vector<int32_t>& ids, int block, bool init, bool all_logits) {
  const int n = static_cast<int>(ids.size());
  const ScheduledSeq seq{block, init ? 1 : 0, n, !(init && n == 1)};
  const std::vector<std::vector<int32_t>> tokens{ids};
  ForwardBatch b = make_forward_batch(std::span(&seq, 1), tokens, MetadataOptions{});
  for (int i = 0; i < n; ++i)
    if (all_logits || i + 1 == n) b.logits_indices.push_back(i);
  return b;
}

class ModelPrefillVsDecode : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(ModelPrefillVsDecode, LogitsAndStatesAgree) {
  const auto [n, warm] = GetParam();
  const auto dir = testing::model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  static std::unique_ptr<CausalLM> model = load_model(dir);
  const int V = model->config().vocab_size;
  StateCache a(model->num_state_layers(), model->state_shape(), 3), b(model->num_state_layers(), model->state_shape(), 3);
  std::mt19937 rng(n);
  std::uniform_int_distribution<int> tok(2, 50000);
  std::vector<float> scratch(V);
  if (warm) {  // leave a non-zero state in block 1 of both caches
    std::vector<int32_t> prefix(17);
    for (auto& t : prefix) t = tok(rng);
    model->forward(one_sequence(prefix, 1, false, false), a, scratch.data());
    model->forward(one_sequence(prefix, 1, false, false), b, scratch.data());
  }
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = tok(rng);
  std::vector<float> lp(static_cast<size_t>(n) * V), ld(static_cast<size_t>(n) * V);
  // Prefill: n tokens at once. Decode: the first token as a prefill when there is no state yet, then 1 by 1.
  model->forward(one_sequence(ids, 1, warm, true), a, lp.data());
  for (int i = 0; i < n; ++i) model->forward(one_sequence({ids[i]}, 1, warm || i > 0, true), b, ld.data() + static_cast<size_t>(i) * V);
  EXPECT_LT(max_abs_diff(lp.data(), ld.data(), lp.size()), 2e-4);
  const auto& sh = model->state_shape();
  for (int l = 0; l < model->num_state_layers(); ++l) {
    EXPECT_LT(max_abs_diff(state_to_f32(a.conv_state(l), 1, sh.conv_elems).data(), state_to_f32(b.conv_state(l), 1, sh.conv_elems).data(), sh.conv_elems), 1e-5) << "layer " << l;
    EXPECT_LT(max_abs_diff(state_to_f32(a.ssm_state(l), 1, sh.ssm_elems).data(), state_to_f32(b.ssm_state(l), 1, sh.ssm_elems).data(), sh.ssm_elems), 1e-4) << "layer " << l;
  }
}

INSTANTIATE_TEST_SUITE_P(Lengths, ModelPrefillVsDecode,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 64, 300), ::testing::Bool()));

TEST(MambaModel, DummyWeightsFromConfigAlone) {
  const auto cfg_dir = testing::source_dir() / "configs" / "mamba-130m";
  SSM_SKIP_IF_NO_MODEL(cfg_dir);
  auto model = load_model(cfg_dir, LoadFormat::Dummy);
  EXPECT_EQ(model->config().hidden_size, 768);
  EXPECT_EQ(model->num_state_layers(), 24);
  StateCache cache(model->num_state_layers(), model->state_shape(), 2);
  std::vector<float> logits(model->config().vocab_size);
  model->forward(one_sequence({1, 2, 3, 4}, 1, false, false), cache, logits.data());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST(MambaModel, RejectsTokenOutsideVocabulary) {
  const auto dir = testing::model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  auto model = load_model(dir);
  StateCache cache(model->num_state_layers(), model->state_shape(), 2);
  std::vector<float> logits(model->config().vocab_size);
  EXPECT_THROW(model->forward(one_sequence({model->config().vocab_size}, 1, false, false), cache, logits.data()), Error);
  EXPECT_THROW(model->forward(one_sequence({-1}, 1, false, false), cache, logits.data()), Error);
}

}  // namespace
}  // namespace ssmserve

namespace ssmserve {
namespace {

// Rewrites tiny-mamba's BF16 tensors as F32 (exact) split over two shards with model.safetensors.index.json,
// with an untied lm_head copy: the weights are the same numbers, so logits agree up to the summation order of
// the F32 and BF16 GEMV kernels.
TEST(MambaModel, F32ShardedUntiedCheckpointGivesIdenticalLogits) {
  const auto dir = testing::model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  testing::TempDir tmp("f32");
  const Checkpoint ckpt = Checkpoint::open(dir);
  std::vector<testing::FixtureTensor> shard[2];
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  int i = 0;
  auto add = [&](const std::string& name, const TensorRef& t) {
    const int s = i++ % 2;
    shard[s].push_back(testing::f32_tensor(name, t.shape, tensor_to_f32(t)));
    index["weight_map"][name] = fmt::format("model-{:05d}-of-00002.safetensors", s + 1);
  };
  for (const auto& name : ckpt.names()) add(name, *ckpt.find(name));
  const auto& emb = ckpt.get("backbone.embeddings.weight", {50280, 256});
  add("lm_head.weight", emb);
  for (int s = 0; s < 2; ++s) testing::write_safetensors(tmp / fmt::format("model-{:05d}-of-00002.safetensors", s + 1), shard[s]);
  testing::write_file(tmp / "model.safetensors.index.json", index.dump());
  auto cfg = testing::read_json(dir / "config.json");
  cfg["tie_word_embeddings"] = false;
  testing::write_file(tmp / "config.json", cfg.dump());

  auto a = load_model(dir), b = load_model(tmp.path());
  StateCache ca(a->num_state_layers(), a->state_shape(), 2), cb(b->num_state_layers(), b->state_shape(), 2);
  const std::vector<int32_t> ids = {510, 3158, 273, 253, 1533, 13};
  std::vector<float> la(6 * 50280), lb(6 * 50280);
  a->forward(one_sequence(ids, 1, false, true), ca, la.data());
  b->forward(one_sequence(ids, 1, false, true), cb, lb.data());
  EXPECT_LT(max_abs_diff(la.data(), lb.data(), la.size()), 1e-4);
}

}  // namespace
}  // namespace ssmserve
