// bad_words (engine/bad_words.h) through the engine on the bundled tiny-mamba: greedy outputs that contained a banned
// word no longer contain any of its token sequences and agree with the unconstrained output up to where it first
// completed one; a multi-token sequence is banned only after its prefix was generated (the prompt does not count, as
// vLLM); a request with bad words gives the same tokens batched with others, with chunked prefill, after a
// preemption, with speculative decoding (drafts verified under the same mask) and with the prefix cache; bad words
// compose with structured outputs; a row they leave with nothing to sample ends only its request, in a verify row too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "engine/bad_words.h"
#include "engine/llm_engine.h"
#include "engine/spec_decode.h"
#include "engine/structured_output.h"
#include "scripted_proposer.h"
#include "test_util.h"

namespace ssmserve {
namespace {

EngineConfig tiny_config() {
  EngineConfig cfg;
  cfg.model = testing::model_dir("tiny-mamba");
  cfg.num_threads = 2;
  return cfg;
}

const std::vector<std::string> kPrompts = {"It is a truth universally acknowledged", "And the LORD said unto Moses,",
                                           "The", "Emma Woodhouse, handsome, clever, and rich"};

SamplingParams greedy(int max_tokens = 32) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  return sp;
}

/// Index one past the first occurrence of `seq` in `ids` (where it is completed), or 0 when it does not occur.
size_t first_completion(std::span<const int> ids, std::span<const int> seq) {
  const auto it = std::search(ids.begin(), ids.end(), seq.begin(), seq.end());
  return it == ids.end() ? 0 : static_cast<size_t>(it - ids.begin()) + seq.size();
}

class BadWordsModel : public ::testing::Test {
 protected:
  void SetUp() override { SSM_SKIP_IF_NO_MODEL(tiny_config().model); }
};

// Words taken from each prompt's unconstrained greedy continuation: banned, none of their token sequences occurs any
// more, and the tokens before the first place the unconstrained output completed one are unchanged.
TEST_F(BadWordsModel, GreedyOutputNeverContainsABannedWord) {
  LLM llm(tiny_config());
  const Tokenizer& tok = *llm.engine().tokenizer();
  const int vocab = llm.engine().model_config().vocab_size;
  // Words that are one token as given and with a space (both variants banned; see BadWordsTokenize for the others).
  const std::vector<std::vector<std::string>> words = {{"sure", "am"}, {"son", "children"}, {"other"}, {"very", "am"}};
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    SCOPED_TRACE(kPrompts[i]);
    const std::vector<int> before = llm.generate({kPrompts[i]}, greedy())[0].outputs[0].token_ids;
    const auto seqs = tokenize_bad_words(words[i], tok, vocab);
    size_t cut = before.size() + 1;  // where the unconstrained output first completes a banned sequence
    for (const auto& s : seqs)
      if (const size_t c = first_completion(before, s); c > 0) cut = std::min(cut, c);
    ASSERT_LE(cut, before.size()) << "the unconstrained output contains none of the words";
    SamplingParams sp = greedy();
    sp.bad_words = words[i];
    const RequestOutput out = llm.generate({kPrompts[i]}, sp)[0];
    const std::vector<int>& after = out.outputs[0].token_ids;
    ASSERT_EQ(after.size(), before.size());
    for (const auto& s : seqs) EXPECT_EQ(first_completion(after, s), 0u) << "banned sequence generated: " << tok.decode(s);
    EXPECT_TRUE(std::equal(before.begin(), before.begin() + static_cast<long>(cut - 1), after.begin()));
    EXPECT_NE(before[cut - 1], after[cut - 1]);
    for (const std::string& w : words[i]) {
      ASSERT_EQ(tokenize_bad_words(std::vector<std::string>{w}, tok, vocab).size(), 2u) << w;
      EXPECT_EQ(out.outputs[0].text.find(" " + w + " "), std::string::npos) << w;
    }
  }
}

// Token-id sequences (bad_words_token_ids set directly): [o_k, o_k+1] bans o_k+1 only right after o_k, so the output
// keeps o_0..o_k and changes at k + 1; a sequence whose prefix is never generated, or is only the prompt's end, bans
// nothing (only output tokens count, as vLLM).
TEST_F(BadWordsModel, MultiTokenSequenceIsBannedOnlyAfterItsPrefix) {
  LLM llm(tiny_config());
  const std::string& prompt = kPrompts[3];
  const std::vector<int> o = llm.generate({prompt}, greedy())[0].outputs[0].token_ids;
  const std::vector<int> prompt_ids = llm.engine().tokenizer()->encode(prompt);
  auto run = [&](std::vector<std::vector<int>> seqs) {
    SamplingParams sp = greedy();
    sp.bad_words_token_ids = std::move(seqs);
    return llm.generate({prompt}, sp)[0].outputs[0].token_ids;
  };
  for (const size_t k : {size_t{2}, size_t{7}}) {
    SCOPED_TRACE(k);
    for (const auto& seq : {std::vector<int>{o[k], o[k + 1]}, std::vector<int>{o[k - 1], o[k], o[k + 1]}}) {
      const std::vector<int> got = run({seq});
      EXPECT_TRUE(std::equal(o.begin(), o.begin() + static_cast<long>(k + 1), got.begin()));
      EXPECT_NE(got[k + 1], o[k + 1]);
      EXPECT_EQ(first_completion(got, seq), 0u);
    }
  }
  int never = 0;  // a token the output never holds
  while (std::find(o.begin(), o.end(), never) != o.end()) ++never;
  EXPECT_EQ(run({{never, o[3]}}), o);
  EXPECT_EQ(run({{prompt_ids.back(), o[0]}}), o);  // the prefix is the prompt's last token: not banned
  EXPECT_EQ(run({{never, never, o[0]}}), o);        // a prefix longer than the output so far: nothing
  // A one-token sequence is banned everywhere, from the first token on.
  const std::vector<int> no_first = run({{o[0]}});
  EXPECT_EQ(std::count(no_first.begin(), no_first.end(), o[0]), 0);
}

