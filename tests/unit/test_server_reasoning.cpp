// The chat endpoint's reasoning parser (vLLM's --reasoning-parser, server/reasoning_parser.h): where a prompt leaves
// the reasoning (text and token ids), the reasoning / content split of whole replies for both registered formats and
// every prompt state, the same split from the reply streamed in every 2- and 3-piece split, byte by byte and in
// random pieces (a marker split across pieces is held back, never sent), and the response builder's `reasoning` /
// `reasoning_content` / `content` (whole and streamed, include_reasoning false, tool calls parsed from the content
// only).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>

#include "core/error.h"
#include "engine/reasoning.h"
#include "server/reasoning_parser.h"
#include "server/serving.h"

namespace ssmserve::server {
namespace {

using nlohmann::json;
using Opt = std::optional<std::string>;

TEST(ReasoningPrompt, LastMarkerDecides) {
  const ReasoningFormat& f = reasoning_format("qwen3");
  EXPECT_EQ(prompt_reasoning("user: hi\nassistant: ", f), PromptReasoning::None);
  EXPECT_EQ(prompt_reasoning("user: hi\nassistant: <think>\n", f), PromptReasoning::Open);
  EXPECT_EQ(prompt_reasoning("user: hi\nassistant: <think>\n\n</think>\n\n", f), PromptReasoning::Closed);
  // History: an earlier turn's block does not decide; the generation prompt's does.
  EXPECT_EQ(prompt_reasoning("<think>a</think>b\nuser: more\nassistant: <think>\n", f), PromptReasoning::Open);
  EXPECT_EQ(prompt_reasoning("<think>a</think>b\nuser: more\nassistant: ", f), PromptReasoning::Closed);
  EXPECT_EQ(prompt_reasoning("only an end </think> here", f), PromptReasoning::Closed);
  // Token ids, as the engine reads them (start 7, end 8).
  const std::vector<int> none = {1, 2, 3}, open = {1, 8, 2, 7, 3}, closed = {7, 1, 8, 3};
  EXPECT_EQ(prompt_reasoning(none, 7, 8), PromptReasoning::None);
  EXPECT_EQ(prompt_reasoning(open, 7, 8), PromptReasoning::Open);
  EXPECT_EQ(prompt_reasoning(closed, 7, 8), PromptReasoning::Closed);
  EXPECT_EQ(prompt_reasoning(std::vector<int>{}, 7, 8), PromptReasoning::None);
}

TEST(ReasoningPrompt, RegisteredFormats) {
  for (const char* name : {"qwen3", "deepseek_r1", "nemotron_v3"}) {
    const ReasoningFormat& f = reasoning_format(name);
    EXPECT_EQ(f.start, "<think>");
    EXPECT_EQ(f.end, "</think>");
  }
  EXPECT_TRUE(reasoning_format("deepseek_r1").starts_in_reasoning);
  // nemotron_v3 (Nemotron 3 Nano): its template's thinking-off prompt ends "<think></think>": the reply is content
  // (vLLM's enable_thinking=false swap); thinking on ("<think>\n"): reasoning until </think>.
  const ReasoningFormat& nv3 = reasoning_format("nemotron_v3");
  EXPECT_TRUE(nv3.starts_in_reasoning);
  const auto off = ReasoningParser(nv3, prompt_reasoning("<|im_start|>assistant\n<think></think>", nv3)).extract("Hi.");
  EXPECT_EQ(off.content, "Hi.");
  EXPECT_FALSE(off.reasoning);
  const auto on = ReasoningParser(nv3, prompt_reasoning("<|im_start|>assistant\n<think>\n", nv3)).extract("r</think>c");
  EXPECT_EQ(on.reasoning, "r");
  EXPECT_EQ(on.content, "c");
  ReasoningFormat empty{"x", "", "</think>", false};
  EXPECT_THROW(ReasoningParser(empty, PromptReasoning::Open), Error);
}

struct Case {
  std::string format;       // a registered name, or "content-first": qwen3's markers with starts_in_reasoning false
  PromptReasoning prompt;
  std::string text;
  Opt reasoning, content;
};

ReasoningFormat format_of(const std::string& name) {
  if (name == "content-first") {  // a format whose output is content until the model writes the start marker
    ReasoningFormat f = reasoning_format("qwen3");
    f.starts_in_reasoning = false;
    return f;
  }
  return reasoning_format(name);
}

std::vector<Case> cases() {
  using P = PromptReasoning;
  const Opt null;
  std::vector<Case> out;
  for (const char* f : {"qwen3", "deepseek_r1"}) {
    // The prompt opened the block (Qwen3.5's template): reasoning first, whatever the format.
    out.push_back({f, P::Open, "\nLet me see.\n</think>\n\nThe answer.", "\nLet me see.\n", "\n\nThe answer."});
    out.push_back({f, P::Open, "still thinking when max_tokens hit", "still thinking when max_tokens hit", null});
    out.push_back({f, P::Open, "</think>Only content.", null, "Only content."});  // empty reasoning
    out.push_back({f, P::Open, "Thought.</think>", "Thought.", null});                 // nothing after it
    out.push_back({f, P::Open, "<think>A leading start marker.</think>B", "A leading start marker.", "B"});
    out.push_back({f, P::Open, "A</think>B</think>C<think>D", "A", "BCD"});  // stray markers never reach the content
    out.push_back({f, P::Open, "x < y and a </thi", "x < y and a </thi", null});  // a partial marker at the end
    out.push_back({f, P::Open, "<<think>></think><</think", "<>", "<</think"});
    out.push_back({f, P::Open, "é\xE2\x82</think>\xAC ü", "é\xE2\x82", "\xAC ü"});  // bytes pass through unchanged
    out.push_back({f, P::Open, "", null, null});
    // The prompt closed the block (thinking disabled): all content, the markers dropped.
    out.push_back({f, P::Closed, "Hello there.", null, "Hello there."});
    out.push_back({f, P::Closed, "A</think>B<think>C", null, "ABC"});
  }
  // No marker in the prompt: starts_in_reasoning decides. deepseek_r1 and qwen3 (vLLM's current parser): reasoning first.
  for (const char* f : {"deepseek_r1", "qwen3"}) {
    out.push_back({f, P::None, "Hmm.</think>Yes.", "Hmm.", "Yes."});
    out.push_back({f, P::None, "<think>Hmm.</think>Yes.", "Hmm.", "Yes."});
    out.push_back({f, P::None, "never closed", "never closed", null});
  }
  // A content-first format (starts_in_reasoning false): content until the model writes the start marker.
  out.push_back({"content-first", P::None, "<think>\nHmm.\n</think>\n\nYes.", "\nHmm.\n", "\n\nYes."});
  out.push_back({"content-first", P::None, "plain answer", null, "plain answer"});
  out.push_back({"content-first", P::None, "<think>truncated", "truncated", null});
  out.push_back({"content-first", P::None, "pre <think>R</think>post", "R", "pre post"});
  out.push_back({"content-first", P::None, "A</think>B", null, "AB"});
  return out;
}

std::string trace(const Case& c) {
  const char* p = c.prompt == PromptReasoning::Open ? "open" : c.prompt == PromptReasoning::Closed ? "closed" : "none";
  return c.format + " / prompt " + p + ": " + json(c.text).dump(-1, ' ', false, json::error_handler_t::replace);
}

TEST(ReasoningParser, WholeReplies) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(trace(c));
    const ReasoningSplit s = ReasoningParser(format_of(c.format), c.prompt).extract(c.text);
    EXPECT_EQ(s.reasoning, c.reasoning);
    EXPECT_EQ(s.content, c.content);
  }
}

