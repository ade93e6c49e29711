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

/// What an output holds (vLLM's RequestOutputKind): Cumulative, the request's whole output so far (text, token ids,
/// logprobs) on every output; Delta, only what is new since the request's previous output, in the form to_delta
/// gives (the server: no per-step copies of a long output).
enum class OutputKind { Cumulative, Delta };

/// A request's state after a step (cumulative), plus the text that became safe to stream since the last one.
/// In the delta form (to_delta; vLLM's RequestOutputKind.DELTA), outputs[0].text / token_ids / logprobs hold only
/// the new part (text == delta_text), and prompt, prompt_token_ids and prompt_logprobs are kept on the request's
/// first output only.
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

/// Turns the cumulative output `o` of a step into its delta form: only its delta_token_ids' tokens and logprobs
/// and delta_text stay; the prompt fields too when `first` (the request's first output), else they are dropped.
/// Cost: linear in the output's size (no per-entry copies); a no-op on an output already in delta form.
void to_delta(RequestOutput& o, bool first);

/// Appends the delta output `next` (to_delta) of the same request to `acc` (an earlier delta, or a running
/// cumulative output): text, token ids, logprobs and delta fields grow by next's; finish state and stop reasons
/// become next's; prompt fields are kept from whichever has them. Cost: linear in next's size only.
void append_delta(RequestOutput& acc, RequestOutput&& next);

/// Approximate heap bytes `o` holds (text, token ids, logprobs, prompt logprobs): what buffering it costs.
size_t output_bytes(const RequestOutput& o);

}  // namespace ssmserve
