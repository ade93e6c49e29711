// Tests SamplingParams validation and sample_token / top_logprobs / RequestRng against hand computations
// and naive double-precision references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"

namespace ssmserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Ctx {
  std::vector<int> prompt, output, eos;
  std::vector<float> scratch;
};

SampleResult run(const std::vector<float>& logits, const SamplingParams& p, RequestRng& rng, Ctx& c) {
  return sample_token(logits, p, c.prompt, c.output, c.eos, rng, c.scratch);
}

std::vector<float> processed(std::vector<float> logits, const SamplingParams& p, const Ctx& c) {
  process_logits(logits, p, c.prompt, c.output, c.eos);
  return logits;
}

std::vector<double> naive_log_softmax(const std::vector<float>& l) {
  double s = 0;
  for (float x : l) s += std::exp(static_cast<double>(x));
  std::vector<double> out;
  for (float x : l) out.push_back(static_cast<double>(x) - std::log(s));
  return out;
}

std::vector<float> random_logits(int n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> l(n);
  for (auto& x : l) x = d(g);
  return l;
}

// ---- SamplingParams -------------------------------------------------------------------------------------

TEST(SamplingParams, DefaultsMatchVllm) {
  SamplingParams p;
  EXPECT_EQ(p.n, 1);
  EXPECT_EQ(p.temperature, 1.0);
  EXPECT_EQ(p.top_p, 1.0);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.min_p, 0.0);
  EXPECT_EQ(p.repetition_penalty, 1.0);
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_FALSE(p.logprobs.has_value());
  EXPECT_TRUE(p.skip_special_tokens);
  EXPECT_FALSE(p.greedy());
  EXPECT_NO_THROW(p.validate(100));
  p.temperature = 0.0;
  EXPECT_TRUE(p.greedy());
  p.temperature = 1e-6;
  EXPECT_TRUE(p.greedy());
  p.temperature = 1e-4;
  EXPECT_FALSE(p.greedy());
  EXPECT_EQ(p.effective_top_k(100), 100);
  p.top_k = 5;
  EXPECT_EQ(p.effective_top_k(100), 5);
  p.top_k = 500;
  EXPECT_EQ(p.effective_top_k(100), 100);
  p.top_k = -1;
  EXPECT_EQ(p.effective_top_k(100), 100);
}

