// The Responses API's translation (server/responses_api.h): requests into chat requests (input items, instructions,
// text.format, tools, tool_choice, reasoning.effort) and their refusals naming the Responses field; chat completions
// into Response objects; and the stream's events from chat chunks: reasoning then text then two tool calls, each item
// opened and closed in order with consecutive sequence numbers, the final Response holding what the deltas said.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "server/responses_api.h"

namespace ssmserve::server {
namespace {

using json = nlohmann::ordered_json;

/// The events of an SSE text: (event name, data object).
std::vector<std::pair<std::string, json>> events(const std::string& sse) {
  std::vector<std::pair<std::string, json>> out;
  std::istringstream in(sse);
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) == 0) out.emplace_back(name, json::parse(line.substr(6)));
  }
  return out;
}

std::string field_of(const json& body) {
  try {
    (void)responses_to_chat_request(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.param;
  }
  return "(accepted)";
}

TEST(ServerResponses, RequestsBecomeChatRequests) {
  const json body = json::parse(R"({
    "model": "m", "instructions": "Be brief.", "max_output_tokens": 7, "temperature": 0.5, "stream": true,
    "input": [
      {"role": "developer", "content": "Dev."},
      {"role": "user", "content": [{"type": "input_text", "text": "Hi"}, {"type": "input_text", "text": "!"}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\":1}"},
      {"type": "function_call_output", "call_id": "c1", "output": "one"},
      {"type": "reasoning", "summary": []},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}],
    "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": true}},
    "reasoning": {"effort": "low"},
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    "tool_choice": {"type": "function", "name": "f"}})");
  const ResponsesRequest r = responses_to_chat_request(body);
  const json& c = r.chat;
  const json want_messages = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "system", "content": "Dev."},
    {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
      {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"a\":1}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "one"},
    {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}])");
  EXPECT_EQ(c["messages"], want_messages);
  EXPECT_EQ(c["max_tokens"], 7);
  EXPECT_EQ(c["temperature"], 0.5);
  EXPECT_EQ(c["stream"], true);
  EXPECT_EQ(c["reasoning_effort"], "low");
  EXPECT_EQ(c["response_format"], json::parse(R"({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type":
                                                "object"}, "strict": true}})"));
  EXPECT_EQ(c["tools"], json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])"));
  EXPECT_EQ(c["tool_choice"], json::parse(R"({"type": "function", "function": {"name": "f"}})"));
  EXPECT_EQ(r.reflect["instructions"], "Be brief.");
  EXPECT_EQ(r.reflect["tools"], body["tools"]);
  // A plain string input is one user message; json_object and text formats.
  const json s = responses_to_chat_request(json::parse(R"({"input": "Hello", "text": {"format": {"type": "json_object"}}})")).chat;
  EXPECT_EQ(s["messages"], json::parse(R"([{"role": "user", "content": "Hello"}])"));
  EXPECT_EQ(s["response_format"], json::parse(R"({"type": "json_object"})"));
  EXPECT_FALSE(responses_to_chat_request(json::parse(R"({"input": "x", "text": {"format": {"type": "text"}}})")).chat.contains("response_format"));
}

TEST(ServerResponses, RefusalsNameTheResponsesField) {
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "previous_response_id": "r"})")), "previous_response_id");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "prompt": {"id": "p"}})")), "prompt");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "background": true})")), "background");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "top_logprobs": 2})")), "top_logprobs");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "include": ["message.output_text.logprobs"]})")), "include");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "include": ["reasoning.encrypted_content"]})")), "(accepted)");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "truncation": "auto"})")), "truncation");
  EXPECT_EQ(field_of(json::parse(R"({})")), "input");
  EXPECT_EQ(field_of(json::parse(R"({"input": {"a": 1}})")), "input");
  EXPECT_EQ(field_of(json::parse(R"({"input": [1]})")), "input[0]");
  EXPECT_EQ(field_of(json::parse(R"({"input": [{"role": "user"}]})")), "input[0].content");
  EXPECT_EQ(field_of(json::parse(R"({"input": [{"role": "user", "content": [{"type": "input_file"}]}]})")),
            "input[0].content[0].type");
  EXPECT_EQ(field_of(json::parse(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})")),
            "input[0].call_id");
  EXPECT_EQ(field_of(json::parse(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})")), "input[0].output");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "tools": [{"type": "file_search"}]})")), "tools[0].type");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "tools": [{"type": "function"}]})")), "tools[0].name");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "tool_choice": {"type": "mcp"}})")), "tool_choice");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})")), "text.format.schema");
  EXPECT_EQ(field_of(json::parse(R"([1])")), "");
  EXPECT_EQ(responses_field("messages"), "input");
  EXPECT_EQ(responses_field("max_tokens"), "max_output_tokens");
  EXPECT_EQ(responses_field("response_format"), "text.format");
  EXPECT_EQ(responses_field("reasoning_effort"), "reasoning.effort");
  EXPECT_EQ(responses_field("temperature"), "temperature");
}

TEST(ServerResponses, ChatCompletionBecomesAResponse) {
  ResponsesStream rs("resp_abc", 5, responses_to_chat_request(json::parse(R"({"input": "x", "max_output_tokens": 3})")).reflect);
  rs.set_model("m");
  const json chat = json::parse(R"({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi",
    "reasoning": "Think.", "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    "finish_reason": "length"}], "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
    "prompt_tokens_details": {"cached_tokens": 2}}})");
  const json r = rs.whole(chat);
  EXPECT_EQ(r["id"], "resp_abc");
  EXPECT_EQ(r["model"], "m");
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(r["output"].size(), 3u);
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Think.");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Hi");
  EXPECT_EQ(r["output"][2]["type"], "function_call");
  EXPECT_EQ(r["output"][2]["call_id"], "call_9");
  EXPECT_EQ(r["usage"], json::parse(R"({"input_tokens": 4, "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0}, "output_tokens": 3,
                                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 7})"));
  // Only tool calls: no empty message item; a plain stop: completed.
  const json calls_only = json::parse(R"({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
    {"id": "c", "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]})");
  const json r2 = rs.whole(calls_only);
  EXPECT_EQ(r2["status"], "completed");
  ASSERT_EQ(r2["output"].size(), 1u);
  EXPECT_EQ(r2["output"][0]["type"], "function_call");
}

