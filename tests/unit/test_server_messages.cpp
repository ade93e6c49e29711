// Anthropic's Messages API translation (server/messages_api.h): requests into chat requests (system, text / tool_use
// / tool_result blocks, stop_sequences, tools, tool_choice, thinking) and refusals naming the Messages field;
// chat completions into Messages (blocks, stop_reason, usage); the stream's events from chat chunks: thinking, text
// and two tool_use blocks opened and stopped in order, message_delta with the stop reason, message_stop.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "server/messages_api.h"

namespace ssmserve::server {
namespace {

using json = nlohmann::ordered_json;

std::vector<json> events(const std::string& sse) {
  std::vector<json> out;
  std::istringstream in(sse);
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) == 0) {
      out.push_back(json::parse(line.substr(6)));
      EXPECT_EQ(out.back()["type"], name) << "the event line names the data's type";
    }
  }
  return out;
}

std::string field_of(const json& body) {
  try {
    (void)messages_to_chat_request(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.param;
  }
  return "(accepted)";
}

TEST(ServerMessages, RequestsBecomeChatRequests) {
  const json c = messages_to_chat_request(json::parse(R"({
    "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "A."}, {"type": "text", "text": "B."}],
    "stop_sequences": ["END"], "temperature": 0.2, "top_k": 5, "stream": true,
    "messages": [
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "Let me look."},
                                        {"type": "tool_use", "id": "tu1", "name": "f", "input": {"a": 1}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": [{"type": "text", "text": "42"}]},
                                   {"type": "text", "text": "Thanks"}]}],
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "thinking": {"type": "disabled"}})"));
  const json want = json::parse(R"([
    {"role": "system", "content": "A.\nB."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}], "tool_calls": [
      {"id": "tu1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
    {"role": "tool", "tool_call_id": "tu1", "content": "42"},
    {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}])");
  EXPECT_EQ(c["messages"], want);
  EXPECT_EQ(c["max_tokens"], 9);
  EXPECT_EQ(c["stop"], json::parse(R"(["END"])"));
  EXPECT_EQ(c["top_k"], 5);
  EXPECT_EQ(c["tools"], json::parse(R"([{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}])"));
  EXPECT_EQ(c["tool_choice"], "required");
  EXPECT_EQ(c["parallel_tool_calls"], false);
  EXPECT_EQ(c["chat_template_kwargs"], json::parse(R"({"enable_thinking": false})"));
  const json named = messages_to_chat_request(json::parse(R"({"max_tokens": 1, "messages": [], "tool_choice": {"type": "tool", "name": "g"}})"));
  EXPECT_EQ(named["tool_choice"], json::parse(R"({"type": "function", "function": {"name": "g"}})"));
}

TEST(ServerMessages, RefusalsNameTheMessagesField) {
  EXPECT_EQ(field_of(json::parse(R"({"messages": []})")), "max_tokens");
  EXPECT_FALSE(messages_to_chat_request(json::parse(R"({"messages": []})"), false).contains("max_tokens"))
      << "count_tokens: no max_tokens";
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1})")), "messages");
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]})")), "messages[0].role");
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1, "messages": [{"role": "user"}]})")), "messages[0].content");
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "document"}]}]})")),
            "messages[0].content[0].type");
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f"}]}]})")),
            "messages[0].content[0].type");  // tool_use is the assistant's
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": 3}]}]})")),
            "messages[0].content[0].input");
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1, "messages": [], "system": 5})")), "system");
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1, "messages": [], "tools": [{"type": "bash_20250124", "name": "bash"}]})")), "tools[0].type");
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1, "messages": [], "tools": [{"type": "custom", "name": "f"}]})")), "(accepted)");
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1, "messages": [], "tool_choice": "auto"})")), "tool_choice");
  EXPECT_EQ(field_of(json::parse(R"({"max_tokens": 1, "messages": [], "thinking": {"type": "on"}})")), "thinking.type");
  EXPECT_EQ(messages_field("stop"), "stop_sequences");
  EXPECT_EQ(messages_field("max_tokens"), "max_tokens");
  EXPECT_EQ(anthropic_error_body(ApiError(503, "busy"))["error"]["type"], "overloaded_error");
  EXPECT_EQ(anthropic_error_body(ApiError(400, "bad"))["error"], json::parse(R"({"type": "invalid_request_error", "message": "bad"})"));
}

