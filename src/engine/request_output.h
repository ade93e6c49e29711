// Owns the results handed to callers (vLLM's RequestOutput / CompletionOutput).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"

namespace ssmserve {

/// One generated sequence.
struct CompletionOutput {
  int index = 0;
  std::string text;                                 ///< detokenized output (stop string removed unless included)
  std::vector<int> token_ids;
  /// Per generated token, when SamplingParams::logprobs is set: the sampled token first, then the top-k
  /// of the raw model distribution in rank order (the sampled token is not repeated). Natural logs.
  std::vector<std::vector<TokenLogprob>> logprobs;
  FinishReason finish_reason = FinishReason::None;
  std::string stop_reason;                          ///< matched stop string, or empty
  std::optional<int> stop_reason_token;             ///< the stop_token_ids entry that ended the sequence
};

/// A request's state after a step (cumulative), plus the text that became safe to stream since the last one.
struct RequestOutput {
  std::string request_id;
  std::string prompt;
  std::vector<int> prompt_token_ids;
  /// [prompt_len] when SamplingParams::prompt_logprobs is set: nullopt for position 0, else the prompt token's
  /// logprob and the top-k of the distribution that predicted it. Set on the first output after the prefill (the
  /// first generated token, so streams can send them early) and on the finished one; empty on the others.
  std::vector<std::optional<PromptLogprob>> prompt_logprobs;
  std::vector<CompletionOutput> outputs;
  bool finished = false;
  std::string delta_text;                           ///< new streamable text since the previous output
  std::vector<int> delta_token_ids;                 ///< tokens generated this step
  /// Prompt tokens served from the prefix cache at the request's first schedule (vLLM's
  /// RequestOutput.num_cached_tokens; OpenAI usage.prompt_tokens_details.cached_tokens); 0 without a hit.
  int num_cached_tokens = 0;
};

}  // namespace ssmserve