/// Streams `text` through a fresh parser in pieces ending at `cuts` (the last piece final); returns the joined
/// reasoning and content, and checks that no delta holds a marker.
std::pair<std::string, std::string> stream(const Case& c, std::vector<size_t> cuts) {
  ReasoningParser p(format_of(c.format), c.prompt);
  std::string reasoning, content;
  size_t at = 0;
  cuts.push_back(c.text.size());
  for (size_t i = 0; i < cuts.size(); ++i) {
    const size_t end = std::max(at, std::min(cuts[i], c.text.size()));
    const ReasoningDelta d = p.feed(std::string_view(c.text).substr(at, end - at), i + 1 == cuts.size());
    for (const std::string* part : {&d.reasoning, &d.content}) {
      EXPECT_EQ(part->find("<think>"), std::string::npos) << *part;
      EXPECT_EQ(part->find("</think>"), std::string::npos) << *part;
    }
    reasoning += d.reasoning;
    content += d.content;
    at = end;
  }
  return {reasoning, content};
}

TEST(ReasoningParser, StreamedInEverySplitAgreesWithWhole) {
  std::mt19937 rng(7);
  for (const Case& c : cases()) {
    SCOPED_TRACE(trace(c));
    const std::pair<std::string, std::string> want{c.reasoning.value_or(""), c.content.value_or("")};
    const size_t n = c.text.size();
    EXPECT_EQ(stream(c, {}), want);
    for (size_t i = 0; i <= n; ++i) {
      EXPECT_EQ(stream(c, {i}), want) << "cut " << i;
      for (size_t j = i; j <= n; ++j) EXPECT_EQ(stream(c, {i, j}), want) << "cuts " << i << ", " << j;
    }
    std::vector<size_t> bytes;
    for (size_t i = 1; i < n; ++i) bytes.push_back(i);
    EXPECT_EQ(stream(c, bytes), want) << "byte by byte";
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<size_t> cuts;
      for (size_t at = 0; at < n;) cuts.push_back(at += std::uniform_int_distribution<size_t>(0, 5)(rng));
      EXPECT_EQ(stream(c, cuts), want) << "random pieces, trial " << trial;
    }
  }
}

