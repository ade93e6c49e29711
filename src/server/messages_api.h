// Owns Anthropic's Messages API (POST /v1/messages, as vLLM serves it for Anthropic clients) as a translation over the
// chat completions path: a Messages request becomes a chat completions request (system -> a system message, text /
// tool_use / tool_result blocks -> messages, tool calls and tool messages, stop_sequences, tools with input_schema,
// tool_choice auto / any / tool / none, thinking -> enable_thinking), and the chat completion or its SSE chunks become a
// Message (text, thinking and tool_use blocks, stop_reason end_turn / max_tokens / stop_sequence / tool_use) or the
// Messages stream's events (message_start, content_block_start / _delta / _stop, message_delta, message_stop).
// Errors are Anthropic's body ({"type": "error", "error": {"type", "message"}}).
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "server/api_error.h"
#include "server/chat_renderer.h"

namespace ssmserve::server {

/// Translates a Messages request body (an object) into a chat completions request. Throws ApiError 400 naming the
/// Messages field (max_tokens, messages[1].content[0].type, tools[0].type, ...) for what is malformed or not supported
/// (images and documents, server tools). require_max_tokens false: a count_tokens request (no max_tokens).
nlohmann::ordered_json messages_to_chat_request(const nlohmann::ordered_json& body, bool require_max_tokens = true);

/// The Messages field a chat request field came from, for errors the chat path raises (stop -> stop_sequences,
/// max_completion_tokens -> max_tokens); other names as they are.
std::string messages_field(const std::string& chat_field);

/// Anthropic's error body for `e`: {"type": "error", "error": {"type", "message"}} (400 invalid_request_error, 401
/// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error,
/// 503 overloaded_error, other 5xx api_error).
nlohmann::ordered_json anthropic_error_body(const ApiError& e);

/// One Message's rendering (ChatRenderer). Not thread-safe (one HTTP producer owns it).
class MessagesStream final : public ChatRenderer {
 public:
  /// id: "msg_...".
  explicit MessagesStream(std::string id) : id_(std::move(id)) {}
  void set_model(std::string model) override { model_ = std::move(model); }
  /// The Message of a whole chat completion: thinking, text and tool_use blocks; stop_reason.
  nlohmann::ordered_json whole(const nlohmann::ordered_json& chat_completion) const override;
  /// message_start (usage so far: none), ping.
  std::string open(const nlohmann::ordered_json& usage) override;
  /// content_block_start / _delta / _stop events for the chunk's reasoning, text and tool call deltas.
  std::string on_chunk(const nlohmann::ordered_json& chunk) override;
  /// The open block's content_block_stop, message_delta (stop_reason, usage), message_stop.
  std::string finish(const nlohmann::ordered_json& usage) override;
  /// An error event ({"type": "error", "error": {...}}).
  std::string error(const ApiError& e) override;
  nlohmann::ordered_json error_body(const ApiError& e) const override { return anthropic_error_body(e); }

 private:
  enum class Block { None, Thinking, Text, ToolUse };
  static std::string event(const nlohmann::ordered_json& e);
  std::string open_block(Block kind, const nlohmann::ordered_json& call = nullptr);
  std::string close_block();

  std::string id_, model_;
  Block open_ = Block::None;
  int blocks_ = 0;         ///< blocks opened so far (the open one's index is blocks_ - 1)
  int call_index_ = -1;    ///< the chat tool call index of the open tool_use block
  bool seen_call_ = false;  ///< a tool_use block was opened
  std::string held_;        ///< blank text after a tool call, sent only if more text follows
  std::string finish_reason_;
  nlohmann::ordered_json stop_reason_;  ///< the chat choice's stop_reason (a matched stop string, or null)
};

}  // namespace ssmserve::server
