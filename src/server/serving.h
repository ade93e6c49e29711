// Owns one generation request's life in the server: prompts -> engine requests (n per prompt), and the engine's
// outputs -> OpenAI completion / chat responses, whole or as SSE chunks (vLLM's serving_completion.py /
// serving_chat.py).
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/async_engine.h"
#include "server/reasoning_parser.h"
#include "server/chat_renderer.h"
#include "server/tool_parsers.h"

namespace ssmserve::server {

/// A prompt ready for the engine: its text (for echo; decoded when the client sent ids) and token ids.
struct ReadyPrompt {
  std::string text;
  std::vector<int> token_ids;
};

/// Everything the response needs about one accepted request.
struct GenerationJob {
  bool chat = false;
  std::string id;                    ///< "cmpl-..." / "chatcmpl-..."
  long long created = 0;             ///< unix seconds
  std::string model;
  std::vector<ReadyPrompt> prompts;
  int n = 1;
  bool stream = false, include_usage = false, echo = false;
  bool continuous_usage = false;     ///< include_usage + continuous_usage_stats: usage (so far) in every chunk
  bool prompt_only = false;          ///< echo with max_tokens 0: the one generated token is left out of the response
  std::string chat_echo;             ///< chat echo: the last (assistant) message's content, before each choice's text
  std::optional<int> logprobs;       ///< completions: top-k count; chat: top_logprobs when logprobs = true
  /// vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>" (tokens that are not valid UTF-8 on
  /// their own stay identifiable).
  bool return_tokens_as_token_ids = false;
  /// vLLM's return_token_ids (GenerationRequest::return_token_ids).
  bool return_token_ids = false;
  std::optional<int> prompt_logprobs;  ///< prompt_logprobs (top-k count): each completion choice's "prompt_logprobs", chat: top level
  std::string tool_parser;           ///< chat with tool_choice "auto": the --tool-call-parser name, else ""
  nlohmann::ordered_json tools;      ///< the request's tools (with tool_parser: qwen3_coder types values by them)
  /// Chat with a forced tool_choice: "" for "required", the function's name for a named one (the output, decoded under
  /// its schema, becomes tool_calls: make_forced_tool_parser); nullopt otherwise.
  std::optional<std::string> forced_tool;
  /// The request's parallel_tool_calls: false keeps only each reply's first tool call (whole: tool_calls[:1];
  /// streamed: no deltas of calls with index > 0), as vLLM.
  bool parallel_tool_calls = true;
  /// Whether the chat output goes through a tool-call parser (tool_parser or forced_tool).
  bool has_tool_parser() const { return !tool_parser.empty() || forced_tool.has_value(); }
  /// Chat with --reasoning-parser: the model's reasoning format; each reply is split into `reasoning` and `content`
  /// (reasoning_parser.h) before any tool-call parser sees the content. Null otherwise.
  const ReasoningFormat* reasoning = nullptr;
  PromptReasoning prompt_reasoning = PromptReasoning::None;  ///< with `reasoning`: where the chat prompt leaves it
  bool include_reasoning = true;                             ///< with `reasoning`: the request's include_reasoning
  bool thinking_off = false;  ///< chat_template_kwargs enable_thinking false (ReasoningFormat::content_when_thinking_off)
  /// POST /v1/responses and /v1/messages: the chat completion rendered in that API's shape (whole, or as its stream's
  /// events) instead of a chat completion; null otherwise.
  std::shared_ptr<ChatRenderer> renderer;
  std::vector<std::string> request_ids;  ///< [prompts.size() * n], choice index = prompt * n + i
  std::shared_ptr<OutputChannel> channel;
  const Tokenizer* tokenizer = nullptr;
};

/// Accumulates a job's delta outputs (to_delta) and renders them. Not thread-safe (one HTTP handler owns
/// it). A streaming job keeps only counters (each output is rendered and dropped); a non-streaming one keeps the
/// whole output per choice.
class ResponseBuilder {
 public:
  explicit ResponseBuilder(std::shared_ptr<GenerationJob> job);
  /// Takes one engine delta output (index = choice index; deltas merged by OutputChannel are fine). Returns the
  /// SSE chunk objects it produces (streaming).
  std::vector<nlohmann::ordered_json> on_output(int index, RequestOutput&& out);
  /// SSE chunks to send before any output (chat: the assistant role; echo: the prompt text).
  std::vector<nlohmann::ordered_json> opening_chunks();
  bool all_finished() const { return num_finished_ == static_cast<int>(finished_.size()); }
  /// The whole non-streaming response (call when all_finished()).
  nlohmann::ordered_json final_response() const;
  /// final_response() serialized (as nlohmann::ordered_json::dump(-1) with invalid UTF-8 replaced), built so that large
  /// completions logprobs are serialized once per prompt rather than built as JSON per choice and copied.
  std::string final_body() const;
  /// The usage object {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details: {cached_tokens}}.
  nlohmann::ordered_json usage() const;
  /// The streaming usage chunk (choices: []).
  nlohmann::ordered_json usage_chunk() const;
  /// vLLM's continuous_usage_stats usage of one choice's chunk: its prompt's tokens and the choice's tokens so far
  /// {prompt_tokens, completion_tokens, total_tokens}. index: the choice index (prompt * n + i), in range.
  nlohmann::ordered_json choice_usage(int index) const;
  const GenerationJob& job() const { return *job_; }