TEST(ServerResponses, StreamEventsFollowTheChunks) {
  ResponsesStream rs("resp_s", 1, responses_to_chat_request(json::parse(R"({"input": "x"})")).reflect);
  rs.set_model("m");
  auto chunk = [](const json& delta, const json& finish = nullptr) {
    return json{{"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})}};
  };
  std::string sse = rs.open(nullptr);
  sse += rs.on_chunk(chunk({{"role", "assistant"}, {"content", ""}}));
  sse += rs.on_chunk(chunk({{"reasoning", "Th"}}));
  sse += rs.on_chunk(chunk({{"reasoning", "ink"}}));
  sse += rs.on_chunk(chunk({{"content", "Hel"}}));
  sse += rs.on_chunk(chunk({{"content", "lo"}}));
  sse += rs.on_chunk(chunk({{"tool_calls", {{{"index", 0}, {"id", "c0"}, {"function", {{"name", "f"}, {"arguments", "{\"a\""}}}}}}}));
  sse += rs.on_chunk(chunk({{"tool_calls", {{{"index", 0}, {"function", {{"arguments", ":1}"}}}}}}}));
  sse += rs.on_chunk(chunk({{"tool_calls", {{{"index", 1}, {"id", "c1"}, {"function", {{"name", "g"}, {"arguments", "{}"}}}}}}}));
  sse += rs.on_chunk(chunk(json::object(), "tool_calls"));
  sse += rs.on_chunk(json{{"choices", json::array()}, {"usage", {{"prompt_tokens", 1}}}});  // a usage chunk: nothing
  sse += rs.finish(json{{"prompt_tokens", 2}, {"completion_tokens", 5}, {"total_tokens", 7}});
  const auto ev = events(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].first, ev[i].second["type"]) << "the event line names the data's type";
    EXPECT_EQ(ev[i].second["sequence_number"], static_cast<int>(i));
    types.push_back(ev[i].first);
  }
  const std::vector<std::string> want = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
      "response.output_item.done", "response.completed"};
  EXPECT_EQ(types, want);
  const json& r = ev.back().second["response"];
  EXPECT_EQ(r["status"], "completed");
  ASSERT_EQ(r["output"].size(), 4u);
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Think");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Hello");
  EXPECT_EQ(r["output"][2]["arguments"], "{\"a\":1}");
  EXPECT_EQ(r["output"][2]["call_id"], "c0");
  EXPECT_EQ(r["output"][3]["name"], "g");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r["output"][i]["status"], "completed");
  EXPECT_EQ(r["usage"]["output_tokens"], 5);
  // Each item's events carry its output_index.
  EXPECT_EQ(ev[12].second["output_index"], 1);
  EXPECT_EQ(ev[22].second["output_index"], 3);
  // Blank text between tool calls (a format's separator) is no message item, whole or streamed; other text is.
  ResponsesStream sep("resp_t", 1, responses_to_chat_request(json::parse(R"({"input": "x"})")).reflect);
  std::string t = sep.open(nullptr);
  t += sep.on_chunk(chunk({{"tool_calls", {{{"index", 0}, {"id", "a"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}}));
  t += sep.on_chunk(chunk({{"content", "\n"}}));
  t += sep.on_chunk(chunk({{"tool_calls", {{{"index", 1}, {"id", "b"}, {"function", {{"name", "g"}, {"arguments", "{}"}}}}}}}));
  t += sep.on_chunk(chunk({{"content", "\n"}}));
  t += sep.on_chunk(chunk({{"content", "Done."}}));
  const json done = events(t + sep.finish(json::object())).back().second["response"];
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][2]["content"][0]["text"], "\nDone.");
  const json whole = sep.whole(json::parse(R"({"choices": [{"message": {"content": "\n", "tool_calls": [
    {"id": "a", "function": {"name": "f", "arguments": "{}"}}, {"id": "b", "function": {"name": "g", "arguments": "{}"}}]},
    "finish_reason": "tool_calls"}]})"));
  EXPECT_EQ(whole["output"].size(), 2u);
  EXPECT_EQ(whole["output"][0]["type"], "function_call");
  // Wrong types where the translation reads a field: 400s naming it.
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": 3, "schema": {}}}})")),
            "text.format.name");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "tool_choice": {"type": 1}})")), "tool_choice.type");
  EXPECT_EQ(field_of(json::parse(R"({"input": "x", "metadata": "abc"})")), "metadata");
  // An empty reply still has its (empty) message; an error event ends a stream.
  ResponsesStream empty("resp_e", 1, responses_to_chat_request(json::parse(R"({"input": "x"})")).reflect);
  const auto e = events(empty.open(nullptr) + empty.finish(json::object()));
  EXPECT_EQ(e.back().second["response"]["output"][0]["content"][0]["text"], "");
  const auto err = events(empty.error(ApiError(503, "bye")));
  EXPECT_EQ(err[0].second["type"], "error");
  EXPECT_EQ(err[0].second["code"], "503");
}

}  // namespace
}  // namespace ssmserve::server