TEST(ReasoningParser, HoldsBackAPartialMarkerOnly) {
  ReasoningParser p(reasoning_format("qwen3"), PromptReasoning::Open);
  ReasoningDelta d = p.feed("Let me think.</th", false);
  EXPECT_EQ(d.reasoning, "Let me think.");  // "</th" may begin the end marker: held
  EXPECT_EQ(d.content, "");
  EXPECT_TRUE(p.in_reasoning());
  d = p.feed("ink>Done", false);
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Done");
  EXPECT_FALSE(p.in_reasoning());
  d = p.feed(" <", false);  // in the content a stray marker is dropped too: "<" is held
  EXPECT_EQ(d.content, " ");
  d = p.feed("b>", false);  // not a marker after all: sent
  EXPECT_EQ(d.content, "<b>");
  d = p.feed("<thi", false);
  EXPECT_EQ(d.content, "");
  d = p.feed("", true);  // the end: what was held is text
  EXPECT_EQ(d.content, "<thi");
  // Text that cannot begin a marker is sent at once.
  ReasoningParser q(reasoning_format("deepseek_r1"), PromptReasoning::None);
  d = q.feed("abc>", false);
  EXPECT_EQ(d.reasoning, "abc>");
}

// --- The response builder ----------------------------------------------------------------------------------------

/// A delta output of choice text `text` (its logprobs: one entry, token 5).
RequestOutput output(const std::string& text, bool finished) {
  RequestOutput o;
  o.request_id = "r";
  o.outputs.resize(1);
  o.outputs[0].text = text;
  o.outputs[0].token_ids.assign(1, 5);
  o.outputs[0].logprobs = {{TokenLogprob{5, -0.5f}}};
  o.outputs[0].finish_reason = finished ? FinishReason::Stop : FinishReason::None;
  o.delta_text = text;
  o.delta_token_ids.assign(1, 5);
  o.finished = finished;
  return o;
}

std::shared_ptr<GenerationJob> reasoning_job(bool stream, PromptReasoning prompt, bool include_reasoning = true,
                                             const std::string& tool_parser = "") {
  auto job = std::make_shared<GenerationJob>();
  job->chat = true;
  job->id = "chatcmpl-1";
  job->stream = stream;
  job->request_ids = {"r"};
  job->prompts.resize(1);
  job->reasoning = &reasoning_format("qwen3");
  job->prompt_reasoning = prompt;
  job->include_reasoning = include_reasoning;
  job->tool_parser = tool_parser;
  job->logprobs = 0;
  return job;
}

/// The message of a whole response to `pieces`.
json whole(std::shared_ptr<GenerationJob> job, const std::vector<std::string>& pieces, json* choice_out = nullptr) {
  ResponseBuilder rb(std::move(job));
  for (size_t i = 0; i < pieces.size(); ++i) rb.on_output(0, output(pieces[i], i + 1 == pieces.size()));
  EXPECT_TRUE(rb.all_finished());
  const json r = rb.final_response();
  if (choice_out) *choice_out = r["choices"][0];
  return r["choices"][0]["message"];
}

/// The streamed chunks' choice objects for `pieces`.
std::vector<json> streamed(std::shared_ptr<GenerationJob> job, const std::vector<std::string>& pieces) {
  ResponseBuilder rb(std::move(job));
  std::vector<json> out;
  for (size_t i = 0; i < pieces.size(); ++i)
    for (const auto& c : rb.on_output(0, output(pieces[i], i + 1 == pieces.size()))) out.push_back(c["choices"][0]);
  return out;
}