void expect_invalid(void (*mutate)(SamplingParams&), const std::string& field) {
  SamplingParams p;
  mutate(p);
  try {
    p.validate(100);
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(SamplingParams, ValidationNamesTheField) {
  expect_invalid([](SamplingParams& p) { p.n = 0; }, "n ");
  expect_invalid([](SamplingParams& p) { p.temperature = -0.5; }, "temperature");
  expect_invalid([](SamplingParams& p) { p.temperature = std::nan(""); }, "temperature");
  expect_invalid([](SamplingParams& p) { p.top_p = 0.0; }, "top_p");
  expect_invalid([](SamplingParams& p) { p.top_p = 1.5; }, "top_p");
  expect_invalid([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  expect_invalid([](SamplingParams& p) { p.min_p = -0.1; }, "min_p");
  expect_invalid([](SamplingParams& p) { p.min_p = 1.1; }, "min_p");
  expect_invalid([](SamplingParams& p) { p.repetition_penalty = 0.0; }, "repetition_penalty");
  expect_invalid([](SamplingParams& p) { p.repetition_penalty = 1e-300; }, "repetition_penalty");  // 0 as float32
  expect_invalid([](SamplingParams& p) { p.repetition_penalty = 1e-40; }, "repetition_penalty");   // subnormal
  expect_invalid([](SamplingParams& p) { p.repetition_penalty = 1e39; }, "repetition_penalty");    // inf as float32
  expect_invalid([](SamplingParams& p) { p.presence_penalty = 2.5; }, "presence_penalty");
  expect_invalid([](SamplingParams& p) { p.frequency_penalty = -3; }, "frequency_penalty");
  expect_invalid([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens");
  expect_invalid([](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens");
  expect_invalid([](SamplingParams& p) { p.min_tokens = 17; }, "min_tokens");
  expect_invalid([](SamplingParams& p) { p.logprobs = -1; }, "logprobs");
  expect_invalid([](SamplingParams& p) { p.logprobs = 21; }, "logprobs");
  expect_invalid([](SamplingParams& p) { p.prompt_logprobs = 21; }, "prompt_logprobs");
  expect_invalid([](SamplingParams& p) { p.stop = {"a", ""}; }, "stop");
  expect_invalid([](SamplingParams& p) { p.stop_token_ids = {5, 100}; }, "stop_token_ids");
  SamplingParams ok;
  ok.top_k = -1;
  ok.logprobs = 20;
  ok.prompt_logprobs = 0;
  ok.min_tokens = 16;
  ok.top_p = 1e-9;
  ok.stop_token_ids = {0, 99};
  EXPECT_NO_THROW(ok.validate(100));
}

// ---- RequestRng ----------------------------------------------------------------------------------------

TEST(RequestRng, SeededIsReproducibleAndInRange) {
  RequestRng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const double x = a.uniform();
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
    EXPECT_EQ(x, b.uniform());
    differs |= x != c.uniform();
  }
  EXPECT_TRUE(differs);
  RequestRng s0 = RequestRng::for_sequence(42, 0), s1 = RequestRng::for_sequence(42, 1),
             s1b = RequestRng::for_sequence(42, 1);
  RequestRng ref(42);
  EXPECT_EQ(s0.uniform(), ref.uniform());
  const double y = s1.uniform();
  EXPECT_EQ(y, s1b.uniform());
  EXPECT_NE(y, RequestRng(42).uniform());
  RequestRng u1(std::nullopt), u2(std::nullopt);
  EXPECT_NE(u1.next_u64(), u2.next_u64());
}

// ---- Greedy ----------------------------------------------------------------------------------------------

TEST(Sampler, GreedyArgmaxAndTiesToLowestId) {
  Ctx c;
  SamplingParams p;
  p.temperature = 0.0;
  RequestRng rng(1);
  EXPECT_EQ(run({0.1f, 2.0f, -1.0f, 1.9f}, p, rng, c).token, 1);
  EXPECT_EQ(run({0.1f, 3.0f, -1.0f, 3.0f, 3.0f}, p, rng, c).token, 1);
  EXPECT_EQ(run({-kInf, -5.0f, -5.0f}, p, rng, c).token, 1);
  // Greedy consumes no randomness.
  RequestRng fresh(1);
  EXPECT_EQ(rng.uniform(), fresh.uniform());
}

// allowed_token_ids (vLLM): only the listed ids can be picked, greedy or sampled; logprobs stay raw; ids are
// range-checked.
TEST(Sampler, AllowedTokenIdsMaskEveryOtherToken) {
  Ctx c;
  SamplingParams p;
  p.temperature = 0.0;
  RequestRng rng(1);
  p.allowed_token_ids = {0, 2};
  SampleResult r = run({0.1f, 2.0f, -1.0f, 1.9f}, p, rng, c);
  EXPECT_EQ(r.token, 0);
  const double lse = std::log(std::exp(0.1) + std::exp(2.0) + std::exp(-1.0) + std::exp(1.9));
  EXPECT_NEAR(r.logprob, 0.1 - lse, 1e-5);
  p.temperature = 1.0;
  for (int i = 0; i < 50; ++i) {
    const int t = run({0.1f, 2.0f, -1.0f, 1.9f}, p, rng, c).token;
    EXPECT_TRUE(t == 0 || t == 2) << t;
  }
  std::vector<float> l = {0.0f, 1.0f, 2.0f};
  process_logits(l, p, {}, {}, {});
  EXPECT_EQ(l, (std::vector<float>{0.0f, -kInf, 2.0f}));
  p.allowed_token_ids = {4};
  EXPECT_THROW(p.validate(4), Error);
  EXPECT_NO_THROW(p.validate(5));
}

TEST(Sampler, LogitBiasShiftsLogitsBeforeSamplingNotLogprobs) {
  Ctx c;
  SamplingParams p;
  p.temperature = 0.0;
  RequestRng rng(1);
  p.logit_bias = {{1, -100.0f}};
  SampleResult r = run({0.1f, 2.0f, -1.0f, 1.9f}, p, rng, c);
  EXPECT_EQ(r.token, 3);
  // Logprobs stay those of the raw distribution (vLLM's raw_logprobs).
  const double lse = std::log(std::exp(0.1) + std::exp(2.0) + std::exp(-1.0) + std::exp(1.9));
  EXPECT_NEAR(r.logprob, 1.9 - lse, 1e-5);
  p.logit_bias = {{2, 3.5f}, {0, 0.5f}};
  EXPECT_EQ(run({0.1f, 2.0f, -1.0f, 1.9f}, p, rng, c).token, 2);
  std::vector<float> l = {0.0f, 1.0f, 2.0f};
  process_logits(l, p, {}, {}, {});
  EXPECT_EQ(l, (std::vector<float>{0.5f, 1.0f, 5.5f}));
  // Ids are validated against the vocabulary; the sampler refuses out-of-range ones too.
  p.logit_bias = {{3, 1.0f}};
  EXPECT_THROW(p.validate(3), Error);
  EXPECT_NO_THROW(p.validate(4));
  EXPECT_THROW(run({0.0f, 1.0f, 2.0f}, p, rng, c), Error);
  p.logit_bias = {{0, std::nanf("")}};
  EXPECT_THROW(p.validate(4), Error);
}

TEST(Sampler, BadLogitsThrow) {
  Ctx c;
  SamplingParams p;
  RequestRng rng(1);
  EXPECT_THROW(run({}, p, rng, c), Error);
  EXPECT_THROW(run({0.0f, std::nanf("")}, p, rng, c), Error);
  EXPECT_THROW(run({0.0f, kInf}, p, rng, c), Error);
  EXPECT_THROW(run({-kInf, -kInf}, p, rng, c), Error);
  c.output = {7};
  EXPECT_THROW(run({0.0f, 1.0f}, p, rng, c), Error);
  // Everything masked by min_tokens.
  c.output = {};
  c.eos = {0};
  p.min_tokens = 1;
  p.stop_token_ids = {1};
  EXPECT_THROW(run({0.0f, 1.0f}, p, rng, c), Error);
}

// ---- Seeds -----------------------------------------------------------------------------------------------

TEST(Sampler, SeedReproducibility) {
  const auto logits = random_logits(1000, 7, 1.0f);
  Ctx c;
  SamplingParams p;
  p.temperature = 1.3;
  auto draw = [&](uint64_t seed) {
    RequestRng rng(seed);
    std::vector<int> seq;
    for (int i = 0; i < 50; ++i) seq.push_back(run(logits, p, rng, c).token);
    return seq;
  };
  EXPECT_EQ(draw(123), draw(123));
  EXPECT_NE(draw(123), draw(124));
  p.top_k = 50;
  p.top_p = 0.8;
  p.min_p = 0.01;
  EXPECT_EQ(draw(5), draw(5));
  EXPECT_NE(draw(5), draw(6));
}

// ---- Filters ---------------------------------------------------------------------------------------------

TEST(Sampler, LowTemperatureTopK1AndTinyTopPEqualGreedy) {
  Ctx c;
  SamplingParams greedy;
  greedy.temperature = 0.0;
  RequestRng g(0);
  for (uint64_t s = 0; s < 20; ++s) {
    auto logits = random_logits(500, s);
    logits[17] = logits[3] = *std::max_element(logits.begin(), logits.end()) + 0.5f;  // tie -> 3
    const int want = run(logits, greedy, g, c).token;
    ASSERT_EQ(want, 3);
    SamplingParams cold;
    cold.temperature = 1e-4;
    SamplingParams k1;
    k1.top_k = 1;
    k1.temperature = 2.0;
    SamplingParams p0;
    p0.top_p = 1e-6;
    SamplingParams k1p;  // top-k and top-p together
    k1p.top_k = 10;
    k1p.top_p = 1e-6;
    for (const auto* p : {&k1, &p0, &k1p}) {
      RequestRng rng(s);
      for (int i = 0; i < 20; ++i) EXPECT_EQ(run(logits, *p, rng, c).token, want);
    }
    // Tiny temperature: the two tied maxima share all the mass.
    logits[17] = logits[3] - 0.01f;
    RequestRng rng(s);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(run(logits, cold, rng, c).token, 3);
  }
}

/// Reference: softmax(l / T) -> top-k -> top-p -> min-p, in double.
std::vector<double> reference_probs(const std::vector<float>& l, const SamplingParams& p) {
  const int n = static_cast<int>(l.size());
  std::vector<int> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return l[a] > l[b]; });
  std::vector<double> w(n, 0.0);
  const int k = p.effective_top_k(n);
  double z = 0;
  for (int j = 0; j < k; ++j) z += w[ids[j]] = std::exp((static_cast<double>(l[ids[j]]) - l[ids[0]]) / p.temperature);
  double cum = 0;
  int kept = k;
  for (int j = 0; j < k; ++j) {
    cum += w[ids[j]] / z;
    if (cum >= p.top_p - 1e-12) {
      kept = j + 1;
      break;
    }
  }
  for (int j = kept; j < n; ++j) w[ids[j]] = 0;
  for (int j = 1; j < kept; ++j)
    if (w[ids[j]] < p.min_p * w[ids[0]]) w[ids[j]] = 0;
  z = std::accumulate(w.begin(), w.end(), 0.0);
  for (auto& x : w) x /= z;
  return w;
}

void expect_frequencies_match(const std::vector<float>& logits, const SamplingParams& p, uint64_t seed) {
  Ctx c;
  RequestRng rng(seed);
  const int draws = 20000;
  std::vector<double> freq(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) freq[run(logits, p, rng, c).token] += 1.0 / draws;
  const auto want = reference_probs(logits, p);
  double max_diff = 0;
  for (size_t i = 0; i < freq.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(freq[i] - want[i]));
    if (want[i] == 0) {
      EXPECT_EQ(freq[i], 0.0) << "filtered token " << i << " was sampled";
    }
  }
  EXPECT_LT(max_diff, 0.02) << "T=" << p.temperature << " k=" << p.top_k << " p=" << p.top_p << " min_p=" << p.min_p;
}

TEST(Sampler, FrequenciesMatchFilteredSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f, 2.2f, -0.3f, 0.8f, 1.1f};
  SamplingParams p;
  expect_frequencies_match(logits, p, 1);
  p.temperature = 0.7;
  expect_frequencies_match(logits, p, 2);
  p.temperature = 1.5;
  p.top_k = 4;
  expect_frequencies_match(logits, p, 3);
  p.top_k = 0;
  p.top_p = 0.6;
  expect_frequencies_match(logits, p, 4);
  p.top_k = 6;
  p.top_p = 0.8;
  expect_frequencies_match(logits, p, 5);
  p = SamplingParams{};
  p.min_p = 0.3;
  expect_frequencies_match(logits, p, 6);
  p.top_k = 5;
  p.top_p = 0.9;
  p.min_p = 0.5;
  expect_frequencies_match(logits, p, 7);
  // Large vocab, top-p only (exercises the incremental nucleus selection beyond one chunk).
  auto big = random_logits(2000, 9, 0.5f);
  SamplingParams q;
  q.top_p = 0.5;
  expect_frequencies_match(big, q, 8);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  // probs ~ {0.64, 0.24, 0.09, 0.03}: min_p = 0.2 keeps the first two (0.03/0.64 and 0.09/0.64 < 0.2).
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  SamplingParams p;
  p.min_p = 0.2;
  Ctx c;
  RequestRng rng(11);
  std::map<int, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[run(logits, p, rng, c).token];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[0], seen[1]);
  p.min_p = 1.0;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(run(logits, p, rng, c).token, 0);
}

// ---- Penalties and min_tokens ------------------------------------------------------------------------------

TEST(Sampler, RepetitionPenaltyHfStyle) {
  SamplingParams p;
  p.temperature = 0.0;
  p.repetition_penalty = 2.0;
  Ctx c;
  c.prompt = {0, 0};
  c.output = {1};
  RequestRng rng(0);
  // 4/2 = 2 ; -1*2 = -2 ; 3 untouched ; 2.5 untouched.
  EXPECT_EQ(processed({4.0f, -1.0f, 3.0f, 2.5f}, p, c), (std::vector<float>{2.0f, -2.0f, 3.0f, 2.5f}));
  EXPECT_EQ(run({4.0f, -1.0f, 3.0f, 2.5f}, p, rng, c).token, 2);
  // Applied once per distinct token, prompt tokens count too.
  c.prompt = {3, 3, 3};
  c.output = {3};
  EXPECT_EQ(processed({4.0f, -1.0f, 3.0f, 2.5f}, p, c), (std::vector<float>{4.0f, -1.0f, 3.0f, 1.25f}));
}

/// A tiny (or huge) repetition penalty keeps finite logits finite and masked ones masked (a server request with
/// repetition_penalty 1e-37 once overflowed its logits to inf, inf - inf left no token with a positive probability, and
/// the sampler's error failed the whole engine step), on the host sampler and the device sampler's host reference.
TEST(Sampler, ExtremeRepetitionPenaltyKeepsLogitsFinite) {
  constexpr float kMax = std::numeric_limits<float>::max(), kInf = std::numeric_limits<float>::infinity();
  for (double rp : {1.2e-38, 1e-37, 3e38}) {
    SCOPED_TRACE(rp);
    SamplingParams p;
    p.repetition_penalty = rp;
    p.temperature = 0.7;
    ASSERT_NO_THROW(p.validate(4));
    Ctx c;
    c.prompt = {0, 1, 3};
    const std::vector<float> got = processed({5.0f, -3.0f, 2.0f, -kInf}, p, c);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isfinite(got[i])) << i << ": " << got[i];
    EXPECT_EQ(got[3], -kInf) << "a masked token stays masked";
    if (rp < 1e-37) EXPECT_EQ(got[0], kMax) << "5 / rp overflows: clamped";
    else if (rp < 1) EXPECT_FLOAT_EQ(got[0], static_cast<float>(5.0 / rp));
    else EXPECT_EQ(got[1], -kMax) << "-3 * rp overflows: clamped";
    RequestRng rng(7);
    for (int step = 0; step < 20; ++step) EXPECT_NO_THROW(run({5.0f, -3.0f, 2.0f, -kInf}, p, rng, c));
  }
}

TEST(Sampler, FrequencyAndPresencePenaltiesUseOutputOnly) {
  SamplingParams p;
  p.temperature = 0.0;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  Ctx c;
  c.prompt = {0, 0, 0};        // prompt tokens are not penalized by these
  c.output = {1, 1, 1, 2, 1};  // counts: 1 -> 4, 2 -> 1
  RequestRng rng(0);
  EXPECT_EQ(processed({1.0f, 3.0f, 1.0f, 0.0f}, p, c),
            (std::vector<float>{1.0f, 3.0f - 2.0f - 0.25f, 1.0f - 0.5f - 0.25f, 0.0f}));
  auto r = run({1.0f, 3.0f, 1.0f, 0.0f}, p, rng, c);
  EXPECT_EQ(r.token, 0);
  // The reported logprob is still from the raw distribution.
  EXPECT_NEAR(r.logprob, naive_log_softmax({1.0f, 3.0f, 1.0f, 0.0f})[0], 1e-6);
  // Negative penalties encourage repetition.
  p.frequency_penalty = -1.0;
  p.presence_penalty = 0;
  EXPECT_EQ(run({1.0f, 3.0f, 1.0f, 5.5f}, p, rng, c).token, 1);  // 3 + 4 = 7 > 5.5
}

TEST(Sampler, MinTokensMasksEosAndStopTokens) {
  SamplingParams p;
  p.temperature = 0.0;
  p.min_tokens = 2;
  p.stop_token_ids = {2};
  Ctx c;
  c.eos = {0};
  RequestRng rng(0);
  const std::vector<float> logits = {5.0f, 1.0f, 4.0f, 3.0f};
  c.output = {1};  // 1 < 2 generated: EOS (0) and stop token (2) masked
  EXPECT_EQ(run(logits, p, rng, c).token, 3);
  EXPECT_EQ(processed(logits, p, c), (std::vector<float>{-kInf, 1.0f, -kInf, 3.0f}));
  c.output = {1, 1};
  EXPECT_EQ(run(logits, p, rng, c).token, 0);
  // ignore_eos: EOS is an ordinary token and is not masked (vLLM).
  p.ignore_eos = true;
  c.output = {1};
  EXPECT_EQ(run(logits, p, rng, c).token, 0);
  // Random sampling never yields a masked token.
  p.ignore_eos = false;
  p.temperature = 1.0;
  for (int i = 0; i < 200; ++i) {
    const int t = run(logits, p, rng, c).token;
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

// ---- Logprobs ----------------------------------------------------------------------------------------------

TEST(Sampler, LogprobsMatchNaiveDouble) {
  auto logits = random_logits(50000, 3, 4.0f);
  logits[100] = -kInf;
  const auto ref = naive_log_softmax(logits);
  EXPECT_NEAR(log_sum_exp(logits), std::log(std::accumulate(logits.begin(), logits.end(), 0.0,
                                                            [](double s, float x) { return s + std::exp(double(x)); })),
              1e-9 * 20);
  float lp = 0;
  auto top = top_logprobs(logits, 20, &lp, 12345);
  EXPECT_NEAR(lp, ref[12345], 1e-5);
  ASSERT_EQ(top.size(), 20u);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ref[a] > ref[b]; });
  for (int j = 0; j < 20; ++j) {
    EXPECT_EQ(top[j].id, order[j]);
    EXPECT_NEAR(top[j].logprob, ref[order[j]], 1e-5);
  }
  // Through sample_token, with modified sampling (penalties, temperature): logprobs stay raw.
  SamplingParams p;
  p.logprobs = 5;
  p.temperature = 0.5;
  p.repetition_penalty = 1.3;
  Ctx c;
  c.prompt = {order[0], order[1]};
  RequestRng rng(9);
  for (int i = 0; i < 5; ++i) {
    auto r = run(logits, p, rng, c);
    EXPECT_NEAR(r.logprob, ref[r.token], 1e-5);
    ASSERT_EQ(r.top.size(), 5u);
    for (int j = 0; j < 5; ++j) EXPECT_EQ(r.top[j].id, order[j]);
  }
  p.logprobs = 0;
  EXPECT_TRUE(run(logits, p, rng, c).top.empty());
  // Ties sort by id; k clamps to vocab.
  auto t = top_logprobs(std::vector<float>{1.0f, 2.0f, 2.0f}, 10);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].id, 1);
  EXPECT_EQ(t[1].id, 2);
  EXPECT_EQ(t[2].id, 0);
  EXPECT_THROW(top_logprobs(std::vector<float>{1.0f}, -1), Error);
  EXPECT_THROW(top_logprobs(std::vector<float>{1.0f}, 1, &lp, 1), Error);
}

