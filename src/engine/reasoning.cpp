// Owns the reasoning formats' registry (see reasoning.h).
#include "engine/reasoning.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"

namespace ssmserve {

namespace {

/// vLLM's parsers whose reasoning is a <think> ... </think> block (vllm/reasoning/*_reasoning_parser.py).
const std::vector<ReasoningFormat>& registry() {
  static const std::vector<ReasoningFormat> formats = {
      // DeepSeek-R1 (and QwQ): the template opens <think> in the prompt, or the model writes it; reasoning first.
      {"deepseek_r1", "<think>", "</think>", true},
      // Qwen3 / Qwen3.5 / Qwen3.6: Qwen3.5's template opens <think> in the prompt (or writes an empty closed block when
      // enable_thinking is false); older Qwen3 templates let the model write <think> itself. As vLLM's current qwen3
      // parser: reasoning first unless the prompt closed the block (an output never closing it is all reasoning).
      {"qwen3", "<think>", "</think>", true},
      // Nemotron 3 Nano (vLLM's nemotron_v3: deepseek_r1's, and with enable_thinking false the reply is content): its
      // template opens "<think>\n" in the generation prompt, or writes "<think></think>" with thinking off (a closed
      // block); a request's enable_thinking false makes the reply content with any template.
      {"nemotron_v3", "<think>", "</think>", true, /*content_when_thinking_off=*/true},
  };
  return formats;
}

}  // namespace

const ReasoningFormat& reasoning_format(const std::string& name) {
  for (const ReasoningFormat& f : registry())
    if (f.name == name) return f;
  fail("--reasoning-parser: unknown parser \"{}\" (known: {})", name, fmt::join(reasoning_parser_names(), ", "));
}

std::vector<std::string> reasoning_parser_names() {
  std::vector<std::string> names;
  for (const ReasoningFormat& f : registry()) names.push_back(f.name);
  std::sort(names.begin(), names.end());
  return names;
}

bool reasoning_ended(std::span<const int> ids, int start_id, int end_id, bool starts_in_reasoning) {
  for (size_t i = ids.size(); i-- > 0;) {
    if (ids[i] == end_id) return true;
    if (ids[i] == start_id) return false;
  }
  return !starts_in_reasoning;  // no marker: the format decides
}

}  // namespace ssmserve
