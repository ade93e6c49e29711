// Tool-call parsing of the chat endpoint (issue 32, vLLM's --tool-call-parser): every registered format extracts
// its calls from a whole output and from the same output streamed in every split (the streamed content and calls
// add up to the whole-output result), invalid calls stay content, arguments are rendered as Python's json.dumps,
// and the response builder puts calls in `tool_calls` with finish_reason "tool_calls" (whole and streamed).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <random>

#include "core/error.h"
#include "server/serving.h"
#include "server/tool_parsers.h"

namespace ssmserve::server {
namespace {

using nlohmann::json;

/// Streams `text` through a fresh parser in pieces cut at `cuts`; returns (content, calls), a call's argument
/// pieces joined.
std::pair<std::string, std::vector<ToolCall>> stream(const std::string& parser, const std::string& text, std::vector<size_t> cuts,
                                                     const nlohmann::ordered_json& tools = nullptr) {
  auto p = make_tool_parser(parser, tools);
  std::string content;
  std::vector<ToolCall> calls;
  size_t at = 0;
  cuts.push_back(text.size());
  for (size_t i = 0; i < cuts.size(); ++i) {
    const size_t end = std::max(at, std::min(cuts[i], text.size()));
    ToolParser::Delta d = p->feed(std::string_view(text).substr(at, end - at), i + 1 == cuts.size());
    content += d.content;
    for (auto& c : d.calls) {
      if (!c.id.empty()) {
        calls.push_back(std::move(c));
      } else {  // a later piece of the last call: arguments only
        EXPECT_FALSE(calls.empty());
        EXPECT_TRUE(c.name.empty());
        if (!calls.empty()) calls.back().arguments += c.arguments;
      }
    }
    at = end;
  }
  return {content, calls};
}

struct Case {
  std::string parser, text, content;  // content: expected (streamed) content
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

std::vector<Case> cases() {
  return {
      {"hermes", "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
       "Let me check.\n", {{"get_weather", "{\"city\": \"Paris\", \"days\": 2}"}}},
      {"hermes",
       "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": [1, 2.5, null], \"y\": \"é\\n\"}}</tool_call>\n<tool_call>{\"name\": \"b\", "
       "\"arguments\": {}}</tool_call>",
       "\n", {{"a", "{\"x\": [1, 2.5, null], \"y\": \"é\\n\"}"}, {"b", "{}"}}},
      {"hermes", "no calls here, just < and <tool and text", "no calls here, just < and <tool and text", {}},
      {"hermes", "unterminated <tool_call>{\"name\": \"f\", \"arguments\": {\"q\": 1}}", "unterminated ", {{"f", "{\"q\": 1}"}}},
      {"granite", "<|tool_call|>[{\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": 2}}, {\"name\": \"g\", \"arguments\": {}}]",
       "", {{"f", "{\"b\": 1, \"a\": 2}"}, {"g", "{}"}}},
      {"nemotron_json", "<TOOLCALL>[{\"name\": \"f\", \"arguments\": {\"k\": true}}]</TOOLCALL>", "", {{"f", "{\"k\": true}"}}},
      {"jamba", "<tool_calls>[{\"name\": \"f\", \"arguments\": {\"k\": 1}}]</tool_calls>", "", {{"f", "{\"k\": 1}"}}},
      {"minimax", "ok <tool_calls>\n{\"name\": \"f\", \"arguments\": {\"k\": 1}}\n{\"name\": \"g\", \"arguments\": {}}\n</tool_calls>", "ok ",
       {{"f", "{\"k\": 1}"}, {"g", "{}"}}},
  };
}

TEST(ToolParsers, WholeAndStreamedAgreeInEverySplit) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.parser + ": " + c.text);
    const ExtractedToolCalls whole = make_tool_parser(c.parser)->extract(c.text);
    EXPECT_EQ(whole.tools_called, !c.calls.empty());
    ASSERT_EQ(whole.calls.size(), c.calls.size());
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(whole.calls[i].name, c.calls[i].first);
      EXPECT_EQ(whole.calls[i].arguments, c.calls[i].second);
      EXPECT_EQ(whole.calls[i].id.rfind("chatcmpl-tool-", 0), 0u);
    }
    // Whole output: the content is the text before the first call (null when empty), as vLLM's hermes parser.
    const std::string before = c.calls.empty() ? c.text : c.text.substr(0, c.text.find(c.parser == "granite" ? "<|" : "<"));
    EXPECT_EQ(whole.content, c.calls.empty() ? c.text : before);
    EXPECT_EQ(whole.has_content, !whole.content.empty());
    for (size_t a = 0; a <= c.text.size(); ++a)
      for (size_t b : {a, a + 1, a + 7}) {
        const auto [content, calls] = stream(c.parser, c.text, {a, b});
        ASSERT_EQ(content, c.content) << "cut at " << a << ", " << b;
        ASSERT_EQ(calls.size(), c.calls.size()) << "cut at " << a << ", " << b;
        for (size_t i = 0; i < calls.size(); ++i) ASSERT_EQ(calls[i].arguments, c.calls[i].second);
      }
    const auto [content1, calls1] = stream(c.parser, c.text, [&] {  // one byte at a time
      std::vector<size_t> cuts;
      for (size_t i = 1; i < c.text.size(); ++i) cuts.push_back(i);
      return cuts;
    }());
    EXPECT_EQ(content1, c.content);
    EXPECT_EQ(calls1.size(), c.calls.size());
  }
}

