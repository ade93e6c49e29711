// Owns the text-level reasoning parser of the chat endpoint (vLLM's --reasoning-parser: Reasoning Outputs): it splits
// a chat reply's text into the model's reasoning (between the format's markers, e.g. "<think>" ... "</think>") and the
// content after it, whole or while the text streams. The formats (markers) are the engine's registry
// (engine/reasoning.h); where the reply starts is decided by the chat prompt (prompt_reasoning).
//
// The rules (vLLM's qwen3 and deepseek_r1 parsers as of their current ParserEngine / BaseThinkingReasoningParser):
// - The prompt opened a block (its last start marker after its last end marker: Qwen3.5's, Qwen3-Thinking's and
//   DeepSeek-R1's templates write "<think>\n" into the generation prompt): the reply starts in the reasoning.
// - The prompt closed a block (its last end marker last: Qwen3's enable_thinking=false writes
//   "<think>\n\n</think>\n\n"): thinking is off and the whole reply is content.
// - Neither marker in the prompt: ReasoningFormat::starts_in_reasoning decides (true: reasoning first, as vLLM's
//   deepseek_r1 and its current qwen3; false: content until the model writes a start marker, as vLLM's qwen3 before
//   its parser engine).
// - In the reasoning, the end marker ends it; a start marker there is dropped (older Qwen3 templates let the model
//   write "<think>" itself). A reply that never writes the end marker is reasoning to its end (vLLM: a truncated
//   reasoning; both formats).
// - Before a start marker (starts_in_reasoning false), an end marker is dropped and the content goes on.
// - Marker text is never returned: a stray start or end marker in the content is dropped too.
// - Text is not trimmed: "<think>\nA\n</think>\n\nB" is reasoning "\nA\n" and content "\n\nB", as vLLM returns them.
// The markers must be in the reply's text: non-special tokens (as Qwen3's and DeepSeek-R1's are), or decoded with
// skip_special_tokens false.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "engine/reasoning.h"

namespace ssmserve::server {

/// Where a chat prompt leaves the model's reasoning.
enum class PromptReasoning {
  None,    ///< neither marker: the format's starts_in_reasoning decides
  Open,    ///< the last start marker comes after the last end marker: the reply starts inside the reasoning
  Closed,  ///< the last end marker comes after the last start marker: thinking is disabled, the reply is content
};

/// The state a prompt text leaves (its last `format.start` / `format.end` occurrences).
PromptReasoning prompt_reasoning(std::string_view prompt, const ReasoningFormat& format);
/// The state prompt token ids leave (the last `start_id` / `end_id`; the engine's reasoning_ended reads the same).
PromptReasoning prompt_reasoning(std::span<const int> prompt_token_ids, int start_id, int end_id);

/// A whole reply split (vLLM's extract_reasoning): each part nullopt when empty (vLLM's null).
struct ReasoningSplit {
  std::optional<std::string> reasoning;
  std::optional<std::string> content;
};

/// A streamed piece split: the reasoning and content text this piece makes final (either may be empty).
struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

/// The reasoning parser of one reply (one per choice: it keeps the streaming position). Copyable.
class ReasoningParser {
 public:
  /// A parser for replies of `format` to a prompt that left `prompt`. Throws Error when a marker is empty.
  ReasoningParser(const ReasoningFormat& format, PromptReasoning prompt);
  /// The reasoning and content of a whole reply `text` (independent of feed(); the concatenated deltas that feed()
  /// returns for any split of `text` are the same strings).
  ReasoningSplit extract(std::string_view text) const;
  /// Streaming: takes the next piece of the reply; returns the reasoning and content it makes final. Text at the end
  /// of the piece that may begin a marker is held back until the next piece decides it. `final`: the reply ended
  /// (held text is sent as what it is).
  ReasoningDelta feed(std::string_view piece, bool final);
  /// Whether the text fed so far ends inside the reasoning.
  bool in_reasoning() const { return state_ == State::Reasoning; }

 private:
  enum class State {
    Before,     ///< content until a start marker (no marker in the prompt, starts_in_reasoning false)
    Reasoning,  ///< inside the reasoning, until the end marker
    Content,    ///< after the reasoning (or a closed prompt): content to the end
  };
  std::string start_, end_;
  State state_;
  std::string held_;  // the end of the last piece that may begin a marker
};

}  // namespace ssmserve::server
