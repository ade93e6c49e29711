// Tests bad_words (engine/bad_words.h) piece by piece: tokenization as vLLM's update_from_tokenizer with the bundled
// GPT-NeoX tokenizer (as given and with a leading space, vLLM's keep rule, de-duplication, errors and limits), which
// tokens a sequence bans after a given output (vLLM's _apply_bad_words_single_batch), the sampler's order (after
// allowed_token_ids, before logit_bias; logprobs raw) and SamplingParams' checks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/bad_words.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "tokenizer/tokenizer.h"

namespace ssmserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
using Seqs = std::vector<std::vector<int>>;

const Tokenizer& neox() {
  static const Tokenizer t =
      Tokenizer::from_file(std::filesystem::path(SSMSERVE_SOURCE_DIR) / "models/tiny-mamba/tokenizer.json");
  return t;
}

std::vector<int> enc(const std::string& s) { return neox().encode(s, false); }

Seqs tokenize(const std::vector<std::string>& words) { return tokenize_bad_words(words, neox(), neox().vocab_size()); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// The ids for_each_banned_token passes, in order.
std::vector<int> banned(const Seqs& seqs, const std::vector<int>& output) {
  std::vector<int> out;
  for_each_banned_token(seqs, output, [&](int t) { out.push_back(t); });
  return out;
}

// ---- tokenization -------------------------------------------------------------------------------------------------

TEST(BadWordsTokenize, BothVariantsWhenTheSpacedOneIsAnotherWordOfTheSameLength) {
  ASSERT_EQ(enc("room").size(), 1u);
  ASSERT_EQ(enc(" room").size(), 1u);
  EXPECT_EQ(tokenize({"room"}), (Seqs{enc("room"), enc(" room")}));
  EXPECT_EQ(tokenize({"I am"}), (Seqs{enc("I am"), enc(" I am")}));
  // Leading whitespace is stripped first (Python's str.lstrip, Unicode spaces too): the same two sequences.
  EXPECT_EQ(tokenize({"  \t room"}), tokenize({"room"}));
  EXPECT_EQ(tokenize({"\u3000room"}), tokenize({"room"}));
  // Trailing whitespace is kept (vLLM strips only the left).
  EXPECT_EQ(tokenize({"room "}).front(), enc("room "));
}

TEST(BadWordsTokenize, SpacedVariantOfAnotherLengthIsDroppedAsVllmDoes) {
  // "glad" is two tokens, " glad" one: vLLM keeps only the word as given.
  ASSERT_GT(enc("glad").size(), 1u);
  ASSERT_EQ(enc(" glad").size(), 1u);
  EXPECT_EQ(tokenize({"glad"}), (Seqs{enc("glad")}));
}

TEST(BadWordsTokenize, DuplicatesAreDropped) {
  EXPECT_EQ(tokenize({"room", " room", "room"}), (Seqs{enc("room"), enc(" room")}));
}

TEST(BadWordsTokenize, ErrorsNameTheFieldAndEntry) {
  EXPECT_NE(error_of([] { tokenize({"room", " \n"}); }).find("bad_words[1] must tokenize to at least one token"),
            std::string::npos);
  EXPECT_NE(error_of([] { tokenize({""}); }).find("bad_words[0]"), std::string::npos);
  EXPECT_NE(error_of([] { tokenize_bad_words(std::vector<std::string>{"room"}, neox(), 100); }).find("outside the vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([] { tokenize({std::string(kMaxBadWordBytes + 1, 'a')}); }).find("bytes"), std::string::npos);
  // Limits (vLLM's defaults): kMaxBadWords words and sequences, kMaxBadWordsTotalTokens tokens.
  std::vector<std::string> many;
  for (int i = 0; i < kMaxBadWords + 1; ++i) many.push_back("w" + std::to_string(i));
  EXPECT_NE(error_of([&] { tokenize(many); }).find("at most 128"), std::string::npos);
  many.resize(kMaxBadWords / 2 + 1);  // each gives two sequences: 130 > 128
  for (auto& w : many) w = "room" + w;
  EXPECT_NE(error_of([&] { tokenize(many); }).find("too many token sequences"), std::string::npos);
  std::string long_word;
  for (int i = 0; i < 200; ++i) long_word += " room";  // 200 tokens, twice over (as given, spaced)
  EXPECT_EQ(tokenize({long_word, "x" + long_word}).size(), 4u);  // 802 tokens: within the limit
  EXPECT_NE(error_of([&] { tokenize({long_word, "x" + long_word, "y" + long_word}); }).find("tokens after tokenization"),
            std::string::npos);
}

// ---- which tokens a sequence bans ---------------------------------------------------------------------------------

TEST(BadWordsBan, LastTokenAfterItsPrefixInTheOutputOnly) {
  const Seqs seqs = {{7}, {1, 2}, {1, 2, 3}, {4, 5, 6}};
  EXPECT_EQ(banned(seqs, {}), (std::vector<int>{7}));          // one-token words: always
  EXPECT_EQ(banned(seqs, {9, 1}), (std::vector<int>{7, 2}));
  EXPECT_EQ(banned(seqs, {1, 2}), (std::vector<int>{7, 3}));
  EXPECT_EQ(banned(seqs, {2, 1}), (std::vector<int>{7, 2}));
  EXPECT_EQ(banned(seqs, {4, 5, 0}), (std::vector<int>{7}));     // the prefix must END the output
  EXPECT_EQ(banned(seqs, {5}), (std::vector<int>{7}));           // a prefix longer than the output: nothing
  EXPECT_EQ(banned(seqs, {0, 4, 5}), (std::vector<int>{7, 6}));
  std::vector<float> l(8, 1.0f);
  apply_bad_words(l, seqs, std::vector<int>{1});
  EXPECT_EQ(l, (std::vector<float>{1, 1, -kInf, 1, 1, 1, 1, -kInf}));
  EXPECT_THROW(apply_bad_words(l, Seqs{{9}}, std::vector<int>{}), Error);
}

// ---- the sampler --------------------------------------------------------------------------------------------------

TEST(BadWordsSampler, MaskedAfterAllowedBeforeLogitBiasLogprobsRaw) {
  SamplingParams p;
  p.temperature = 0.0;
  p.bad_words_token_ids = {{1}, {0, 3}};
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f};
  std::vector<float> scratch;
  RequestRng rng(1);
  const std::vector<int> eos = {};
  // Output [0]: 1 (always) and 3 (after 0) are banned, leaving 0 the best.
  SampleResult r = sample_token(logits, p, {}, std::vector<int>{0}, eos, rng, scratch);
  EXPECT_EQ(r.token, 0);
  const double lse = std::log(std::exp(0.1) + std::exp(2.0) + std::exp(-1.0) + std::exp(1.9));
  EXPECT_NEAR(r.logprob, 0.1 - lse, 1e-5);  // the raw distribution's logprob (vLLM's raw_logprobs)
  EXPECT_EQ(sample_token(logits, p, {}, std::vector<int>{2}, eos, rng, scratch).token, 3);  // 3 only after 0
  // A logit_bias cannot lift a banned token; with allowed_token_ids both masks hold.
  p.logit_bias = {{1, 100.0f}};
  EXPECT_EQ(sample_token(logits, p, {}, std::vector<int>{}, eos, rng, scratch).token, 3);
  p.allowed_token_ids = {1, 2};
  EXPECT_EQ(sample_token(logits, p, {}, std::vector<int>{}, eos, rng, scratch).token, 2);
  p.allowed_token_ids = {1};  // nothing left
  EXPECT_THROW(sample_token(logits, p, {}, std::vector<int>{}, eos, rng, scratch), Error);
}

TEST(BadWordsParams, ValidateChecksWordsAndSequences) {
  SamplingParams p;
  p.bad_words = {"ok"};
  EXPECT_NO_THROW(p.validate(10));
  p.bad_words = {"ok", ""};
  EXPECT_NE(error_of([&] { p.validate(10); }).find("bad_words cannot contain an empty string"), std::string::npos);
  p.bad_words = {std::string(kMaxBadWordBytes + 1, 'x')};
  EXPECT_NE(error_of([&] { p.validate(10); }).find("bytes"), std::string::npos);
  p.bad_words = std::vector<std::string>(kMaxBadWords + 1, "x");
  EXPECT_NE(error_of([&] { p.validate(10); }).find("at most 128"), std::string::npos);
  p.bad_words.clear();
  p.bad_words_token_ids = {{1, 2}, {9}};
  EXPECT_NO_THROW(p.validate(10));
  p.bad_words_token_ids = {{1, 10}};
  EXPECT_NE(error_of([&] { p.validate(10); }).find("out of vocabulary range"), std::string::npos);
  p.bad_words_token_ids = {{}};
  EXPECT_NE(error_of([&] { p.validate(10); }).find("is empty"), std::string::npos);
  p.bad_words_token_ids = {std::vector<int>(kMaxBadWordsTotalTokens + 1, 1)};
  EXPECT_NE(error_of([&] { p.validate(10); }).find("tokens; at most 1024"), std::string::npos);
}

}  // namespace
}  // namespace ssmserve