TEST(ToolParsers, Granite4KeepsTheTextAroundTheCalls) {
  // vLLM's granite4: hermes' <tool_call> blocks; a whole output's content is all the text outside them (hermes: the
  // text before the first); streamed, both send the text around the calls as it comes.
  const std::string text = "Sure. <tool_call>{\"name\": \"f\", \"arguments\": {\"k\": 1}}</tool_call> and "
                           "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call> done";
  const ExtractedToolCalls g4 = make_tool_parser("granite4")->extract(text);
  ASSERT_TRUE(g4.tools_called);
  ASSERT_EQ(g4.calls.size(), 2u);
  EXPECT_EQ(g4.calls[1].name, "g");
  EXPECT_EQ(g4.content, "Sure.  and  done");
  EXPECT_EQ(make_tool_parser("hermes")->extract(text).content, "Sure. ");
  for (const char* name : {"granite4", "hermes"}) EXPECT_EQ(stream(name, text, {9, 40}).first, "Sure.  and  done") << name;
  const ExtractedToolCalls only = make_tool_parser("granite4")->extract("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
  EXPECT_TRUE(only.tools_called);
  EXPECT_FALSE(only.has_content);
  // vLLM's granite4 is strict: an unclosed call (a truncated reply), "parameters" for "arguments", a list, no
  // arguments: no calls, the whole text is content (hermes takes each of them as calls).
  for (const std::string bad : {"x <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
                                "x <tool_call>{\"name\": \"f\", \"parameters\": {\"a\": 1}}</tool_call> y",
                                "x <tool_call>[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]</tool_call> y",
                                "x <tool_call>{\"name\": \"f\"}</tool_call> y"}) {
    const ExtractedToolCalls g = make_tool_parser("granite4")->extract(bad);
    EXPECT_FALSE(g.tools_called) << bad;
    EXPECT_EQ(g.content, bad);
    EXPECT_TRUE(make_tool_parser("hermes")->extract(bad).tools_called) << bad;
    const auto [content, calls] = stream("granite4", bad, {7, 30});
    EXPECT_TRUE(calls.empty()) << bad;
    EXPECT_EQ(content, bad);
  }
}

TEST(ToolParsers, InvalidCallsStayContent) {
  const std::string bad = "x <tool_call>{not json}</tool_call> y";
  const ExtractedToolCalls whole = make_tool_parser("hermes")->extract(bad);
  EXPECT_FALSE(whole.tools_called);
  EXPECT_EQ(whole.content, bad);
  EXPECT_EQ(stream("hermes", bad, {5, 20}).first, bad);
  const std::string no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
  EXPECT_FALSE(make_tool_parser("hermes")->extract(no_name).tools_called);
  EXPECT_EQ(stream("hermes", no_name, {}).first, no_name);
}

TEST(ToolParsers, UnknownNameIsAnErrorListingTheKnownOnes) {
  try {
    make_tool_parser("pythonic");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hermes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--tool-call-parser"), std::string::npos) << e.what();
  }
}

TEST(ToolParsers, PythonJsonDumps) {
  const auto j = nlohmann::ordered_json::parse(R"({"b": [1, {"c": null}], "a": "x\"y", "n": -2.5, "t": true})");
  EXPECT_EQ(python_json_dumps(j), R"({"b": [1, {"c": null}], "a": "x\"y", "n": -2.5, "t": true})");
}

// ---- qwen3_coder (Qwen3-Coder / Qwen3.5 / Qwen3.6 / Qwen3-Next XML calls), as vLLM's Qwen3CoderToolParser ----

