// Owns the per-sequence stop decision (EOS, stop_token_ids, stop strings, max_tokens) and the streaming
// hold-back of text that may still become a stop string (vLLM's StopChecker / detokenizer stop logic).
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling_params.h"

namespace ssmserve {

/// Why a sequence finished. None = still running.
enum class FinishReason { None, Stop, Length, Abort };

/// OpenAI / vLLM name of a finish reason: "stop", "length", "abort"; "" for None.
std::string_view finish_reason_name(FinishReason r);

/// The outcome of StopChecker::on_token for one new token.
struct StopDecision {
  /// None (keep going), Stop (EOS, stop token or stop string) or Length (max_tokens reached).
  FinishReason reason = FinishReason::None;
  /// The stop_token_ids entry that stopped the sequence (vLLM's stop_reason); unset for EOS and others.
  std::optional<int> stop_reason_token;
  /// The stop string that matched (vLLM's stop_reason); empty unless a stop string stopped the sequence.
  std::string stop_str;
  /// Bytes of text_so_far that form the output text: text_so_far.size() unless a stop truncated it.
  size_t keep_chars = 0;
};

/// Stop logic for one output sequence, evaluated after each generated token, in vLLM v1's order:
///  0. num_output_tokens >= max_tokens -> Length, unless a stop string ends in the new text (3. below) -> Stop: an EOS
///     or stop token that is also the max_tokens-th token ends the sequence as "length", its text kept (v1's scheduler
///     checks the length cap before EOS; its detokenizer searches stop strings afterwards);
///  1. while num_output_tokens < min_tokens nothing else stops the sequence, and stop strings are searched only from
///     the (min_tokens + 1)-th token on (vLLM v1's detokenizer: the first min_tokens tokens' text is never searched,
///     apart from the len(stop)-1 bytes of look-back below);
///  2. EOS (unless ignore_eos) -> Stop; the token's text is dropped unless include_stop_str_in_output;
///     a stop_token_ids entry -> Stop with stop_reason_token; text handled as for EOS;
///  3. a stop string in the text -> Stop with stop_str; the text is truncated before it (or after it with
///     include_stop_str_in_output). Only new text plus the last len(stop)-1 older bytes are searched. When
///     several stop strings occur in the new text the one that starts earliest wins (ties: list order);
///     vLLM takes the first in list order instead.
/// Text is UTF-8 bytes; "chars" below means bytes (stop strings match on byte boundaries, which is exact for
/// valid UTF-8). Cheap to copy; holds copies of the relevant params.
class StopChecker {
 public:
  /// params: the request's (validated) SamplingParams. eos_token_ids: the model's EOS ids (may be empty).
  StopChecker(const SamplingParams& params, std::vector<int> eos_token_ids);

  /// Decides whether the sequence stops after token_id.
  /// text_so_far: the whole detokenized output text including token_id's text, which starts at byte
  /// new_text_start (<= text_so_far.size()). num_output_tokens: output tokens so far including token_id (>= 1).
  /// Throws ssmserve::Error if new_text_start > text_so_far.size() or num_output_tokens < 1.
  StopDecision on_token(int token_id, std::string_view text_so_far, size_t new_text_start,
                        int num_output_tokens) const;

  /// Streaming hold-back: how many leading bytes of `text` (the output so far of a still-running sequence)
  /// are safe to send, i.e. text.size() minus the longest suffix that is a proper prefix of some stop string.
  /// With include_stop_str_in_output or no stop strings, everything is safe.
  size_t streamable_chars(std::string_view text) const;

  /// Length in bytes of the longest stop string (0 if none).
  size_t max_stop_len() const { return max_stop_len_; }

 private:
  std::vector<std::string> stop_;
  std::vector<int> stop_token_ids_;
  std::vector<int> eos_token_ids_;
  bool ignore_eos_;
  bool include_stop_;
  int min_tokens_;
  int max_tokens_;
  size_t max_stop_len_ = 0;
};

}  // namespace ssmserve
