// Tool-call parsing of the chat endpoint (issue 32, vLLM's --tool-call-parser): every registered format extracts
// its calls from a whole output and from the same output streamed in every split (the streamed content and calls
// add up to the whole-output result), invalid calls stay content, arguments are rendered as Python's json.dumps,
// and the response builder puts calls in `tool_calls` with finish_reason "tool_calls" (whole and streamed).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/serving.h"
#include "server/tool_parsers.h"

namespace ssmserve::server {
namespace {

using nlohmann::json;

/// Streams `text` through a fresh parser in pieces cut at `cuts`; returns (content, calls).
std::pair<std::string, std::vector<ToolCall>> stream(const std::string& parser, const std::string& text, std::vector<size_t> cuts) {
  auto p = make_tool_parser(parser);
  std::string content;
  std::vector<ToolCall> calls;
  size_t at = 0;
  cuts.push_back(text.size());
  for (size_t i = 0; i < cuts.size(); ++i) {
    const size_t end = std::max(at, std::min(cuts[i], text.size()));
    ToolParser::Delta d = p->feed(std::string_view(text).substr(at, end - at), i + 1 == cuts.size());
    content += d.content;
    for (auto& c : d.calls) calls.push_back(std::move(c));
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

std::shared_ptr<GenerationJob> chat_job(bool stream) {
  auto job = std::make_shared<GenerationJob>();
  job->chat = true;
  job->id = "chatcmpl-1";
  job->stream = stream;
  job->tool_parser = "hermes";
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
    std::vector<json> chunks = rb.on_output(0, output(a, false));
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

}  // namespace
}  // namespace ssmserve::server