/// The request tools of the qwen3_coder cases: every JSON-schema type vLLM converts.
nlohmann::ordered_json qwen_tools() {
  return nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"}, "metric": {"type": "boolean"},
      "opts": {"type": "object"}, "hours": {"type": "array"}, "note": {"description": "no type: a string"},
      "mode": {"type": "enum"}, "maybe": {"type": ["integer", "null"]}}}}},
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
      "i": {"type": "integer"}, "n": {"type": "number"}, "e": {"type": "number"}, "x": {"type": "number"},
      "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"}, "s": {"type": "string"},
      "neg": {"type": "int"}, "l": {"type": "list"}}}}},
    {"type": "function", "function": {"name": "flat", "parameters": {"k": {"type": "integer"}}}},
    {"type": "function", "function": {"name": "get_weather", "parameters": {"properties": {"days": {"type": "string"}}}}}
  ])");
}

struct QwenCase {
  std::string text, content;  // content: the whole-output content ("" with calls: null)
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

std::vector<QwenCase> qwen_cases() {
  return {
      // Every schema type; text before the call is the content, text after it is dropped (as vLLM).
      {"Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, \"FR\"\n</parameter>\n"
       "<parameter=days>\n3\n</parameter>\n<parameter=temp>\n21.5\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
       "<parameter=opts>\n{\"a\": [1, {\"b\": null}]}\n</parameter>\n<parameter=hours>\n[6, 12]\n</parameter>\n"
       "<parameter=note>\nline1\nline2\n</parameter>\n<parameter=mode>\n5\n</parameter>\n<parameter=maybe>\n7\n</parameter>\n"
       "<parameter=extra>\n42\n</parameter>\n</function>\n</tool_call>\nDone.",
       "Let me check.\n",
       {{"get_weather", R"({"city": "Paris, \"FR\"", "days": 3, "temp": 21.5, "metric": true, "opts": {"a": [1, {"b": null}]}, )"
                        R"("hours": [6, 12], "note": "line1\nline2", "mode": "5", "maybe": 7, "extra": "42"})"}}},
      // Values that do not parse as their type stay strings; "null" is null; floats without a fraction are ints.
      {"<tool_call>\n<function=f>\n<parameter=i>\nabc\n</parameter>\n<parameter=n>\n2.0\n</parameter>\n<parameter=e>\n1e3\n"
       "</parameter>\n<parameter=x>\nnan\n</parameter>\n<parameter=b>\nyes\n</parameter>\n<parameter=o>\n{oops\n</parameter>\n"
       "<parameter=a>\n[1, 2\n</parameter>\n<parameter=s>\nnull\n</parameter>\n<parameter=neg>\n -1_000 \n</parameter>\n"
       "<parameter=l>\n[\"é\", 1.25, true]\n</parameter>\n</function>\n</tool_call>",
       "",
       {{"f", R"({"i": "abc", "n": 2, "e": 1000, "x": "nan", "b": false, "o": "{oops", "a": "[1, 2", "s": null, "neg": -1000, )"
              R"("l": ["é", 1.25, true]})"}}},
      // Several calls: two blocks, two functions in one block, a call without parameters, unknown tools (strings).
      {"<tool_call>\n<function=a>\n</function>\n</tool_call>\n<tool_call>\n<function=b>\n<parameter=x>\n1\n</parameter>\n"
       "</function>\n<function=c>\n<parameter=y>\nz\n</parameter>\n</function>\n</tool_call>\nThanks!",
       "",
       {{"a", "{}"}, {"b", R"({"x": "1"})"}, {"c", R"({"y": "z"})"}}},
      // Missing closing tags: a value ends at the next parameter, the function's end or the output's end.
      {"Sure <tool_call>\n<function=f>\n<parameter=i>\n5\n<parameter=s>\nhello\n\n",
       "Sure ", {{"f", R"({"i": 5, "s": "hello"})"}}},
      {"<tool_call><function=f><parameter=s>x</tool_call> after", "", {{"f", R"({"s": "x"})"}}},
      {"<tool_call>\n<function=f>\n<parameter=s>\nabc</function>", "", {{"f", R"({"s": "abc"})"}}},
      {"<tool_call>\n<function=flat>\n<parameter=k>\n12", "", {{"flat", R"({"k": 12})"}}},
      // A bare function (no <tool_call>), as vLLM's fallback.
      {"Text <function=f>\n<parameter=i>\n7\n</parameter>\n</function>", "Text ", {{"f", R"({"i": 7})"}}},
      // Tag-like text inside a value stays in it; a repeated parameter keeps its first value; a parameter without a
      // name is skipped.
      {"<tool_call><function=f><parameter=s>a <b> <function=x> <tool c</parameter><parameter=s>2</parameter>"
       "<parameter=noname</parameter><parameter=\xc3\xa9>\xe6\x97\xa5\n</parameter></function></tool_call>",
       "", {{"f", "{\"s\": \"a <b> <function=x> <tool c\", \"\xc3\xa9\": \"\xe6\x97\xa5\"}"}}},
      // Not calls: the whole text is content.
      {"a < b <tool_call> not a call </tool_call> c <tool", "a < b <tool_call> not a call </tool_call> c <tool", {}},
      {"x <tool_call>\n<function=get_wea", "x <tool_call>\n<function=get_wea", {}},
      {"<tool_call><function=></function></tool_call>", "<tool_call><function=></function></tool_call>", {}},
      {"<tool_call><function=f</function></tool_call>", "<tool_call><function=f</function></tool_call>", {}},
      {"plain text, no calls", "plain text, no calls", {}},
      {"", "", {}},
  };
}

TEST(ToolParsersQwen3Coder, EveryTypeWholeAndStreamedInEverySplit) {
  const auto tools = qwen_tools();
  for (const char* parser : {"qwen3_coder", "qwen3_xml"}) {
    for (const QwenCase& c : qwen_cases()) {
      SCOPED_TRACE(std::string(parser) + ": " + c.text);
      const ExtractedToolCalls whole = make_tool_parser(parser, tools)->extract(c.text);
      EXPECT_EQ(whole.tools_called, !c.calls.empty());
      EXPECT_EQ(whole.content, c.content);
      EXPECT_EQ(whole.has_content, c.calls.empty() || !c.content.empty());
      ASSERT_EQ(whole.calls.size(), c.calls.size());
      for (size_t i = 0; i < c.calls.size(); ++i) {
        EXPECT_EQ(whole.calls[i].name, c.calls[i].first);
        EXPECT_EQ(whole.calls[i].arguments, c.calls[i].second);
        EXPECT_EQ(whole.calls[i].id.rfind("chatcmpl-tool-", 0), 0u);
        EXPECT_FALSE(nlohmann::json::parse(whole.calls[i].arguments, nullptr, false).is_discarded());
      }
      auto check = [&](const std::vector<size_t>& cuts, const std::string& where) {
        const auto [content, calls] = stream(parser, c.text, cuts, tools);
        ASSERT_EQ(content, c.content) << where;
        ASSERT_EQ(calls.size(), c.calls.size()) << where;
        for (size_t i = 0; i < calls.size(); ++i) {
          ASSERT_EQ(calls[i].name, c.calls[i].first) << where;
          ASSERT_EQ(calls[i].arguments, c.calls[i].second) << where;
        }
      };
      for (size_t a = 0; a <= c.text.size(); ++a)
        for (size_t b : {a, a + 1, a + 2, a + 11}) check({a, b}, "cut at " + std::to_string(a) + ", " + std::to_string(b));
      std::vector<size_t> bytes;  // one byte at a time
      for (size_t i = 1; i < c.text.size(); ++i) bytes.push_back(i);
      check(bytes, "byte by byte");
    }
  }
}

TEST(ToolParsersQwen3Coder, StreamsTheNameThenTheArgumentsAsTheyComplete) {
  auto p = make_tool_parser("qwen3_coder", qwen_tools());
  ToolParser::Delta d = p->feed("Hi <tool_call>\n<function=get_wea", false);
  EXPECT_EQ(d.content, "Hi ");
  EXPECT_TRUE(d.calls.empty());
  EXPECT_FALSE(p->called());
  d = p->feed("ther>\n<parameter=days>\n3", false);
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_FALSE(d.calls[0].id.empty());
  EXPECT_EQ(d.calls[0].arguments, "{");
  EXPECT_TRUE(p->called());
  d = p->feed("\n</parameter>\n<parameter=city>\nRome\n</para", false);
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_TRUE(d.calls[0].id.empty());
  EXPECT_EQ(d.calls[0].arguments, "\"days\": 3");
  d = p->feed("meter>\n</function>\n</tool_call>", true);
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, ", \"city\": \"Rome\"}");
  EXPECT_TRUE(d.content.empty());
}

TEST(ToolParsersQwen3Coder, MalformedInputNeverCrashes) {
  const auto tools = qwen_tools();
  // Deep nesting: not parsed (no recursion), the value stays a string.
  const std::string deep(200000, '[');
  const ExtractedToolCalls r = make_tool_parser("qwen3_coder", tools)
                                   ->extract("<tool_call><function=f><parameter=a>" + deep + "</parameter></function></tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": \"" + deep + "\"}");
  const std::string deep_hermes = "<tool_call>{\"name\": \"f\", \"arguments\": " + deep + "</tool_call>";
  EXPECT_FALSE(make_tool_parser("hermes")->extract(deep_hermes).tools_called);
  // Tags and their prefixes in every order and truncation: no crash, content and calls as whole = streamed.
  const std::vector<std::string> parts = {"<tool_call>", "</tool_call>", "<function=", "f>", "</function>", "<parameter=",
                                          "i>", "</parameter>", "1", "\n", "<", ">", "<tool", "</param", "é"};
  std::mt19937 rng(7);
  for (int n = 0; n < 3000; ++n) {
    std::string text;
    for (int k = rng() % 12; k >= 0; --k) text += parts[rng() % parts.size()];
    const ExtractedToolCalls whole = make_tool_parser("qwen3_coder", tools)->extract(text);
    if (!whole.tools_called) {
      EXPECT_EQ(whole.content, text);
    }
    const size_t cut = text.empty() ? 0 : rng() % text.size();
    const auto [content, calls] = stream("qwen3_coder", text, {cut, cut + rng() % 5}, tools);
    ASSERT_EQ(content, whole.tools_called ? whole.content : text) << text;
    ASSERT_EQ(calls.size(), whole.calls.size()) << text;
    for (size_t i = 0; i < calls.size(); ++i) ASSERT_EQ(calls[i].arguments, whole.calls[i].arguments) << text;
  }
  // Feeding after the final piece sends nothing.
  auto p = make_tool_parser("qwen3_coder", tools);
  p->feed("a", true);
  EXPECT_TRUE(p->feed("b<function=f>", true).content.empty());
}

TEST(ToolParsersQwen3Coder, StreamingIsLinear) {
  // A 4 MB value and 4 MB of content, one byte per feed: quadratic re-scanning would take hours.
  const std::string value(4 << 20, 'v');
  const std::string text = std::string(4 << 20, 'c') + "<tool_call>\n<function=f>\n<parameter=s>\n" + value + "\n</parameter>";
  auto p = make_tool_parser("qwen3_coder", qwen_tools());
  size_t content = 0;
  std::string arguments;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < text.size(); ++i) {
    ToolParser::Delta d = p->feed(std::string_view(text).substr(i, 1), i + 1 == text.size());
    content += d.content.size();
    for (const auto& c : d.calls) arguments += c.arguments;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  EXPECT_EQ(content, size_t{4} << 20);
  EXPECT_EQ(arguments, "{\"s\": \"" + value + "\"}");
}

/// A finished (or not) delta output of choice text `text`.
RequestOutput output(const std::string& text, bool finished) {
  RequestOutput o;
  o.request_id = "r";
  o.outputs.resize(1);
  o.outputs[0].text = text;
  o.outputs[0].token_ids.assign(1, 5);
  o.outputs[0].finish_reason = finished ? FinishReason::Stop : FinishReason::None;
  o.delta_text = text;
  o.delta_token_ids.assign(1, 5);
  o.finished = finished;
  return o;
}

std::shared_ptr<GenerationJob> chat_job(bool stream, const std::string& parser = "hermes",
                                        const nlohmann::ordered_json& tools = nullptr) {
  auto job = std::make_shared<GenerationJob>();
  job->chat = true;
  job->id = "chatcmpl-1";
  job->stream = stream;
  job->tool_parser = parser;
  job->tools = tools;
  job->request_ids = {"r"};
  job->prompts.resize(1);
  return job;
}

TEST(ToolParsers, ResponseBuilderWholeAndStreamed) {
  const std::string a = "Sure.<tool_", b = "call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
  {
    ResponseBuilder rb(chat_job(false));
    rb.on_output(0, output(a, false));
    rb.on_output(0, output(b, true));
    ASSERT_TRUE(rb.all_finished());
    const json r = rb.final_response();
    const json& choice = r["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls");
    EXPECT_EQ(choice["message"]["content"], "Sure.");
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(choice["message"]["tool_calls"][0]["type"], "function");
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "f");
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"x\": 1}");
  }
  {
    ResponseBuilder rb(chat_job(true));
    std::vector<nlohmann::ordered_json> chunks = rb.on_output(0, output(a, false));
    for (auto& c : rb.on_output(0, output(b, true))) chunks.push_back(std::move(c));
    std::string content;
    json calls = json::array();
    json finish;
    for (const auto& c : chunks) {
      const json& d = c["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const auto& t : d["tool_calls"]) calls.push_back(t);
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(content, "Sure.");
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0]["index"], 0);
    EXPECT_EQ(calls[0]["function"]["arguments"], "{\"x\": 1}");
    EXPECT_EQ(finish, "tool_calls");
  }
}

