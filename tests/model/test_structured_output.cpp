// Structured outputs (engine/structured_output.h) on the bundled tiny-mamba: every constraint kind's outputs are words
// of its language (checked independently: std::regex, nlohmann::json), greedy and sampled; a constrained request gives
// the same tokens batched with others, after a preemption, with speculative decoding on and with the prefix cache;
// the logprobs are those of the masked distribution; bad constraints are errors naming the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <fstream>
#include <regex>

#include "config/hf_json.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "engine/structured_output.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ssmserve {
namespace {

using ::testing::HasSubstr;

EngineConfig tiny_config() {
  EngineConfig cfg;
  cfg.model = testing::model_dir("tiny-mamba");
  return cfg;
}

const std::vector<std::string> kPrompts = {"It is a truth universally acknowledged", "And the LORD said unto Moses,",
                                           "The", "Emma Woodhouse, handsome, clever, and rich"};

SamplingParams constrained(StructuredOutputsParams so, double temperature = 0.0, uint64_t seed = 0, int max_tokens = 48) {
  SamplingParams sp;
  sp.temperature = temperature;
  sp.seed = seed;
  sp.max_tokens = max_tokens;
  sp.structured_outputs = std::move(so);
  return sp;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StructuredOutput, ApplyTokenBitmaskMasksClearBitsOnly) {
  std::vector<float> logits(70, 1.0f);
  std::vector<int32_t> mask(static_cast<size_t>(token_bitmask_words(70)), 0);
  ASSERT_EQ(mask.size(), 3u);
  for (const int id : {0, 31, 32, 69}) mask[static_cast<size_t>(id / 32)] |= static_cast<int32_t>(1u << (id % 32));
  apply_token_bitmask(logits, mask);
  for (int i = 0; i < 70; ++i) {
    const bool kept = i == 0 || i == 31 || i == 32 || i == 69;
    EXPECT_EQ(std::isinf(logits[static_cast<size_t>(i)]), !kept) << i;
  }
  std::vector<int32_t> short_mask(2, -1);
  EXPECT_THROW(apply_token_bitmask(logits, short_mask), Error);
}

TEST(StructuredOutput, ChoiceAsGrammarEscapesQuotesBackslashesAndControls) {
  const std::vector<std::string> c = {"a\"b", "c\\d", "e\nf\x01"};
  EXPECT_EQ(choice_as_grammar(c), "root ::= \"a\\\"b\" | \"c\\\\d\" | \"e\\u000af\\u0001\"");
}

TEST(StructuredOutput, ParamsNeedExactlyOneNonEmptyConstraint) {
  StructuredOutputsParams p;
  EXPECT_THAT(error_of([&] { p.validate(); }), HasSubstr("exactly one"));
  p.regex = "a+";
  p.json_object = true;
  EXPECT_THAT(error_of([&] { p.validate(); }), HasSubstr("got 2"));
  p.json_object = false;
  EXPECT_NO_THROW(p.validate());
  EXPECT_STREQ(p.kind(), "regex");
  p.regex = "";
  EXPECT_THAT(error_of([&] { p.validate(); }), HasSubstr("structured_outputs.regex must not be empty"));
  StructuredOutputsParams c;
  c.choice = std::vector<std::string>{};
  EXPECT_THAT(error_of([&] { c.validate(); }), HasSubstr("structured_outputs.choice"));
  c.choice = std::vector<std::string>{"x", ""};
  EXPECT_THAT(error_of([&] { c.validate(); }), HasSubstr("choice[1]"));
  SamplingParams sp;  // SamplingParams::validate checks it too
  sp.structured_outputs = c;
  EXPECT_THAT(error_of([&] { sp.validate(100); }), HasSubstr("choice[1]"));
}

TEST(StructuredOutput, JsonNestingDepthCountsBracketsOutsideStrings) {  // (config/hf_json.h)
  EXPECT_EQ(json_nesting_depth("3"), 0);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}]})"), 4);
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[{{{\"[["})"), 1);
}

/// A schema whose compilation takes ~1 s on the 2-core CI machine (optional properties cost roughly quadratically).
std::string slow_schema(int properties) {
  std::string j = R"({"type": "object", "properties": {)";
  for (int i = 0; i < properties; ++i) j += (i ? ", " : "") + std::string("\"p") + std::to_string(i) + "\": {\"type\": \"integer\"}";
  return j + "}}";
}

class StructuredOutputModel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!StructuredOutputManager::available()) GTEST_SKIP() << "built without structured outputs (xgrammar)";
    SSM_SKIP_IF_NO_MODEL(tiny_config().model);
  }
};

