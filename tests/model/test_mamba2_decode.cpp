// The Mamba-2 fused decode path (Mamba2Model::decode_layers: decode-only batches of up to 4 rows, every layer in
// one OpenMP region) against the per-op path that mixed batches take: the decode rows' logits and their conv and
// SSM states must be bit-identical, whatever the thread count (1 to 4) and for shapes whose conv channels, heads
// and groups do not line up with the 32-column GEMM panels the threads split.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "cache/state_cache.h"
#include "checkpoint_fixtures.h"
#include "config/model_config.h"
#include "model/batch_metadata.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"
#include "test_util.h"

namespace ssmserve {
namespace {

// hidden 36, 6 heads x 12 (d_inner 72), d_state 16, n_groups 3: conv_dim 168 and in_proj rows 246, neither a
// multiple of 32.
void write_odd_mamba2_config(const std::filesystem::path& dir, bool norm_before_gate) {
  nlohmann::json j = {{"architectures", {"Mamba2ForCausalLM"}}, {"model_type", "mamba2"}, {"hidden_size", 36},
                      {"num_heads", 6}, {"head_dim", 12}, {"expand", 2}, {"state_size", 16}, {"n_groups", 3},
                      {"num_hidden_layers", 3}, {"conv_kernel", 4}, {"chunk_size", 8}, {"vocab_size", 131},
                      {"layer_norm_epsilon", 1e-5}, {"norm_before_gate", norm_before_gate}, {"tie_word_embeddings", true},
                      {"eos_token_id", 0}};
  std::ofstream(dir / "config.json") << j.dump(2);
}

std::vector<int32_t> tokens_for(int seed, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = 1 + (seed * 37 + i * 11) % (vocab - 1);
  return t;
}

// One forward of `seqs` / `tokens`; returns the logits of the rows `want_rows` (row order of the batch).
std::vector<float> forward(CausalLM& m, StateCache& cache, const std::vector<ScheduledSeq>& seqs,
                           const std::vector<std::vector<int32_t>>& tokens, const std::vector<int32_t>& want_rows) {
  MetadataOptions opt;
  opt.chunk_size = m.chunk_size();
  ForwardBatch b = make_forward_batch(seqs, tokens, opt);
  b.logits_indices = want_rows;
  std::vector<float> logits(want_rows.size() * m.config().vocab_size);
  m.forward(b, cache, logits.data());
  return logits;
}

// Block `block`'s conv and SSM states (fp32 pools) are bit-identical in both caches, every layer.
bool same_bits(const StateCache& a, const StateCache& b, const StateShape& shape, int layers, int block) {
  for (int l = 0; l < layers; ++l) {
    if (std::memcmp(a.conv_state(l).block<float>(block), b.conv_state(l).block<float>(block), shape.conv_elems * sizeof(float)) != 0)
      return false;
    if (std::memcmp(a.ssm_state(l).block<float>(block), b.ssm_state(l).block<float>(block), shape.ssm_elems * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// Prompts of 9 and 5 tokens into blocks 1 and 2 of both caches; then `steps` decode steps: cache `fused` decodes
// the two rows alone (the fused path), cache `plain` decodes them next to a 3-token prefill into block 3 (the
// per-op path). Decode rows come first in a batch, so the logits rows 0 and 1 are the decodes in both.
void expect_fused_equals_plain(const std::filesystem::path& dir, LoadFormat format, int threads) {
  const ModelConfig cfg = ModelConfig::load(dir);
  auto m = load_model(cfg, format);
  const int V = cfg.vocab_size, L = m->num_state_layers();
  StateCache fused(L, m->state_shape(), 5), plain(L, m->state_shape(), 5);
  const std::vector<std::vector<int32_t>> prompts{tokens_for(1, 9, V), tokens_for(2, 5, V)};
  for (StateCache* c : {&fused, &plain})
    forward(*m, *c, {{1, 0, 9, true}, {2, 0, 5, true}}, prompts, {8, 13});
  struct ThreadsGuard {  // restores the thread count when an assertion returns early
    int saved = omp_get_max_threads();
    ~ThreadsGuard() { omp_set_num_threads(saved); }
  } guard;
  omp_set_num_threads(threads);
  for (int step = 0; step < 4; ++step) {
    const std::vector<std::vector<int32_t>> next{{static_cast<int32_t>(3 + step)}, {static_cast<int32_t>(40 + step)}};
    const std::vector<ScheduledSeq> decodes{{1, 9 + step, 1, false}, {2, 5 + step, 1, false}};
    const auto a = forward(*m, fused, decodes, next, {0, 1});
    std::vector<ScheduledSeq> mixed = decodes;
    mixed.push_back({3, 0, 3, true});
    std::vector<std::vector<int32_t>> mixed_tokens = next;
    mixed_tokens.push_back(tokens_for(3 + step, 3, V));
    const auto b = forward(*m, plain, mixed, mixed_tokens, {0, 1});
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << dir << ", " << threads << " threads, step " << step;
    for (int block : {1, 2}) ASSERT_TRUE(same_bits(fused, plain, m->state_shape(), L, block)) << "state of block " << block << ", step " << step;
  }
}

TEST(Mamba2FusedDecode, BitIdenticalToPerOpPathOddShape) {
  testing::TempDir tmp("m2-fused");
  write_odd_mamba2_config(tmp.path(), false);
  for (int threads : {1, 2, 3, 4}) expect_fused_equals_plain(tmp.path(), LoadFormat::Dummy, threads);
}

TEST(Mamba2FusedDecode, BitIdenticalToPerOpPathNormBeforeGate) {
  testing::TempDir tmp("m2-fused-nbg");
  write_odd_mamba2_config(tmp.path(), true);
  for (int threads : {2, 3}) expect_fused_equals_plain(tmp.path(), LoadFormat::Dummy, threads);
}

TEST(Mamba2FusedDecode, BitIdenticalToPerOpPathTinyMamba2) {
  const auto dir = testing::model_dir("tiny-mamba2");
  SSM_SKIP_IF_NO_MODEL(dir);
  for (int threads : {1, 2}) expect_fused_equals_plain(dir, LoadFormat::Auto, threads);
}

}  // namespace
}  // namespace ssmserve