TEST(ReasoningResponses, WholeAndStreamed) {
  const std::vector<std::string> pieces = {"Let me ", "think.</th", "ink>\n\nThe answer", " is 4."};
  const json m = whole(reasoning_job(false, PromptReasoning::Open), pieces);
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["reasoning"], "Let me think.");
  EXPECT_EQ(m["reasoning_content"], "Let me think.");
  EXPECT_EQ(m["content"], "\n\nThe answer is 4.");
  EXPECT_FALSE(m.contains("tool_calls"));

  std::string reasoning, reasoning_content, content;
  const std::vector<json> choices = streamed(reasoning_job(true, PromptReasoning::Open), pieces);
  for (const json& ch : choices) {
    const json& d = ch["delta"];
    EXPECT_TRUE(!d.contains("reasoning") || !d.contains("content")) << d;  // this split never mixes them in a chunk
    if (d.contains("reasoning")) reasoning += d["reasoning"].get<std::string>();
    if (d.contains("reasoning_content")) reasoning_content += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    EXPECT_FALSE(ch["logprobs"].is_null());  // every piece had a token
  }
  EXPECT_EQ(reasoning, "Let me think.");
  EXPECT_EQ(reasoning_content, reasoning);
  EXPECT_EQ(content, "\n\nThe answer is 4.");
  EXPECT_EQ(choices.back()["finish_reason"], "stop");
  // The piece that ends in "</th" sent "think." as reasoning and held "</th" back.
  EXPECT_EQ(choices[1]["delta"], json({{"reasoning", "think."}, {"reasoning_content", "think."}}));

  // Never closed: all reasoning, content null. Closed prompt: all content, reasoning null.
  const json open = whole(reasoning_job(false, PromptReasoning::Open), {"thinking ", "on"});
  EXPECT_EQ(open["reasoning"], "thinking on");
  EXPECT_TRUE(open["content"].is_null());
  const json closed = whole(reasoning_job(false, PromptReasoning::Closed), {"just ", "content"});
  EXPECT_TRUE(closed["reasoning"].is_null());
  EXPECT_TRUE(closed["reasoning_content"].is_null());
  EXPECT_EQ(closed["content"], "just content");
  for (const json& ch : streamed(reasoning_job(true, PromptReasoning::Closed), {"just ", "content"}))
    EXPECT_FALSE(ch["delta"].contains("reasoning")) << ch;
}

TEST(ReasoningResponses, IncludeReasoningFalseDropsItAndTheLogprobs) {
  const std::vector<std::string> pieces = {"secret", " plan</think>", "Answer."};
  json choice;
  const json m = whole(reasoning_job(false, PromptReasoning::Open, false), pieces, &choice);
  EXPECT_TRUE(m["reasoning"].is_null());
  EXPECT_TRUE(m["reasoning_content"].is_null());
  EXPECT_EQ(m["content"], "Answer.");
  EXPECT_TRUE(choice["logprobs"].is_null());
  std::string content;
  const std::vector<json> choices = streamed(reasoning_job(true, PromptReasoning::Open, false), pieces);
  for (const json& ch : choices) {
    EXPECT_FALSE(ch["delta"].contains("reasoning")) << ch;
    EXPECT_TRUE(ch["logprobs"].is_null()) << ch;
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(content, "Answer.");
  EXPECT_EQ(choices.size(), 1u);  // the reasoning-only pieces sent nothing
}

TEST(ReasoningResponses, ToolCallsAreParsedFromTheContentOnly) {
  // A call written inside the reasoning is reasoning; the one after it is a call.
  const std::vector<std::string> pieces = {
      "Maybe <tool_call>{\"name\": \"no\", \"arguments\": {}}</tool_call>?", "</think>Calling.<tool_",
      "call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>"};
  json choice;
  const json m = whole(reasoning_job(false, PromptReasoning::Open, true, "hermes"), pieces, &choice);
  EXPECT_EQ(m["reasoning"], "Maybe <tool_call>{\"name\": \"no\", \"arguments\": {}}</tool_call>?");
  EXPECT_EQ(m["content"], "Calling.");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"x\": 1}");
  EXPECT_EQ(choice["finish_reason"], "tool_calls");

  std::string reasoning, content;
  json calls = json::array(), finish;
  for (const json& ch : streamed(reasoning_job(true, PromptReasoning::Open, true, "hermes"), pieces)) {
    const json& d = ch["delta"];
    if (d.contains("reasoning")) reasoning += d["reasoning"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const auto& t : d["tool_calls"]) calls.push_back(t);
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(reasoning, m["reasoning"]);
  EXPECT_EQ(content, "Calling.");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "f");
  EXPECT_EQ(finish, "tool_calls");

  // Only a call after the reasoning: content null, as without a reasoning parser.
  const json only = whole(reasoning_job(false, PromptReasoning::Open, true, "hermes"),
                          {"Plan.</think><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"});
  EXPECT_EQ(only["reasoning"], "Plan.");
  EXPECT_TRUE(only["content"].is_null());
  EXPECT_EQ(only["tool_calls"].size(), 1u);
}

TEST(ReasoningResponses, ForcedToolChoiceReadsTheContent) {
  auto job = reasoning_job(false, PromptReasoning::Open);
  job->forced_tool = "get_weather";  // a named tool_choice: the content is its arguments
  json choice;
  const json m = whole(job, {"Which city?</think>", "{\"city\": \"Oslo\"}"}, &choice);
  EXPECT_EQ(m["reasoning"], "Which city?");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Oslo\"}");
}

}  // namespace
}  // namespace ssmserve::server