TEST(ToolParsers, ParallelToolCallsFalseKeepsTheFirstCall) {
  // vLLM's maybe_filter_parallel_tool_calls, also for "auto": tool_calls[:1] whole, no deltas of calls after the first
  // streamed; the content and finish_reason are unchanged.
  const std::string a = "Sure.<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>\n<tool_",
                    b = "call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
  for (const bool parallel : {true, false}) {
    auto job = chat_job(false);
    job->parallel_tool_calls = parallel;
    ResponseBuilder rb(job);
    rb.on_output(0, output(a, false));
    rb.on_output(0, output(b, true));
    const json choice = rb.final_response()["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls");
    EXPECT_EQ(choice["message"]["content"], "Sure.");
    ASSERT_EQ(choice["message"]["tool_calls"].size(), parallel ? 2u : 1u);
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "f");

    job = chat_job(true);
    job->parallel_tool_calls = parallel;
    ResponseBuilder srb(job);
    std::vector<nlohmann::ordered_json> chunks = srb.on_output(0, output(a, false));
    for (auto& c : srb.on_output(0, output(b, true))) chunks.push_back(std::move(c));
    std::vector<std::string> names;
    json finish;
    for (const auto& c : chunks) {
      const json& d = c["choices"][0]["delta"];
      for (const auto& t : d.value("tool_calls", json::array())) {
        EXPECT_EQ(t["index"], names.size());
        names.push_back(t["function"]["name"]);
      }
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(names, parallel ? std::vector<std::string>({"f", "g"}) : std::vector<std::string>({"f"}));
    EXPECT_EQ(finish, "tool_calls");
  }
}