TEST_F(StructuredOutputModel, ChoiceOutputsAreOneOfTheChoices) {
  LLM llm(tiny_config());
  StructuredOutputsParams so;
  so.choice = std::vector<std::string>{"yes", "no", "maybe so", "The end"};
  for (const double t : {0.0, 1.0})
    for (uint64_t seed = 0; seed < (t > 0 ? 6u : 1u); ++seed) {
      const auto outs = llm.generate(kPrompts, constrained(so, t, seed));
      for (const auto& o : outs) {
        EXPECT_THAT(*so.choice, ::testing::Contains(o.outputs[0].text)) << o.prompt << " t=" << t << " seed=" << seed;
        EXPECT_EQ(o.outputs[0].finish_reason, FinishReason::Stop);
      }
    }
}

TEST_F(StructuredOutputModel, RegexAndGrammarOutputsMatch) {
  LLM llm(tiny_config());
  StructuredOutputsParams re;
  re.regex = "[0-9]{3}-[a-z]{2,5}( [A-Z][a-z]{1,6})?";
  StructuredOutputsParams g;
  g.grammar = "root ::= \"The answer is \" [0-9] [0-9]? \" \" (\"apples\" | \"pears\") \".\"";
  const std::regex re_check("[0-9]{3}-[a-z]{2,5}( [A-Z][a-z]{1,6})?");
  const std::regex g_check("The answer is [0-9][0-9]? (apples|pears)\\.");
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const double t = seed == 0 ? 0.0 : 1.0;
    for (const auto& o : llm.generate(kPrompts, constrained(re, t, seed))) {
      EXPECT_TRUE(std::regex_match(o.outputs[0].text, re_check)) << "'" << o.outputs[0].text << "'";
      EXPECT_EQ(o.outputs[0].finish_reason, FinishReason::Stop);
    }
    for (const auto& o : llm.generate(kPrompts, constrained(g, t, seed))) {
      EXPECT_TRUE(std::regex_match(o.outputs[0].text, g_check)) << "'" << o.outputs[0].text << "'";
      EXPECT_EQ(o.outputs[0].finish_reason, FinishReason::Stop);
    }
  }
}

TEST_F(StructuredOutputModel, JsonSchemaOutputsParseAndFollowTheSchema) {
  LLM llm(tiny_config());
  StructuredOutputsParams so;
  so.json = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
               "ok": {"type": "boolean"}, "tag": {"enum": ["red", "green"]}}, "required": ["name", "ok", "tag"]})";
  so.disable_any_whitespace = true;
  for (uint64_t seed = 0; seed < 3; ++seed) {
    for (const auto& o : llm.generate(kPrompts, constrained(so, seed == 0 ? 0.0 : 1.0, seed, 64))) {
      const std::string& text = o.outputs[0].text;
      ASSERT_EQ(o.outputs[0].finish_reason, FinishReason::Stop) << text;
      const auto j = nlohmann::json::parse(text);  // throws (fails the test) when the output is not JSON
      ASSERT_TRUE(j.is_object()) << text;
      EXPECT_EQ(j.size(), 3u) << text;  // no properties beyond the schema's (strict by default)
      ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
      EXPECT_LE(j["name"].get<std::string>().size(), 8u) << text;
      ASSERT_TRUE(j.contains("ok") && j["ok"].is_boolean()) << text;
      ASSERT_TRUE(j.contains("tag")) << text;
      EXPECT_TRUE(j["tag"] == "red" || j["tag"] == "green") << text;
      // disable_any_whitespace: exactly the separators ", " and ": " (xgrammar's, as Python's json.dumps), in order.
      const auto oj = nlohmann::ordered_json::parse(text);
      std::string canonical = "{";
      for (const auto& [k, v] : oj.items()) canonical += (canonical.size() > 1 ? ", " : "") + nlohmann::json(k).dump() + ": " + v.dump();
      EXPECT_EQ(text, canonical + "}");
    }
  }
}