// vLLM's Logprob.rank: a sampled token's is its place in the raw distribution (1 + logits strictly above it, ties
// sharing one), however far down a hot temperature or a logit_bias takes it; the top-k's are 1..k; none without logprobs.
TEST(Sampler, SampledTokenRankIsItsVocabularyRank) {
  auto logits = random_logits(2000, 5, 3.0f);
  logits[7] = logits[8];  // a tie
  const auto naive_rank = [&](int id) {
    int above = 0;
    for (float x : logits) above += x > logits[id];
    return 1 + above;
  };
  Ctx c;
  RequestRng rng(11);
  SamplingParams p;
  p.temperature = 5.0;  // far down the distribution, past any top-k
  p.logprobs = 2;
  int deep = 0;
  for (int i = 0; i < 40; ++i) {
    const SampleResult r = run(logits, p, rng, c);
    EXPECT_EQ(r.rank, naive_rank(r.token));
    EXPECT_EQ(raw_rank(logits, logits[r.token]), naive_rank(r.token));
    deep += r.rank > 2;
    ASSERT_EQ(r.top.size(), 2u);
    EXPECT_EQ(r.top[0].rank, 1);
    EXPECT_EQ(r.top[1].rank, 2);
  }
  EXPECT_GT(deep, 20);  // the test reaches tokens outside the top-2
  // Greedy under a logit_bias: the pick is the biased argmax, its rank the raw one.
  SamplingParams g;
  g.temperature = 0.0;
  g.logprobs = 0;
  g.logit_bias[1234] = 100.0f;
  const SampleResult b = run(logits, g, rng, c);
  EXPECT_EQ(b.token, 1234);
  EXPECT_EQ(b.rank, naive_rank(1234));
  EXPECT_EQ(raw_rank(logits, logits[7]), raw_rank(logits, logits[8]));
  g.logprobs.reset();
  EXPECT_EQ(run(logits, g, rng, c).rank, 0);  // not asked for
}

TEST(Sampler, ResultIndependentOfScratchAndCallHistory) {
  auto logits = random_logits(3000, 21, 1.0f);
  SamplingParams p;
  p.top_p = 0.9;
  p.top_k = 200;
  p.repetition_penalty = 1.2;
  Ctx a, b;
  a.output = {1, 2, 3};
  b.output = {1, 2, 3};
  b.scratch.assign(10, 123.0f);
  RequestRng ra(77), rb(77);
  // Interleave unrelated calls on b's thread-local state.
  SamplingParams other;
  other.frequency_penalty = 1.0;
  Ctx o;
  o.output = {5, 5, 6};
  RequestRng ro(1);
  for (int i = 0; i < 30; ++i) {
    run(random_logits(700, i), other, ro, o);
    EXPECT_EQ(run(logits, p, ra, a).token, run(logits, p, rb, b).token);
  }
}

}  // namespace
}  // namespace ssmserve