 private:
  nlohmann::ordered_json chunk(nlohmann::ordered_json choice) const;
  /// The response; with `fragments`, each completions choice's "logprobs" is placeholder_ + its index in
  /// `fragments`, which receives the serialized logprobs object.
  nlohmann::ordered_json build_final(std::vector<std::string>* fragments) const;
  /// Completions logprobs of entries [from, end); text_offset (characters) is the first token's offset and
  /// advances by each listed token's length.
  nlohmann::ordered_json completion_logprobs(const std::vector<std::vector<TokenLogprob>>& lps, size_t from, size_t& text_offset) const;
  nlohmann::ordered_json chat_logprobs(const std::vector<std::vector<TokenLogprob>>& lps, size_t from) const;
  /// Completions logprobs of prompt `p`'s tokens (echo): the first null, text_offset from 0, advancing `text_offset`.
  nlohmann::ordered_json prompt_logprobs_json(const ReadyPrompt& p, const RequestOutput& o, size_t& text_offset) const;
  /// vLLM's per-choice "prompt_logprobs": [null, {"token id": {logprob, rank, decoded_token}}, ...], the prompt
  /// token first, then the top job_->prompt_logprobs of its distribution.
  nlohmann::ordered_json vllm_prompt_logprobs(const RequestOutput& o) const;
  std::string token_text(int id) const;
  /// A token as the logprobs name it: its text, or "token_id:<id>" with return_tokens_as_token_ids (vLLM).
  std::string logprob_token(int id) const;
  /// Characters token `id` adds to the text: utf8_char_count of its raw bytes (a partial character counts where
  /// it starts), so text_offset indexes the returned text.
  size_t token_chars(int id) const;

  std::shared_ptr<GenerationJob> job_;
  std::vector<std::optional<RequestOutput>> acc_;   // [choices] non-streaming: the whole output so far
  std::vector<char> finished_;                      // [choices]
  std::vector<size_t> num_tokens_;                  // [choices] generated tokens so far
  std::vector<int> num_cached_;                     // [choices] prompt tokens served from the prefix cache
  std::vector<size_t> next_offset_;                 // [choices] text_offset (characters) of the next streamed token
  std::vector<char> sent_prompt_logprobs_;          // [choices] echo: the prompt's logprobs were streamed
  std::vector<char> sent_prompt_ids_;               // [choices] return_token_ids: the prompt's ids were streamed
  std::vector<std::unique_ptr<ToolParser>> tool_parsers_;  // [choices] streaming chat with a tool parser
  std::vector<ReasoningParser> reasoning_parsers_;  // [choices] streaming chat with a reasoning parser
  std::vector<int> num_tool_calls_;                 // [choices] tool calls streamed so far (their delta index)
  int num_finished_ = 0;
  std::string placeholder_;                         // final_body's splice tag (random per builder)
};

/// Characters (Unicode code points) in UTF-8 text: bytes that do not continue a sequence, so a partial character
/// counts once, where it starts.
size_t utf8_char_count(std::string_view s);

/// A new tool-call parser of a job with has_tool_parser(): the forced tool_choice's (make_forced_tool_parser), else
/// the --tool-call-parser's (make_tool_parser).
std::unique_ptr<ToolParser> job_tool_parser(const GenerationJob& job);
/// A new reasoning parser of a job with a reasoning format (job.reasoning not null), for its chat prompt's state.
ReasoningParser job_reasoning_parser(const GenerationJob& job);

/// Logprobs as the responses write them: at least kMinJsonLogprob (vLLM's max(logprob, -9999.0)), since a token a
/// structured-output grammar masks has logprob -inf, which JSON cannot hold.
inline constexpr float kMinJsonLogprob = -9999.0f;
inline float json_logprob(float logprob) { return logprob < kMinJsonLogprob ? kMinJsonLogprob : logprob; }

/// vLLM's stop_reason: the matched stop string, the stop_token_ids entry, or null.
nlohmann::ordered_json stop_reason_json(const CompletionOutput& c);

}  // namespace ssmserve::server
