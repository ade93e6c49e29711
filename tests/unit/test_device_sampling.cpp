// Tests the host side of device sampling (engine/device_sampling.h): packed logit modifications reproduce
// process_logits bit for bit, row fields follow SamplingParams, errors match the CPU sampler and leave the packer
// reusable; sample_token_with_uniform equals sample_token fed the same uniform.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "engine/device_sampling.h"
#include "engine/sampler.h"

namespace ssmserve {
namespace {

/// Random sampling params touching every step-0-2 knob with probability ~1/2 each.
SamplingParams random_params(std::mt19937& rng, int vocab) {
  std::uniform_int_distribution<int> tok(0, vocab - 1), coin(0, 1);
  std::uniform_real_distribution<double> pen(-2.0, 2.0);
  SamplingParams p;
  p.temperature = coin(rng) ? 0.0 : 0.7;
  p.top_k = coin(rng) ? 0 : 5;
  p.top_p = coin(rng) ? 1.0 : 0.9;
  p.min_p = coin(rng) ? 0.0 : 0.05;
  if (coin(rng))
    for (int i = 0; i < 4; ++i) p.logit_bias[tok(rng)] = static_cast<float>(pen(rng) * 10);
  if (coin(rng)) p.repetition_penalty = coin(rng) ? (coin(rng) ? 1.3 : 3e38) : (coin(rng) ? 0.8 : 1.2e-38);  // extremes clamp
  if (coin(rng)) p.frequency_penalty = pen(rng);
  if (coin(rng)) p.presence_penalty = pen(rng);
  p.max_tokens = 64;
  if (coin(rng)) p.min_tokens = 8;
  if (coin(rng)) p.stop_token_ids = {tok(rng), tok(rng)};
  p.ignore_eos = coin(rng);
  if (coin(rng)) p.logprobs = 3;
  p.validate(vocab);
  return p;
}

std::vector<int> random_ids(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  std::vector<int> v(n);
  for (auto& t : v) t = tok(rng) % (vocab / 4 + 1);  // repeats
  return v;
}

TEST(DeviceSamplingPack, ModsReproduceProcessLogitsBitForBit) {
  std::mt19937 rng(7);
  for (int vocab : {1, 5, 97, 1000}) {
    for (int trial = 0; trial < 200; ++trial) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " trial " << trial);
      const SamplingParams p = random_params(rng, vocab);
      const auto prompt = random_ids(rng, 1 + trial % 13, vocab);
      const auto output = random_ids(rng, trial % 11, vocab);
      const std::vector<int> eos = {vocab - 1};
      std::normal_distribution<float> d(0.0f, 3.0f);
      std::vector<float> logits(vocab);
      for (auto& x : logits) x = d(rng);
      if (vocab > 3) logits[2] = -0.0f, logits[3] = 0.0f;
      std::vector<LogitMod> mods(3);  // entries of earlier rows stay untouched
      SampleRowParams row;
      pack_sample_row(p, prompt, output, eos, vocab, 0.25, row, mods);
      EXPECT_EQ(row.mods_begin, 3);
      EXPECT_EQ(static_cast<size_t>(row.mods_begin + row.mods_count), mods.size());
      std::vector<float> want = logits, got = logits;
      process_logits(want, p, prompt, output, eos);
      apply_logit_mods(got, row, mods);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), vocab * sizeof(float)));
      for (int j = 0; j < row.mods_count; ++j)
        for (int i = j + 1; i < row.mods_count; ++i) EXPECT_NE(mods[3 + j].id, mods[3 + i].id);
      EXPECT_EQ(row.uniform, 0.25);
      EXPECT_EQ(row.temperature, p.greedy() ? 0.0f : static_cast<float>(p.temperature));
      EXPECT_EQ(row.top_k, p.effective_top_k(vocab));
      EXPECT_EQ(row.top_p, p.top_p);
      EXPECT_EQ(row.min_p, p.min_p);
      EXPECT_EQ(row.num_top, p.logprobs.value_or(0));
    }
  }
}

// bad_words travel as masks of the tokens banned at this position (sequences whose prefix ends the output, one-token
// ones always): the packed row still reproduces process_logits bit for bit, over the other knobs too.
TEST(DeviceSamplingPack, BadWordsPackAsMasksBitForBit) {
  std::mt19937 rng(13);
  for (int vocab : {5, 97, 1000}) {
    std::uniform_int_distribution<int> tok(0, vocab - 1);
    for (int trial = 0; trial < 200; ++trial) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " trial " << trial);
      SamplingParams p = random_params(rng, vocab);
      const auto prompt = random_ids(rng, 1 + trial % 7, vocab);
      const auto output = random_ids(rng, trial % 9, vocab);
      p.bad_words_token_ids = {{tok(rng)}, {tok(rng), tok(rng)}};
      if (!output.empty()) {  // sequences that apply: their prefixes end the output
        p.bad_words_token_ids.push_back({output.back(), tok(rng)});
        if (output.size() >= 2) p.bad_words_token_ids.push_back({output[output.size() - 2], output.back(), tok(rng)});
      }
      std::normal_distribution<float> d(0.0f, 3.0f);
      std::vector<float> logits(vocab);
      for (auto& x : logits) x = d(rng);
      std::vector<LogitMod> mods;
      SampleRowParams row;
      const std::vector<int> eos = {vocab - 1};
      pack_sample_row(p, prompt, output, eos, vocab, 0.5, row, mods);
      std::vector<float> want = logits, got = logits;
      process_logits(want, p, prompt, output, eos);
      apply_logit_mods(got, row, mods);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), vocab * sizeof(float)));
      EXPECT_TRUE(std::isinf(got[static_cast<size_t>(p.bad_words_token_ids[0][0])]));
    }
  }
  // Out-of-vocabulary banned ids are errors, as in the CPU sampler.
  SamplingParams p;
  p.bad_words_token_ids = {{12}};
  std::vector<LogitMod> mods;
  SampleRowParams row;
  EXPECT_THROW(pack_sample_row(p, std::vector<int>{1}, {}, std::vector<int>{0}, 10, 0.5, row, mods), Error);
  EXPECT_TRUE(mods.empty());
}

