// Owns the reasoning formats (vLLM's --reasoning-parser): which markers delimit a model's reasoning ("thinking") in
// its output. The engine uses them to hold a request's structured-output constraint until the reasoning ends (vLLM's
// structured outputs with a reasoning parser, enable_in_reasoning off); the server splits a chat reply into
// `reasoning` and `content` with them (server/reasoning_parser.h).
#pragma once
#include <span>
#include <string>
#include <vector>

namespace ssmserve {

/// One reasoning format: the reasoning is the text between `start` and `end` (each one token of the vocabulary).
struct ReasoningFormat {
  std::string name;   ///< vLLM's --reasoning-parser name
  std::string start;  ///< e.g. "<think>"
  std::string end;    ///< e.g. "</think>"
  /// True when an output without `start` still begins inside the reasoning (the chat template put `start` into the
  /// prompt, or the model may omit it: DeepSeek-R1); false when it is content until a `start` (vLLM's qwen3 before
  /// Qwen3.5 templates, when the prompt does not open a reasoning block).
  bool starts_in_reasoning = false;
  /// True when a chat request with chat_template_kwargs enable_thinking false gets its reply as content whatever the
  /// prompt says (vLLM's nemotron_v3, whose parser moves an unterminated reasoning into the content then).
  bool content_when_thinking_off = false;
};

/// The format registered as `name` ("qwen3", "deepseek_r1"; reasoning_parser_names()). Throws ssmserve::Error
/// naming --reasoning-parser and listing the known names.
const ReasoningFormat& reasoning_format(const std::string& name);
/// The registered names, sorted.
std::vector<std::string> reasoning_parser_names();

/// Whether a prompt leaves the reasoning behind: its last `end_id` comes after its last `start_id` (vLLM's
/// is_reasoning_end: a template that disables thinking writes an empty closed block; one that enables it opens a
/// block); with neither marker, !starts_in_reasoning (the format's ReasoningFormat::starts_in_reasoning). ids: the
/// prompt's token ids.
bool reasoning_ended(std::span<const int> ids, int start_id, int end_id, bool starts_in_reasoning);

}  // namespace ssmserve
