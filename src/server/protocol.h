// Owns the OpenAI request protocol: parsing and type-checking /v1/completions and /v1/chat/completions bodies
// into engine terms (prompts + SamplingParams), with vLLM's field names, defaults and limits. Everything a client
// can send ends either in a parsed request or in an ApiError (400) naming the field.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/generation_defaults.h"
#include "engine/sampling_params.h"
#include "server/api_error.h"

namespace ssmserve::server {

/// Most choices one request may ask for (n: pass@k evaluations ask for 100 or more; vLLM has no bound); fair
/// admission (--max-num-seqs-per-request) keeps one request from taking the whole batch.
inline constexpr int kMaxN = 1024;
/// Most prompts in one /v1/completions batch.
inline constexpr int kMaxPromptsPerRequest = 1024;
/// Most sequences (prompts x n) one request may ask for: the per-request bookkeeping stays bounded.
inline constexpr int kMaxSequencesPerRequest = 16384;
/// Most keys in one JSON object of a request body (logit_bias, a schema's properties, unknown fields...): the order-keeping
/// parse costs n^2 / 2 key comparisons per object (10,000 keys: ~0.1 s; 200,000: 43 s), checked before parsing.
inline constexpr std::size_t kMaxRequestObjectKeys = 10000;

/// One prompt: text, or token ids (`is_tokens`).
struct PromptInput {
  std::string text;
  std::vector<int> token_ids;
  bool is_tokens = false;
};

/// The longest cache_salt accepted (bytes).
inline constexpr size_t kMaxCacheSaltBytes = 4096;

/// Fields shared by both endpoints. params.structured_outputs holds the request's constraint, if any
/// (response_format, structured_outputs, guided_*, a forced tool_choice: parse_structured_outputs).
struct GenerationRequest {
  std::optional<std::string> model;   ///< "model"; unset = the served model
  SamplingParams params;               ///< with params.max_tokens meaningful only when max_tokens_given
  /// The field that set params.structured_outputs (parse_structured_outputs' `field`), for check_structured_outputs.
  std::string structured_outputs_field;
  bool max_tokens_given = false;
  /// Completions without a max_tokens field: OpenAI's (vLLM's) 16, checked against the context as a given one; an
  /// explicit null takes what the context leaves, as chat's absent field does.
  bool max_tokens_defaulted = false;
  /// The field errors about params.max_tokens name: "max_tokens" on completions; on chat "max_completion_tokens",
  /// or "max_tokens" when the client sent only that (vLLM's deprecated spelling).
  std::string max_tokens_field = "max_tokens";
  bool stream = false;
  bool include_usage = false;          ///< stream_options.include_usage
  bool continuous_usage_stats = false; ///< stream_options.continuous_usage_stats (vLLM: usage in every chunk)
  /// vLLM's truncate_prompt_tokens: keep only the prompt's last k tokens (-1: the server's --max-model-len), after
  /// tokenization (the rendered chat prompt's, on chat); k above --max-model-len is a 400, as vLLM.
  std::optional<int> truncate_prompt_tokens;
  /// vLLM's add_special_tokens: the tokenizer's special tokens (BOS) added to a text prompt; unset: true on
  /// /v1/completions, false on chat (the template writes its own).
  std::optional<bool> add_special_tokens;
  /// vLLM's return_tokens_as_token_ids (unset: the server's --return-tokens-as-token-ids).
  std::optional<bool> return_tokens_as_token_ids;
  /// vLLM's return_token_ids: each choice's generated ids (`token_ids`) and the prompt's (`prompt_token_ids`) beside
  /// the text; streamed, the ids of each chunk and the prompt's in a choice's first chunk.
  bool return_token_ids = false;
  /// vLLM's cache_salt: prefix-cache blocks shared only with requests carrying the same salt (Request::cache_salt);
  /// empty: none. At most kMaxCacheSaltBytes.
  std::string cache_salt;
  /// vLLM's prompt_logprobs: the top-k of every prompt position (at most --max-logprobs), returned in each completion choice's "prompt_logprobs" and in a chat response's top-level
  /// "prompt_logprobs" (not with stream, as vLLM).
  std::optional<int> prompt_logprobs;
};

/// POST /v1/completions.
struct CompletionRequest : GenerationRequest {
  std::vector<PromptInput> prompts;    ///< "prompt": string, [string], [int] or [[int]]
  bool echo = false;
  bool prompt_only = false;            ///< echo with max_tokens 0: the response holds the prompt (and its logprobs) only
};

/// POST /v1/chat/completions.
struct ChatRequest : GenerationRequest {
  nlohmann::ordered_json messages;             ///< [{"role", "content"}...], content already flattened to a string
  bool add_generation_prompt = true;
  /// vLLM's continue_final_message: the prompt ends inside the final message (needs add_generation_prompt false:
  /// both true is a 400).
  bool continue_final_message = false;
  std::optional<std::string> chat_template;  ///< vLLM's per-request template source, instead of the server's
  /// vLLM's chat_template_kwargs: extra template variables (e.g. {"enable_thinking": false}); an object.
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  nlohmann::ordered_json documents;  ///< vLLM's documents (a list, for RAG templates), or null
  /// vLLM's tools: [{"type": "function", "function": {"name", "description", "parameters"}}], or null (none or []).
  /// Passed to the chat template also with tool_choice "none", as vLLM does.
  nlohmann::ordered_json tools;
  /// "none", "auto" (default "auto" with tools, else "none"), "required" or "function" (a named function:
  /// tool_choice_function). "required" and "function" set params.structured_outputs to vLLM's tool-call schema
  /// (tool_choice_json_schema); "required" with an empty tools list is "none", as vLLM.
  std::string tool_choice = "none";
  std::string tool_choice_function;  ///< tool_choice "function": the function's name (one of tools)
  bool tool_choice_given = false;  ///< "tool_choice" was in the body (else it defaulted)
  /// vLLM's parallel_tool_calls (a bool; null = true): false keeps only the first tool call of a reply (whole:
  /// tool_calls[:1]; streamed: the deltas of call 0 only), as vLLM's maybe_filter_parallel_tool_calls.
  bool parallel_tool_calls = true;
  bool logprobs = false;               ///< chat's logprobs is a bool; top_logprobs gives the count
  int top_logprobs = 0;
  /// vLLM's chat echo: when the last message is the assistant's, its content starts every choice's message.
  bool echo = false;
  /// vLLM's include_reasoning: with --reasoning-parser, false leaves the reasoning (and, as vLLM, the logprobs, which
  /// would show it) out of the reply; without a parser it changes nothing.
  bool include_reasoning = true;
};

/// Parses a completions body. Sampling fields the body leaves out (or sends as null) take `defaults` (the model's
/// generation config: temperature, top_p, top_k, min_p, repetition_penalty), else vLLM's SamplingParams defaults;
/// max_tokens defaults to 16 (OpenAI's and vLLM's completions default; the server lowers it to what the context
/// leaves). Throws ApiError 400 naming the field for a wrong type or value out of range (max_tokens outside
/// [1, 2^31 - 1] except 0 with echo, which sets prompt_only; temperature < 0, top_p outside (0, 1], n outside
/// [1, kMaxN], empty prompt, logprobs / prompt_logprobs above `max_logprobs` (the server's --max-logprobs, at most
/// kMaxLogprobs), a bad response_format / structured_outputs / guided_* (parse_structured_outputs), tools, ...).
CompletionRequest parse_completion_request(const nlohmann::ordered_json& body, int max_logprobs = kMaxLogprobs,
                                           const GenerationDefaults& defaults = {});
/// Parses a chat completions body (messages: non-empty array of {"role": string, "content": string | null |
/// [{"type": "text", "text": string}]}). Sampling fields left out take `defaults` as for completions (max_tokens,
/// when not given, is the server's: defaults.max_tokens capped by the context). Throws ApiError 400 like
/// parse_completion_request (top_logprobs above `max_logprobs`; prompt_logprobs, which chat does not return, is
/// refused; a tool_choice naming no tool of `tools`).
ChatRequest parse_chat_request(const nlohmann::ordered_json& body, int max_logprobs = kMaxLogprobs,
                               const GenerationDefaults& defaults = {});
/// vLLM's logit_bias: an object mapping token ids, as decimal strings (OpenAI), to numbers; each bias is clamped to
/// [-100, 100] (vLLM). Returns {token id: bias}. Throws ApiError 400 naming logit_bias for a non-object, a key that is
/// not a non-negative integer below 2^31, or a value that is not a finite number. The vocabulary range is checked with
/// the model (SamplingParams::validate). Shared with `ssmserve generate --prompts-file`.
std::map<int, float> parse_logit_bias(const nlohmann::ordered_json& value);
/// vLLM's allowed_token_ids: a non-empty list of token ids (integers, or integral floats, in [0, 2^31 - 1]). Throws
/// ApiError 400 naming allowed_token_ids for a non-list, a bad entry or an empty list (which would allow nothing). The
/// vocabulary range is checked with the model (SamplingParams::validate).
std::vector<int> parse_allowed_token_ids(const nlohmann::ordered_json& value);
/// vLLM's bad_words: a list of at most kMaxBadWords non-empty strings of at most kMaxBadWordBytes bytes each (their
/// tokenization, tokenize_bad_words, needs the model's tokenizer). Throws ApiError 400 naming bad_words otherwise.
std::vector<std::string> parse_bad_words(const nlohmann::ordered_json& value);
/// Parses a request body as JSON; throws ApiError 400 for invalid JSON (including ill-formed UTF-8) or a
/// non-object.
nlohmann::ordered_json parse_body(const std::string& body);

}  // namespace ssmserve::server
