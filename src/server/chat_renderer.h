// Owns the interface of a chat completion rendered in another API's shape (ResponsesStream: the OpenAI Responses API;
// MessagesStream: Anthropic's Messages API): the whole object from a chat completion, or a stream of events from its
// chat completion chunks. A GenerationJob holding one (GenerationJob::renderer) is answered in that shape.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "server/api_error.h"

namespace ssmserve::server {

class ChatRenderer {
 public:
  virtual ~ChatRenderer() = default;
  /// The model name the reply reports (the one the request named, else the served name).
  virtual void set_model(std::string model) = 0;
  /// The sampling values the request runs with (its own or the server's defaults); replies that report them (a
  /// Response's temperature, top_p and max_output_tokens) take them where the request left them unset.
  virtual void set_sampling(double /*temperature*/, double /*top_p*/, int /*max_tokens*/) {}
  /// The whole reply from a chat completion (ResponseBuilder::final_response; one choice).
  virtual nlohmann::ordered_json whole(const nlohmann::ordered_json& chat_completion) const = 0;
  /// SSE text of the stream's first events. usage: the chat usage object known when the stream opens (its
  /// prompt_tokens; null when unknown).
  virtual std::string open(const nlohmann::ordered_json& usage) = 0;
  /// SSE text of the events one chat completion chunk gives (its single choice's deltas; a usage chunk gives none).
  virtual std::string on_chunk(const nlohmann::ordered_json& chunk) = 0;
  /// SSE text of the stream's last events. usage: the chat usage object (prompt_tokens, completion_tokens, ...).
  virtual std::string finish(const nlohmann::ordered_json& usage) = 0;
  /// SSE text of an error event ending the stream.
  virtual std::string error(const ApiError& e) = 0;
  /// The non-streaming error body for `e` in this API's shape.
  virtual nlohmann::ordered_json error_body(const ApiError& e) const { return e.body(); }
};

}  // namespace ssmserve::server