TEST_F(StructuredOutputModel, JsonObjectOutputsStartAnObject) {
  LLM llm(tiny_config());
  StructuredOutputsParams so;
  so.json_object = true;
  for (const auto& o : llm.generate(kPrompts, constrained(so, 0.0, 0, 40))) {
    const std::string& text = o.outputs[0].text;
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.find_first_not_of(" \t\n\r"), text.find('{')) << text;  // an object, not any JSON value
    if (o.outputs[0].finish_reason == FinishReason::Stop) EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
  }
}

// The constraint changes the distribution it samples from and nothing else: a request's tokens do not depend on the
// batch, the prefill budget, a preemption, speculative decoding of its neighbours or the prefix cache.
TEST_F(StructuredOutputModel, ConstrainedTokensAreIndependentOfBatchPreemptionSpeculationAndCache) {
  StructuredOutputsParams re;
  re.regex = "[a-z]{1,6}( [a-z]{1,6}){2,4}\\.";
  std::vector<SamplingParams> params;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    SamplingParams sp = constrained(re, 0.8, 40 + i, 40);
    if (i % 2 == 1) sp.structured_outputs.reset(), sp.ignore_eos = true, sp.max_tokens = 20;  // unconstrained neighbours
    params.push_back(sp);
  }
  std::vector<std::vector<int>> alone(kPrompts.size());
  {
    LLM llm(tiny_config());
    for (size_t i = 0; i < kPrompts.size(); ++i) alone[i] = llm.generate({kPrompts[i]}, {params[i]})[0].outputs[0].token_ids;
  }
  auto run_engine = [&](EngineConfig cfg, bool preempt) {
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
    auto got = run_engine(cfg, v.preempt);
    if (cfg.enable_prefix_caching) got = run_engine(cfg, v.preempt);
    for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(got["r" + std::to_string(i)], alone[i]) << v.name << " " << i;
  }
}

TEST_F(StructuredOutputModel, LogprobsAreThoseOfTheMaskedDistribution) {
  LLM llm(tiny_config());
  StructuredOutputsParams so;
  so.choice = std::vector<std::string>{"yes", "no"};
  SamplingParams sp = constrained(so, 0.0);
  sp.logprobs = 3;
  const auto out = llm.generate({kPrompts[0]}, sp)[0].outputs[0];
  ASSERT_FALSE(out.logprobs.empty());
  // The first token is the start of "yes" or "no": its logprob is that of the renormalized two-way (or few-way)
  // distribution, so > log(1/#allowed) for the argmax, and every allowed alternative is finite.
  const auto& first = out.logprobs[0];
  EXPECT_GT(first[0].logprob, std::log(0.25f));
  double mass = 0;
  for (size_t k = 1; k < first.size(); ++k)
    if (std::isfinite(first[k].logprob)) mass += std::exp(first[k].logprob);
  EXPECT_LE(mass, 1.0 + 1e-4);
  // Unconstrained, the same position's logprob is that of the whole vocabulary: lower.
  SamplingParams plain;
  plain.temperature = 0;
  plain.max_tokens = 1;
  plain.logprobs = 0;
  const auto free_out = llm.generate({kPrompts[0]}, plain)[0].outputs[0];
  EXPECT_LT(free_out.logprobs[0][0].logprob, first[0].logprob);
}