TEST(DeviceSamplingPack, PlainParamsPackNoMods) {
  SamplingParams p;
  p.temperature = 0.8;
  p.top_p = 0.95;
  p.min_tokens = 0;
  std::vector<LogitMod> mods;
  SampleRowParams row;
  const std::vector<int> prompt = {1, 2, 3}, output = {4, 4}, eos = {0};
  pack_sample_row(p, prompt, output, eos, 10, 0.5, row, mods);
  EXPECT_FALSE(row_has_mods(row));
  EXPECT_TRUE(mods.empty());
  // min_tokens unmet: EOS and stop ids masked, unless ignore_eos (then only the stop ids).
  p.min_tokens = 3;
  p.stop_token_ids = {7};
  pack_sample_row(p, prompt, output, eos, 10, 0.5, row, mods);
  EXPECT_EQ(row.mods_count, 2);
  p.ignore_eos = true;
  mods.clear();
  pack_sample_row(p, prompt, output, eos, 10, 0.5, row, mods);
  ASSERT_EQ(row.mods_count, 1);
  EXPECT_EQ(mods[0].id, 7);
  EXPECT_EQ(mods[0].flags, kLogitModMask);
}

TEST(DeviceSamplingPack, BadIdsThrowAndLeaveThePackerClean) {
  SamplingParams p;
  p.repetition_penalty = 1.2;
  p.frequency_penalty = 0.5;
  std::vector<LogitMod> mods;
  SampleRowParams row;
  const std::vector<int> eos = {0};
  EXPECT_THROW(pack_sample_row(p, std::vector<int>{1, 10}, {}, eos, 10, 0.5, row, mods), Error);
  EXPECT_THROW(pack_sample_row(p, std::vector<int>{1}, std::vector<int>{-1}, eos, 10, 0.5, row, mods), Error);
  p.logit_bias[3] = 1.0f;
  p.logit_bias[12] = 1.0f;  // validate() would reject it; the packer checks too
  EXPECT_THROW(pack_sample_row(p, std::vector<int>{1, 3}, {}, eos, 10, 0.5, row, mods), Error);
  EXPECT_TRUE(mods.empty());
  p.logit_bias.erase(12);
  // The table is clean again: every id gets exactly one entry.
  pack_sample_row(p, std::vector<int>{1, 3, 3}, std::vector<int>{3, 5}, eos, 10, 0.5, row, mods);
  ASSERT_EQ(row.mods_count, 3);  // 3 (bias + seen + count 1), 1 (seen), 5 (seen + count 1)
  for (const LogitMod& m : mods) {
    const uint32_t flags = m.id == 3 ? (kLogitModBias | kLogitModSeen) : kLogitModSeen;
    EXPECT_EQ(m.flags, flags) << "id " << m.id;
    EXPECT_EQ(m.count, m.id == 1 ? 0 : 1) << "id " << m.id;
  }
  EXPECT_THROW(pack_sample_row(p, {}, {}, eos, 0, 0.5, row, mods), Error);
}

TEST(DeviceSamplingPack, SampleTokenWithUniformEqualsSampleToken) {
  std::mt19937 rng(11);
  const int vocab = 300;
  std::vector<float> scratch;
  for (int trial = 0; trial < 300; ++trial) {
    const SamplingParams p = random_params(rng, vocab);
    const auto prompt = random_ids(rng, 5, vocab);
    const auto output = random_ids(rng, trial % 9, vocab);
    const std::vector<int> eos = {0};
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::vector<float> logits(vocab);
    for (auto& x : logits) x = d(rng);
    RequestRng a(trial), b(trial);
    const SampleResult want = sample_token(logits, p, prompt, output, eos, a, scratch);
    const double u = p.greedy() ? 0.0 : b.uniform();
    const SampleResult got = sample_token_with_uniform(logits, p, prompt, output, eos, u, scratch);
    EXPECT_EQ(got.token, want.token);
    EXPECT_EQ(got.logprob, want.logprob);
    EXPECT_EQ(a.next_u64(), b.next_u64());  // the same number of draws
  }
}

}  // namespace
}  // namespace ssmserve