TEST(ToolParsersQwen3Coder, ResponseBuilderWholeAndStreamed) {
  const std::vector<std::string> pieces = {"Checking.<tool_", "call>\n<function=get_weather>\n<parameter=city>\nOslo\n</param",
                                           "eter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                                           "<function=f>\n<parameter=b>\ntrue\n</parameter>\n</function>\n</tool_call>"};
  {
    ResponseBuilder rb(chat_job(false, "qwen3_coder", qwen_tools()));
    for (size_t i = 0; i < pieces.size(); ++i) rb.on_output(0, output(pieces[i], i + 1 == pieces.size()));
    ASSERT_TRUE(rb.all_finished());
    const json r = rb.final_response();
    const json& choice = r["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls");
    EXPECT_EQ(choice["message"]["content"], "Checking.");
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 2u);
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Oslo\", \"days\": 2}");
    EXPECT_EQ(choice["message"]["tool_calls"][1]["function"]["arguments"], "{\"b\": true}");
  }
  {
    ResponseBuilder rb(chat_job(true, "qwen3_coder", qwen_tools()));
    std::vector<json> chunks;
    for (size_t i = 0; i < pieces.size(); ++i)
      for (auto& c : rb.on_output(0, output(pieces[i], i + 1 == pieces.size()))) chunks.push_back(std::move(c));
    std::string content;
    std::vector<json> calls;  // merged by index, as OpenAI clients do
    json finish;
    for (const auto& c : chunks) {
      const json& d = c["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const auto& t : d["tool_calls"]) {
          const size_t i = t["index"].get<size_t>();
          if (t.contains("id")) {  // a call begins: id, type and name, once
            ASSERT_EQ(i, calls.size());
            EXPECT_EQ(t["type"], "function");
            calls.push_back(t);
          } else {
            ASSERT_LT(i, calls.size());
            EXPECT_FALSE(t["function"].contains("name"));
            calls[i]["function"]["arguments"] = calls[i]["function"]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
          }
        }
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(content, "Checking.");
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\": \"Oslo\", \"days\": 2}");
    EXPECT_EQ(calls[1]["function"]["arguments"], "{\"b\": true}");
    EXPECT_EQ(finish, "tool_calls");
  }
}

}  // namespace
}  // namespace ssmserve::server
