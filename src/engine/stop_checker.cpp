// Owns StopChecker: EOS / stop token / stop string / max_tokens decisions and streaming hold-back.
#include "engine/stop_checker.h"

#include <algorithm>

#include "core/error.h"

namespace ssmserve {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
    case FinishReason::None:
      break;
  }
  return "";
}

StopChecker::StopChecker(const SamplingParams& params, std::vector<int> eos_token_ids)
    : stop_(params.stop),
      stop_token_ids_(params.stop_token_ids),
      eos_token_ids_(std::move(eos_token_ids)),
      ignore_eos_(params.ignore_eos),
      include_stop_(params.include_stop_str_in_output),
      min_tokens_(params.min_tokens),
      max_tokens_(params.max_tokens) {
  for (const auto& s : stop_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

StopDecision StopChecker::on_token(int token_id, std::string_view text, size_t new_text_start,
                                   int num_output_tokens) const {
  SSM_CHECK(new_text_start <= text.size(), "StopChecker: new_text_start {} beyond text of {} bytes", new_text_start,
            text.size());
  SSM_CHECK(num_output_tokens >= 1, "StopChecker: num_output_tokens must be >= 1, got {}", num_output_tokens);
  StopDecision d;
  d.keep_chars = text.size();
  auto contains = [token_id](const std::vector<int>& v) { return std::find(v.begin(), v.end(), token_id) != v.end(); };

  // Stop strings in the new text plus the last len(stop)-1 older bytes, only after the first min_tokens tokens (vLLM
  // v1's detokenizer, PR 22014): the earliest match wins (ties: list order).
  auto stop_string = [&]() -> bool {
    if (new_text_start >= text.size() || num_output_tokens <= min_tokens_) return false;
    size_t best_pos = std::string_view::npos;
    const std::string* best = nullptr;
    for (const auto& s : stop_) {
      const size_t from = new_text_start >= s.size() - 1 ? new_text_start - (s.size() - 1) : 0;
      const size_t pos = text.find(s, from);
      if (pos != std::string_view::npos && (best == nullptr || pos < best_pos)) {
        best_pos = pos;
        best = &s;
      }
    }
    if (!best) return false;
    d.reason = FinishReason::Stop;
    d.stop_str = *best;
    d.keep_chars = include_stop_ ? best_pos + best->size() : best_pos;
    return true;
  };
  // vLLM v1's order: the length cap first (its scheduler's check_stop), so an EOS or stop token that is also the
  // max_tokens-th token ends the sequence as "length" with its text kept; the detokenizer's stop strings still end it
  // as "stop".
  if (num_output_tokens >= max_tokens_) {
    if (!stop_string()) d.reason = FinishReason::Length;
    return d;
  }
  // EOS and stop token ids count from the min_tokens-th token (the sampler masks them before it; vLLM v1's check_stop).
  if (num_output_tokens >= min_tokens_) {
    const bool is_eos = !ignore_eos_ && contains(eos_token_ids_);
    if (is_eos || contains(stop_token_ids_)) {
      d.reason = FinishReason::Stop;
      if (!is_eos) d.stop_reason_token = token_id;
      if (!include_stop_) d.keep_chars = new_text_start;  // drop the stop token's own text
      return d;
    }
  }
  stop_string();
  return d;
}

size_t StopChecker::streamable_chars(std::string_view text) const {
  if (include_stop_ || stop_.empty()) return text.size();
  size_t hold = 0;  // longest suffix of text that is a proper prefix of a stop string
  for (const auto& s : stop_) {
    const size_t longest = std::min(s.size() - 1, text.size());
    for (size_t len = longest; len > hold; --len) {
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return text.size() - hold;
}

}  // namespace ssmserve