TEST(ServerMessages, ChatCompletionBecomesAMessage) {
  MessagesStream ms("msg_1");
  ms.set_model("m");
  const json m = ms.whole(json::parse(R"({"choices": [{"message": {"role": "assistant", "content": "Hi", "reasoning": "T",
    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{\"x\": 2}"}}]}, "finish_reason": "tool_calls",
    "stop_reason": null}], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})"));
  EXPECT_EQ(m["content"], json::parse(R"([{"type": "thinking", "thinking": "T", "signature": ""}, {"type": "text", "text": "Hi"},
                                         {"type": "tool_use", "id": "c", "name": "f", "input": {"x": 2}}])"));
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_EQ(m["usage"]["input_tokens"], 3);
  EXPECT_EQ(m["usage"]["output_tokens"], 4);
  const json s = ms.whole(json::parse(R"({"choices": [{"message": {"content": "a"}, "finish_reason": "stop", "stop_reason": "END"}]})"));
  EXPECT_EQ(s["stop_reason"], "stop_sequence");
  EXPECT_EQ(s["stop_sequence"], "END");
  EXPECT_EQ(ms.whole(json::parse(R"({"choices": [{"message": {"content": "a"}, "finish_reason": "stop", "stop_reason": 7}]})"))["stop_reason"],
            "end_turn");  // an EOS token id, not a stop string
  EXPECT_EQ(ms.whole(json::parse(R"({"choices": [{"message": {"content": "a"}, "finish_reason": "length"}]})"))["stop_reason"],
            "max_tokens");
}

TEST(ServerMessages, StreamEventsFollowTheChunks) {
  MessagesStream ms("msg_s");
  ms.set_model("m");
  auto chunk = [](const json& delta, const json& finish = nullptr) {
    return json{{"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})}};
  };
  std::string sse = ms.open(nullptr);
  sse += ms.on_chunk(chunk({{"role", "assistant"}, {"content", ""}}));
  sse += ms.on_chunk(chunk({{"reasoning", "Th"}}));
  sse += ms.on_chunk(chunk({{"content", "Hi"}}));
  sse += ms.on_chunk(chunk({{"tool_calls", {{{"index", 0}, {"id", "a"}, {"function", {{"name", "f"}, {"arguments", "{\"x\""}}}}}}}));
  sse += ms.on_chunk(chunk({{"tool_calls", {{{"index", 0}, {"function", {{"arguments", ":1}"}}}}}}}));
  sse += ms.on_chunk(chunk({{"tool_calls", {{{"index", 1}, {"id", "b"}, {"function", {{"name", "g"}, {"arguments", "{}"}}}}}}}));
  sse += ms.on_chunk(chunk(json::object(), "tool_calls"));
  sse += ms.finish(json{{"prompt_tokens", 5}, {"completion_tokens", 6}});
  const auto ev = events(sse);
  std::vector<std::string> types;
  for (const auto& e : ev) types.push_back(e["type"]);
  const std::vector<std::string> want = {
      "message_start", "ping",
      "content_block_start", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_stop",
      "message_delta", "message_stop"};
  EXPECT_EQ(types, want);
  EXPECT_EQ(ev[2]["content_block"]["type"], "thinking");
  EXPECT_EQ(ev[3]["delta"], json::parse(R"({"type": "thinking_delta", "thinking": "Th"})"));
  EXPECT_EQ(ev[6]["delta"], json::parse(R"({"type": "text_delta", "text": "Hi"})"));
  EXPECT_EQ(ev[8]["content_block"], json::parse(R"({"type": "tool_use", "id": "a", "name": "f", "input": {}})"));
  EXPECT_EQ(ev[10]["delta"], json::parse(R"({"type": "input_json_delta", "partial_json": ":1}"})"));
  EXPECT_EQ(ev[12]["index"], 3);
  EXPECT_EQ(ev[14]["index"], 3);
  EXPECT_EQ(ev[15]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev[15]["usage"]["input_tokens"], 5);
  EXPECT_EQ(ev[15]["usage"]["output_tokens"], 6);
  // An empty reply: one empty text block; an error event.
  MessagesStream empty("msg_e");
  const auto e = events(empty.open(nullptr) + empty.finish(json::object()));
  EXPECT_EQ(e[2]["content_block"], json::parse(R"({"type": "text", "text": ""})"));
  EXPECT_EQ(events(empty.error(ApiError(429, "slow")))[0]["error"]["type"], "rate_limit_error");
}

}  // namespace
}  // namespace ssmserve::server