TEST_F(StructuredOutputModel, CompleteGrammarEndsDespiteMinTokensAndIgnoreEosKeepsToEos) {
  LLM llm(tiny_config());
  StructuredOutputsParams so;
  so.choice = std::vector<std::string>{"yes"};
  SamplingParams sp = constrained(so, 0.0);
  sp.min_tokens = 6;  // "yes" is fewer tokens: once it is complete only EOS remains, and the request must still end
  const auto a = llm.generate({kPrompts[0]}, sp)[0].outputs[0];
  EXPECT_EQ(a.text, "yes");
  EXPECT_EQ(a.finish_reason, FinishReason::Stop);
  // ... at the grammar's EOS (tiny-mamba's id 0): no EOS padding up to min_tokens.
  ASSERT_FALSE(a.token_ids.empty());
  EXPECT_EQ(a.token_ids.back(), 0);
  EXPECT_EQ(std::count(a.token_ids.begin(), a.token_ids.end(), 0), 1);
  sp.min_tokens = 0;
  sp.ignore_eos = true;
  sp.max_tokens = 8;
  const auto b = llm.generate({kPrompts[0]}, sp)[0].outputs[0];
  EXPECT_EQ(b.finish_reason, FinishReason::Length);
  EXPECT_EQ(b.text, "yes");  // after the word only EOS, which the detokenizer skips
  EXPECT_EQ(b.token_ids.size(), 8u);
}

TEST_F(StructuredOutputModel, BadConstraintsAreErrorsNamingTheField) {
  LLMEngine e(tiny_config());
  auto add = [&](StructuredOutputsParams so) {
    return error_of([&] {
      Request r;
      r.request_id = "bad";
      r.prompt = "The";
      r.params = constrained(std::move(so));
      e.add_request(std::move(r));
    });
  };
  StructuredOutputsParams j;
  j.json = "{not json";
  EXPECT_THAT(add(j), HasSubstr("structured_outputs.json"));
  StructuredOutputsParams re;
  re.regex = "([a-z]";
  EXPECT_THAT(add(re), HasSubstr("structured_outputs.regex"));
  StructuredOutputsParams g;
  g.grammar = "root ::= missing_rule";
  EXPECT_THAT(add(g), HasSubstr("structured_outputs.grammar"));
  StructuredOutputsParams t;
  t.structural_tag = R"({"type": "nonsense"})";
  EXPECT_THAT(add(t), HasSubstr("structured_outputs.structural_tag"));
  StructuredOutputsParams two;
  two.regex = "a";
  two.json_object = true;
  EXPECT_THAT(add(two), HasSubstr("exactly one"));
  StructuredOutputsParams deep;
  deep.json = std::string(70, '[') + std::string(70, ']');
  EXPECT_THAT(add(deep), HasSubstr("structured_outputs.json: JSON nests arrays/objects more than 64 levels deep"));
  StructuredOutputsParams big;
  big.regex = std::string(kMaxStructuredOutputBytes + 1, 'a');
  EXPECT_THAT(add(big), HasSubstr("structured_outputs.regex has"));
  // xgrammar's reasons without its log prefix (time, source file and line, "Check failed").
  const std::string why = add(j);
  EXPECT_THAT(why, ::testing::Not(HasSubstr("_deps"))) << why;
  EXPECT_THAT(why, ::testing::Not(HasSubstr("Check failed"))) << why;
  EXPECT_FALSE(e.has_unfinished_requests());
  // The engine still serves after the rejections.
  StructuredOutputsParams ok;
  ok.choice = std::vector<std::string>{"fine"};
  Request r;
  r.request_id = "ok";
  r.prompt = "The";
  r.params = constrained(ok);
  e.add_request(std::move(r));
  std::string text;
  while (e.has_unfinished_requests())
    for (auto& o : e.step())
      if (o.finished) text = o.outputs[0].text;
  EXPECT_EQ(text, "fine");
}