// The ban changes the distribution a request samples from and nothing else: greedy and seeded sampled requests with
// bad words give the same tokens alone, batched with unconstrained neighbours (chunked prefill), preempted, with
// n-gram speculation (their drafts verified under the ban) and from the prefix cache.
TEST_F(BadWordsModel, TokensAreIndependentOfBatchPreemptionSpeculationAndCache) {
  std::vector<SamplingParams> params;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    SamplingParams sp = greedy(40);
    if (i >= 2) sp.temperature = 0.8, sp.seed = 40 + i;
    if (i % 2 == 0) sp.bad_words = {"and", "the", "other"};  // frequent words: the ban acts at many positions
    params.push_back(sp);
  }
  std::vector<std::vector<int>> alone(kPrompts.size());
  {
    LLM llm(tiny_config());
    const auto seqs = tokenize_bad_words(params[0].bad_words, *llm.engine().tokenizer(), llm.engine().model_config().vocab_size);
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      alone[i] = llm.generate({kPrompts[i]}, {params[i]})[0].outputs[0].token_ids;
      if (i % 2 == 0)
        for (const auto& s : seqs) EXPECT_EQ(first_completion(alone[i], s), 0u) << i;
    }
  }
  auto run_engine = [&](EngineConfig cfg, bool preempt, int64_t* num_drafts = nullptr) {
    LLMEngine e(std::move(cfg));
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      Request r;
      r.request_id = "r" + std::to_string(i);
      r.prompt = kPrompts[i];
      r.params = params[i];
      e.add_request(std::move(r));
    }
    std::map<std::string, std::vector<int>> got;
    for (int step = 0; e.has_unfinished_requests(); ++step) {
      if (preempt && step % 4 == 3) e.preempt_newest_request();
      for (auto& o : e.step())
        if (o.finished) got[o.request_id] = o.outputs[0].token_ids;
    }
    if (num_drafts) *num_drafts = e.spec_decode_stats().num_drafts;
    return got;
  };
  struct Variant {
    const char* name;
    bool preempt;
    std::function<void(EngineConfig&)> set;
  };
  const std::vector<Variant> variants = {
      {"batched, chunked prefill", false, [](EngineConfig& c) { c.scheduler.max_num_batched_tokens = 5; }},
      {"preempted", true, [](EngineConfig&) {}},
      {"speculative (n-gram)", false,
       [](EngineConfig& c) {
         c.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                    "prompt_lookup_max": 3})";
       }},
      {"prefix cache, second pass", false, [](EngineConfig& c) { c.enable_prefix_caching = true; }},
  };
  for (const Variant& v : variants) {
    EngineConfig cfg = tiny_config();
    v.set(cfg);
    int64_t num_drafts = 0;
    auto got = run_engine(cfg, v.preempt, &num_drafts);
    if (!cfg.speculative_config.empty()) EXPECT_GT(num_drafts, 0);
    if (cfg.enable_prefix_caching) got = run_engine(cfg, v.preempt);
    for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(got["r" + std::to_string(i)], alone[i]) << v.name << " " << i;
  }
}

// Speculative decoding with a drafter that always proposes the UNCONSTRAINED continuation: the drafts run into the
// banned token, which the verify row must reject (it samples each position under the ban), so the output is the
// banned output without speculation.
TEST_F(BadWordsModel, DraftsOfABannedTokenAreRejected) {
  const std::string& prompt = kPrompts[1];
  LLM plain(tiny_config());
  const std::vector<int> prompt_ids = plain.engine().tokenizer()->encode(prompt);
  const std::vector<int> unconstrained = plain.generate({prompt}, greedy())[0].outputs[0].token_ids;
  SamplingParams sp = greedy();
  sp.bad_words = {"son", "children"};
  const std::vector<int> want = plain.generate({prompt}, sp)[0].outputs[0].token_ids;
  ASSERT_NE(want, unconstrained);
  EngineConfig cfg = tiny_config();
  cfg.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3})";
  LLMEngine e(cfg);
  const std::map<std::vector<int>, std::vector<int>> answers = {{prompt_ids, unconstrained}};
  e.set_proposer(std::make_unique<testing::ScriptedProposer>(&answers, e.model_config().vocab_size,
                                                              [](const RequestState&, std::mt19937&) { return 3; }));
  Request r;
  r.request_id = "r";
  r.prompt = prompt;
  r.params = sp;
  e.add_request(std::move(r));
  std::vector<int> got;
  while (e.has_unfinished_requests())
    for (auto& o : e.step())
      if (o.finished) got = o.outputs[0].token_ids;
  EXPECT_EQ(got, want);
  EXPECT_GT(e.spec_decode_stats().num_draft_tokens, e.spec_decode_stats().num_accepted_tokens);  // some were rejected
  EXPECT_GT(e.spec_decode_stats().num_accepted_tokens, 0);
}

