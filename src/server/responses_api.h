// Owns the OpenAI Responses API (POST /v1/responses, vLLM's serving_responses.py) as a translation over the chat
// completions path: a Responses request becomes a chat completions request (input items -> messages, instructions ->
// a system message, max_output_tokens, text.format -> response_format, reasoning.effort, function tools and
// tool_choice), and the chat completion or its SSE chunks become a Response object or the Responses stream events
// (response.created ... response.output_text.delta ... response.completed). Not kept: responses are not stored
// (previous_response_id, background and stored prompts are refused; store is accepted and reported false).
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "server/api_error.h"
#include "server/chat_renderer.h"

namespace ssmserve::server {

/// A Responses request translated for the chat path.
struct ResponsesRequest {
  nlohmann::ordered_json chat;     ///< the chat completions request body (messages, max_tokens, response_format, ...)
  nlohmann::ordered_json reflect;  ///< the request's settings the Response object reports (instructions, tools, ...)
};

/// Translates a Responses request body (an object) into a chat completions request. Throws ApiError 400 naming the
/// Responses field (input[3].content[0].type, previous_response_id, tools[0].type, ...) for what is malformed or not
/// supported: non-text input parts, built-in tools, stored responses, logprobs.
ResponsesRequest responses_to_chat_request(const nlohmann::ordered_json& body);

/// The Responses field a chat request field came from, for errors the chat path raises (messages -> input,
/// max_tokens -> max_output_tokens, response_format -> text.format, reasoning_effort -> reasoning.effort); other
/// names as they are.
std::string responses_field(const std::string& chat_field);

/// One Response's rendering: the whole Response object from a chat completion, or its stream of events from the chat
/// completion chunks of its single choice. Not thread-safe (one HTTP producer owns it).
class ResponsesStream final : public ChatRenderer {
 public:
  /// id: "resp_..."; created_at: unix seconds; reflect: ResponsesRequest::reflect.
  ResponsesStream(std::string id, long long created_at, nlohmann::ordered_json reflect);
  /// The model name the Response reports (the one the request named, else the served name).
  void set_model(std::string model) override { model_ = std::move(model); }

  /// The Response object of a whole chat completion (ResponseBuilder::final_response): output items (reasoning,
  /// message, function calls), status "completed" or "incomplete" (finish_reason "length": max_output_tokens).
  nlohmann::ordered_json whole(const nlohmann::ordered_json& chat_completion) const override;

  /// SSE text of the stream's first events: response.created, response.in_progress.
  std::string open(const nlohmann::ordered_json& usage) override;
  void set_sampling(double temperature, double top_p, int max_tokens) override;
  /// SSE text of the events a chat completion chunk gives (its choice's reasoning / content / tool call deltas).
  std::string on_chunk(const nlohmann::ordered_json& chunk) override;
  /// SSE text of the last events: the open item's done events, then response.completed with the whole Response (its
  /// status "incomplete" after max_output_tokens). usage: the chat usage object (prompt_tokens, completion_tokens, ...).
  std::string finish(const nlohmann::ordered_json& usage) override;
  /// SSE text of an error event ({"type": "error", "code", "message", "param"}) ending the stream.
  std::string error(const ApiError& e) override;

 private:
  enum class Item { None, Reasoning, Message, FunctionCall };
  nlohmann::ordered_json base(const char* status) const;
  static nlohmann::ordered_json responses_usage(const nlohmann::ordered_json& chat_usage);
  std::string event(nlohmann::ordered_json e);
  /// Opens an output item of `kind` (closing the open one first).
  std::string open_item(Item kind, const nlohmann::ordered_json& call = nullptr);
  /// Closes the open item (if any); a message or reasoning item with `status` (completed, or incomplete when cut at
  /// max_output_tokens), a function call completed.
  std::string close_item(const char* status = "completed");

  std::string id_;
  long long created_at_;
  nlohmann::ordered_json reflect_;
  std::string model_;
  // Stream state.
  long long seq_ = 0;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();  ///< finished items
  Item open_ = Item::None;
  std::string item_id_, text_, call_id_, call_name_;
  int call_index_ = -1;   ///< the chat tool call index of the open function_call item
  int items_ = 0;         ///< items opened so far (their output_index)
  int reasoning_items_ = 0, message_items_ = 0;  ///< of each kind (the first of a kind has the plain id)
  bool seen_call_ = false;  ///< a function_call item was opened
  std::string held_;        ///< blank text after a function call, sent only if more text follows
  std::string finish_reason_;
};

}  // namespace ssmserve::server