// A row with no token left to sample (a grammar with no way on, or allowed_token_ids outside what the grammar
// allows) ends its own request with finish_reason abort; the requests beside it in the same steps are untouched.
TEST_F(StructuredOutputModel, ARowWithNothingToSampleEndsOnlyItsRequest) {
  LLMEngine e(tiny_config());
  auto add = [&](const std::string& id, SamplingParams sp) {
    Request r;
    r.request_id = id;
    r.prompt = "The";
    r.params = std::move(sp);
    e.add_request(std::move(r));
  };
  SamplingParams plain;
  plain.temperature = 0;
  plain.max_tokens = 12;
  plain.ignore_eos = true;
  add("plain", plain);
  StructuredOutputsParams nowhere;
  nowhere.grammar = "root ::= root";  // no word at all: nothing is ever allowed
  add("nowhere", constrained(nowhere));
  StructuredOutputsParams yes;
  yes.choice = std::vector<std::string>{"yes"};
  SamplingParams disjoint = constrained(yes);
  disjoint.allowed_token_ids = {0};  // only EOS, which the grammar does not allow first
  add("disjoint", disjoint);
  std::map<std::string, RequestOutput> done;
  while (e.has_unfinished_requests())
    for (auto& o : e.step())
      if (o.finished) done[o.request_id] = o;
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done["nowhere"].outputs[0].finish_reason, FinishReason::Abort);
  EXPECT_EQ(done["disjoint"].outputs[0].finish_reason, FinishReason::Abort);
  EXPECT_EQ(done["plain"].outputs[0].finish_reason, FinishReason::Length);
  LLM alone(tiny_config());
  EXPECT_EQ(done["plain"].outputs[0].token_ids, alone.generate({"The"}, plain)[0].outputs[0].token_ids);
}

// A constraint compiles on the manager's worker thread: a slow one (seconds) delays only its own request, while the
// engine goes on stepping the others; aborting it while it compiles leaves nothing behind.
TEST_F(StructuredOutputModel, SlowCompilationDelaysOnlyItsOwnRequest) {
  LLMEngine e(tiny_config());
  StructuredOutputsParams slow;
  slow.json = slow_schema(100);
  auto add = [&](const std::string& id, std::optional<StructuredOutputsParams> so) {
    Request r;
    r.request_id = id;
    r.prompt = "The";
    r.params = constrained(so.value_or(StructuredOutputsParams{}), 0.0, 0, 6);
    r.params.structured_outputs = so;
    r.params.ignore_eos = !so.has_value();
    e.add_request(std::move(r));
  };
  add("slow", slow);
  add("plain", std::nullopt);
  EXPECT_EQ(e.num_waiting_requests(), 2);
  bool plain_done = false, slow_started = false;
  std::string slow_text;
  while (e.has_unfinished_requests())
    for (auto& o : e.step()) {
      if (o.request_id == "plain" && o.finished) plain_done = true;
      if (o.request_id == "slow") {
        if (!slow_started) EXPECT_TRUE(plain_done) << "the plain request waited for the slow compilation";
        slow_started = true;
        if (o.finished) slow_text = o.outputs[0].text;
      }
    }
  EXPECT_TRUE(plain_done);
  ASSERT_TRUE(slow_started);
  EXPECT_EQ(slow_text.substr(0, 1), "{");
  // Aborted while compiling: gone at once; the engine idles and serves the next request.
  StructuredOutputsParams slow2;
  slow2.json = slow_schema(101);
  add("aborted", slow2);
  e.abort_request("aborted");
  EXPECT_FALSE(e.has_unfinished_requests());
  add("after", std::nullopt);
  int n = 0;
  while (e.has_unfinished_requests())
    for (auto& o : e.step()) n += o.request_id == "after" && o.finished;
  EXPECT_EQ(n, 1);
}

}  // namespace
}  // namespace ssmserve