// Under a grammar the ban applies after the grammar's mask: the output is still a word of the language and holds no
// banned sequence.
TEST_F(BadWordsModel, ComposesWithStructuredOutputs) {
  if (!StructuredOutputManager::available()) GTEST_SKIP() << "built without structured outputs (xgrammar)";
  LLM llm(tiny_config());
  SamplingParams sp = greedy(40);
  sp.ignore_eos = false;
  StructuredOutputsParams so;
  so.regex = "[a-z]{1,8}( [a-z]{1,8}){3,6}\\.";
  sp.structured_outputs = so;
  const std::string before = llm.generate({kPrompts[2]}, sp)[0].outputs[0].text;
  ASSERT_TRUE(std::regex_match(before, std::regex(*so.regex))) << before;
  const std::string first = before.substr(0, before.find(' ')), second = before.substr(before.find(' ') + 1);
  sp.bad_words = {first, second.substr(0, second.find_first_of(" ."))};
  const RequestOutput out = llm.generate({kPrompts[2]}, sp)[0];
  EXPECT_TRUE(std::regex_match(out.outputs[0].text, std::regex(*so.regex))) << out.outputs[0].text;
  const auto seqs = tokenize_bad_words(sp.bad_words, *llm.engine().tokenizer(), llm.engine().model_config().vocab_size);
  for (const auto& s : seqs) EXPECT_EQ(first_completion(out.outputs[0].token_ids, s), 0u);
  EXPECT_NE(out.outputs[0].text, before);
}

/// Drafts `draft` (k tokens of it) for the one prompt `for_prompt`, and counts the steps it drafted for it.
class FixedProposer final : public Proposer {
 public:
  FixedProposer(std::vector<int> for_prompt, int draft) : prompt_(std::move(for_prompt)), draft_(draft) {}
  void propose(std::span<RequestState* const> reqs, int k) override {
    for (RequestState* r : reqs) {
      r->draft_token_ids.clear();
      if (r->request.prompt_token_ids != prompt_) continue;
      r->draft_token_ids.assign(static_cast<size_t>(k), draft_);
      ++proposed;
    }
  }
  int proposed = 0;

 private:
  std::vector<int> prompt_;
  int draft_;
};

// bad_words banning every token allowed_token_ids leaves: the request ends (finish_reason abort) and its neighbour
// goes on as alone; at the first token (a prefill row) and inside a speculative verify row (the allowed token b is
// banned only after b, and the drafter proposes b's).
TEST_F(BadWordsModel, ARowWithNothingLeftEndsOnlyItsRequest) {
  const int a = 1000, b = 2000;
  EngineConfig cfg = tiny_config();
  cfg.speculative_config = R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3})";
  LLMEngine e(cfg);
  auto proposer = std::make_unique<FixedProposer>(e.tokenizer()->encode(kPrompts[3]), b);
  FixedProposer* drafts = proposer.get();
  e.set_proposer(std::move(proposer));
  auto add = [&](const std::string& id, const std::string& prompt, SamplingParams sp) {
    Request r;
    r.request_id = id;
    r.prompt = prompt;
    r.params = std::move(sp);
    e.add_request(std::move(r));
  };
  add("plain", kPrompts[2], greedy(12));
  SamplingParams first = greedy(12);
  first.allowed_token_ids = {a};
  first.bad_words_token_ids = {{a}};
  add("first", kPrompts[1], first);
  SamplingParams verify = greedy(12);
  verify.allowed_token_ids = {a, b};
  verify.bad_words_token_ids = {{a}, {b, b}};
  add("verify", kPrompts[3], verify);
  std::map<std::string, RequestOutput> done;
  while (e.has_unfinished_requests())
    for (auto& o : e.step())
      if (o.finished) done[o.request_id] = o;
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done["first"].outputs[0].finish_reason, FinishReason::Abort);
  EXPECT_TRUE(done["first"].outputs[0].token_ids.empty());
  EXPECT_EQ(done["verify"].outputs[0].finish_reason, FinishReason::Abort);
  EXPECT_EQ(done["verify"].outputs[0].token_ids, std::vector<int>{b});
  EXPECT_GT(drafts->proposed, 0);  // its second token came from a verify row
  EXPECT_EQ(done["plain"].outputs[0].finish_reason, FinishReason::Length);
  LLM alone(tiny_config());
  EXPECT_EQ(done["plain"].outputs[0].token_ids, alone.generate({kPrompts[2]}, greedy(12))[0].outputs[0].token_ids);
}

}  // namespace
}  // namespace ssmserve
