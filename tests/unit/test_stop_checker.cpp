// Tests StopChecker: stop strings (split across tokens, at the start, include, earliest wins), stop token ids,
// EOS / ignore_eos, min_tokens, max_tokens -> length, and streaming hold-back.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "engine/stop_checker.h"

namespace ssmserve {
namespace {

constexpr int kEos = 0;

/// Feeds token texts one by one (token ids 10, 11, ...) and returns the first stopping decision (or the last).
struct Feed {
  StopDecision decision;
  std::string text;
  int tokens = 0;
};

Feed feed(const StopChecker& sc, const std::vector<std::string>& pieces) {
  Feed f;
  for (const auto& piece : pieces) {
    const size_t start = f.text.size();
    f.text += piece;
    ++f.tokens;
    f.decision = sc.on_token(10 + f.tokens, f.text, start, f.tokens);
    if (f.decision.reason != FinishReason::None) break;
  }
  return f;
}

SamplingParams with_stop(std::vector<std::string> stop, bool include = false) {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop = std::move(stop);
  p.include_stop_str_in_output = include;
  return p;
}

TEST(StopChecker, FinishReasonNames) {
  EXPECT_EQ(finish_reason_name(FinishReason::Stop), "stop");
  EXPECT_EQ(finish_reason_name(FinishReason::Length), "length");
  EXPECT_EQ(finish_reason_name(FinishReason::Abort), "abort");
  EXPECT_EQ(finish_reason_name(FinishReason::None), "");
}

TEST(StopChecker, StopStringSplitAcrossTokens) {
  StopChecker sc(with_stop({"###"}), {kEos});
  auto f = feed(sc, {"Hello", " wor", "ld#", "#", "# tail", "more"});
  EXPECT_EQ(f.tokens, 5);  // "Hello world### tail" completes at the 5th token
  EXPECT_EQ(sc.streamable_chars("Hello world##"), 11u);
  EXPECT_EQ(f.decision.reason, FinishReason::Stop);
  EXPECT_EQ(f.decision.stop_str, "###");
  EXPECT_FALSE(f.decision.stop_reason_token.has_value());
  EXPECT_EQ(f.text.substr(0, f.decision.keep_chars), "Hello world");
}

TEST(StopChecker, StopStringAtVeryStartAndInsideOneToken) {
  StopChecker sc(with_stop({"STOP"}), {kEos});
  auto f = feed(sc, {"STOP now"});
  EXPECT_EQ(f.decision.reason, FinishReason::Stop);
  EXPECT_EQ(f.decision.keep_chars, 0u);
  f = feed(sc, {"ab", "cSTOPdef"});
  EXPECT_EQ(f.text.substr(0, f.decision.keep_chars), "abc");
}

TEST(StopChecker, IncludeStopStrInOutput) {
  StopChecker sc(with_stop({"\n\n"}, /*include=*/true), {kEos});
  auto f = feed(sc, {"line", "\n", "\nnext"});
  EXPECT_EQ(f.decision.reason, FinishReason::Stop);
  EXPECT_EQ(f.text.substr(0, f.decision.keep_chars), "line\n\n");  // text after the stop string is cut
}

TEST(StopChecker, EarliestStopStringWins) {
  StopChecker sc(with_stop({"world", "lo w", "o"}), {kEos});
  auto f = feed(sc, {"hel", "lo world"});
  EXPECT_EQ(f.decision.stop_str, "lo w");
  EXPECT_EQ(f.text.substr(0, f.decision.keep_chars), "hel");
  // Same start: list order breaks the tie.
  StopChecker sc2(with_stop({"ab", "abc"}, true), {kEos});
  f = feed(sc2, {"xxabcd"});
  EXPECT_EQ(f.decision.stop_str, "ab");
  EXPECT_EQ(f.decision.keep_chars, 4u);
}

TEST(StopChecker, OnlyNewTextIsSearched) {
  // A stop string that occurred while min_tokens blocked stopping does not fire later (as vLLM).
  SamplingParams p = with_stop({"x"});
  p.min_tokens = 3;
  StopChecker sc(p, {kEos});
  auto f = feed(sc, {"x", "a", "b", "c"});
  EXPECT_EQ(f.decision.reason, FinishReason::None);
  // The min_tokens-th token's own text is not searched either (vLLM v1's detokenizer): only from token 4 on.
  f = feed(sc, {"a", "b", "cx"});
  EXPECT_EQ(f.decision.reason, FinishReason::None);
  f = feed(sc, {"a", "b", "c", "x"});
  EXPECT_EQ(f.decision.reason, FinishReason::Stop);
  EXPECT_EQ(f.decision.keep_chars, 3u);
  // A stop string that starts in the first min_tokens tokens' text and ends after them matches (the look-back).
  SamplingParams q = with_stop({"xy"});
  q.min_tokens = 1;
  StopChecker sq(q, {kEos});
  f = feed(sq, {"x", "y"});
  EXPECT_EQ(f.decision.reason, FinishReason::Stop);
  EXPECT_EQ(f.decision.keep_chars, 0u);
  f = feed(sq, {"xy", "z"});
  EXPECT_EQ(f.decision.reason, FinishReason::None);
  // A token with no new text cannot match.
  StopChecker sc2(with_stop({"ab"}), {kEos});
  EXPECT_EQ(sc2.on_token(5, "zzz", 3, 1).reason, FinishReason::None);
}

TEST(StopChecker, StopTokenIds) {
  SamplingParams p;
  p.stop_token_ids = {42};
  StopChecker sc(p, {kEos});
  auto d = sc.on_token(7, "ab", 1, 1);
  EXPECT_EQ(d.reason, FinishReason::None);
  EXPECT_EQ(d.keep_chars, 2u);
  d = sc.on_token(42, "ab<s>", 2, 2);
  EXPECT_EQ(d.reason, FinishReason::Stop);
  ASSERT_TRUE(d.stop_reason_token.has_value());
  EXPECT_EQ(*d.stop_reason_token, 42);
  EXPECT_EQ(d.keep_chars, 2u);  // the stop token's text is dropped
  p.include_stop_str_in_output = true;
  StopChecker inc(p, {kEos});
  EXPECT_EQ(inc.on_token(42, "ab<s>", 2, 2).keep_chars, 5u);
}

TEST(StopChecker, EosAndIgnoreEos) {
  SamplingParams p;
  StopChecker sc(p, {kEos, 2});
  auto d = sc.on_token(2, "hi", 2, 3);
  EXPECT_EQ(d.reason, FinishReason::Stop);
  EXPECT_FALSE(d.stop_reason_token.has_value());  // EOS: stop_reason is None in vLLM
  EXPECT_EQ(sc.on_token(kEos, "hi", 2, 3).reason, FinishReason::Stop);
  p.ignore_eos = true;
  StopChecker ig(p, {kEos});
  d = ig.on_token(kEos, "hi</s>", 2, 3);
  EXPECT_EQ(d.reason, FinishReason::None);
  EXPECT_EQ(d.keep_chars, 6u);
  // min_tokens: EOS cannot stop before min_tokens outputs.
  SamplingParams m;
  m.min_tokens = 4;
  StopChecker mc(m, {kEos});
  EXPECT_EQ(mc.on_token(kEos, "", 0, 3).reason, FinishReason::None);
  EXPECT_EQ(mc.on_token(kEos, "", 0, 4).reason, FinishReason::Stop);
}

TEST(StopChecker, MaxTokensGivesLength) {
  SamplingParams p = with_stop({"END"});
  p.max_tokens = 3;
  StopChecker sc(p, {kEos});
  auto f = feed(sc, {"a", "b", "c", "d"});
  EXPECT_EQ(f.tokens, 3);
  EXPECT_EQ(f.decision.reason, FinishReason::Length);
  EXPECT_EQ(f.decision.keep_chars, 3u);
  // A stop string on the last allowed token is reported as "stop" (vLLM v1's detokenizer runs after the length cap).
  f = feed(sc, {"a", "b", "END"});
  EXPECT_EQ(f.decision.reason, FinishReason::Stop);
  EXPECT_EQ(f.decision.stop_str, "END");
  EXPECT_EQ(f.decision.keep_chars, 2u);
  // An EOS or stop token on it as "length" (v1's scheduler checks the cap first), its text kept.
  const StopDecision eos = sc.on_token(kEos, "ab</s>", 2, 3);
  EXPECT_EQ(eos.reason, FinishReason::Length);
  EXPECT_EQ(eos.keep_chars, 6u);
  SamplingParams ids;
  ids.max_tokens = 2, ids.stop_token_ids = {7};
  StopChecker si(ids, {kEos});
  const StopDecision st = si.on_token(7, "ax", 1, 2);
  EXPECT_EQ(st.reason, FinishReason::Length);
  EXPECT_FALSE(st.stop_reason_token.has_value());
  EXPECT_EQ(si.on_token(7, "a", 1, 1).reason, FinishReason::Stop);  // before the cap: "stop"
  // min_tokens == max_tokens: the cap still ends it, and no stop string is searched in the first min_tokens tokens.
  SamplingParams mm = with_stop({"b"});
  mm.min_tokens = 2, mm.max_tokens = 2;
  StopChecker smm(mm, {kEos});
  EXPECT_EQ(smm.on_token(10, "ab", 1, 2).reason, FinishReason::Length);
}

TEST(StopChecker, StreamableCharsHoldsBackStopPrefixes) {
  StopChecker sc(with_stop({"</answer>", "##"}), {kEos});
  EXPECT_EQ(sc.max_stop_len(), 9u);
  EXPECT_EQ(sc.streamable_chars("hello"), 5u);
  EXPECT_EQ(sc.streamable_chars("hello </ans"), 6u);  // "</ans" could become "</answer>"
  EXPECT_EQ(sc.streamable_chars("hello <"), 6u);
  EXPECT_EQ(sc.streamable_chars("hello #"), 6u);
  EXPECT_EQ(sc.streamable_chars("a</x"), 4u);  // "</x" is no longer a prefix
  EXPECT_EQ(sc.streamable_chars(""), 0u);
  EXPECT_EQ(sc.streamable_chars("<"), 0u);
  // With include_stop_str_in_output nothing needs holding back; without stop strings neither.
  StopChecker inc(with_stop({"</answer>"}, true), {kEos});
  EXPECT_EQ(inc.streamable_chars("hello </ans"), 11u);
  StopChecker none(SamplingParams{}, {kEos});
  EXPECT_EQ(none.streamable_chars("hello </ans"), 11u);
}

TEST(StopChecker, BadArgumentsThrow) {
  StopChecker sc(SamplingParams{}, {kEos});
  EXPECT_THROW(sc.on_token(1, "ab", 3, 1), Error);
  EXPECT_THROW(sc.on_token(1, "ab", 0, 0), Error);
}

}  // namespace
}  // namespace ssmserve