namespace ssmserve {
namespace {

/// tiny-mamba with "<think>" / "</think>" added as tokens 50277 / 50278 (two of its embedding's padding ids), in a
/// temporary folder: a model with reasoning markers for --reasoning-parser.
std::filesystem::path thinking_tiny_mamba() {
  const auto dir = std::filesystem::temp_directory_path() / ("ssm-think-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::copy(testing::model_dir("tiny-mamba"), dir, std::filesystem::copy_options::recursive);
  auto tok = testing::read_json(dir / "tokenizer.json");
  for (const auto& [id, text] : {std::pair{50277, "<think>"}, std::pair{50278, "</think>"}})
    tok["added_tokens"].push_back({{"id", id}, {"content", text}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", false}});
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  return dir;
}

// With a reasoning parser, a constraint applies after the reasoning: from the first token when the prompt closed the
// reasoning block, after the model's "</think>" when the prompt opened one (vLLM's structured outputs with a
// reasoning parser).
TEST_F(StructuredOutputModel, ReasoningParserHoldsTheGrammarUntilTheReasoningEnds) {
  const auto dir = thinking_tiny_mamba();
  EngineConfig cfg = tiny_config();
  cfg.model = dir;
  cfg.reasoning_parser = "qwen3";
  LLM llm(cfg);
  StructuredOutputsParams re;
  re.regex = "[a-z]{1,8}( [a-z]{1,8}){1,3}\\.";
  const std::regex check("[a-z]{1,8}( [a-z]{1,8}){1,3}\\.");
  const Tokenizer& tok = *llm.engine().tokenizer();
  auto ids = [&](const std::string& s) { return tok.encode(s, false); };
  // Closed block in the prompt (thinking disabled): constrained from the first token.
  std::vector<int> closed = ids("It is a truth");
  for (const int t : {50277, 50278}) closed.push_back(t);
  // (The markers' embedding rows were never trained: tiny values that make the CPU's float math slow, so few tokens.)
  SamplingParams sp = constrained(re, 0.0, 0, 16);
  auto out = llm.generate_ids({closed}, sp)[0].outputs[0];
  EXPECT_TRUE(std::regex_match(out.text, check)) << out.text;
  // Open block: unconstrained (equal to no constraint at all) while the model reasons...
  std::vector<int> open = ids("It is a truth");
  open.push_back(50277);
  SamplingParams free_sp = sp;
  free_sp.structured_outputs.reset();
  free_sp.ignore_eos = true;
  free_sp.max_tokens = 6;
  SamplingParams held = sp;
  held.ignore_eos = true;
  held.max_tokens = 6;
  EXPECT_EQ(llm.generate_ids({open}, held)[0].outputs[0].token_ids, llm.generate_ids({open}, free_sp)[0].outputs[0].token_ids);
  // ... and constrained after it writes "</think>" (forced here by a logit bias the grammar then outweighs).
  SamplingParams ends = sp;
  ends.logit_bias[50278] = 100.0f;
  out = llm.generate_ids({open}, ends)[0].outputs[0];
  ASSERT_FALSE(out.token_ids.empty());
  EXPECT_EQ(out.token_ids[0], 50278);
  EXPECT_TRUE(std::regex_match(out.text.substr(std::string("</think>").size()), check)) << out.text;
  EXPECT_EQ(out.text.rfind("</think>", 0), 0u) << out.text;
  // A model without the markers: a clear error naming the flag.
  EngineConfig plain = tiny_config();
  plain.reasoning_parser = "qwen3";
  EXPECT_THAT(error_of([&] { LLMEngine e(plain); }), HasSubstr("--reasoning-parser qwen3: the tokenizer has no token"));
  plain.reasoning_parser = "nonsense";
  EXPECT_THAT(error_of([&] { LLMEngine e(plain); }), HasSubstr("known: deepseek_r1, nemotron_v3, qwen3"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ssmserve
