// Owns SamplingParams validation (vLLM's SamplingParams._verify_args limits).
#include "engine/sampling_params.h"

#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"

namespace ssmserve {

namespace {

/// Throws SamplingParamsError(field, rest formatted) unless `ok`.
template <typename... Args>
void check(bool ok, const char* field, fmt::format_string<Args...> rest, Args&&... args) {
  if (!ok) throw SamplingParamsError(field, fmt::format(rest, std::forward<Args>(args)...));
}

}  // namespace

SamplingParamsError::SamplingParamsError(std::string field, std::string rest)
    : Error("SamplingParams." + field + rest), field_(std::move(field)), rest_(std::move(rest)) {}

bool repetition_penalty_fits_float32(double rp) {
  const float f = static_cast<float>(rp);
  return f >= std::numeric_limits<float>::min() && std::isfinite(f);
}

void SamplingParams::validate(int vocab_size) const {
  SSM_CHECK(vocab_size > 0, "SamplingParams.validate: vocab_size must be > 0, got {}", vocab_size);
  check(n >= 1, "n", " must be at least 1, got {}", n);
  // Written as !(ok) so NaN fails too.
  check(presence_penalty >= -2.0 && presence_penalty <= 2.0, "presence_penalty", " must be in [-2, 2], got {}",
        presence_penalty);
  check(frequency_penalty >= -2.0 && frequency_penalty <= 2.0, "frequency_penalty", " must be in [-2, 2], got {}",
        frequency_penalty);
  check(repetition_penalty > 0.0 && std::isfinite(repetition_penalty), "repetition_penalty",
        " must be greater than zero, got {}", repetition_penalty);
  check(repetition_penalty_fits_float32(repetition_penalty), "repetition_penalty",
        " must be a normal float32 (1.2e-38 to 3.4e38), got {}", repetition_penalty);
  check(temperature >= 0.0 && std::isfinite(temperature), "temperature", " must be non-negative, got {}", temperature);
  check(top_p > 0.0 && top_p <= 1.0, "top_p", " must be in (0, 1], got {}", top_p);
  check(top_k >= -1, "top_k", " must be 0 or -1 (disable), or at least 1, got {}", top_k);
  check(min_p >= 0.0 && min_p <= 1.0, "min_p", " must be in [0, 1], got {}", min_p);
  check(max_tokens >= 1, "max_tokens", " must be at least 1, got {}", max_tokens);
  check(min_tokens >= 0, "min_tokens", " must be greater than or equal to 0, got {}", min_tokens);
  check(min_tokens <= max_tokens, "min_tokens", " must be less than or equal to max_tokens={}, got {}", max_tokens,
        min_tokens);
  if (logprobs) {
    check(*logprobs >= 0 && *logprobs <= kMaxLogprobs, "logprobs", " must be in [0, {}], got {}", kMaxLogprobs,
          *logprobs);
  }
  if (prompt_logprobs) {
    check(*prompt_logprobs >= 0 && *prompt_logprobs <= kMaxLogprobs, "prompt_logprobs", " must be in [0, {}], got {}",
          kMaxLogprobs, *prompt_logprobs);
  }
  for (size_t i = 0; i < stop.size(); ++i) check(!stop[i].empty(), "stop", " cannot contain an empty string (stop[{}])", i);
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    const int t = stop_token_ids[i];
    check(t >= 0 && t < vocab_size, "stop_token_ids", "[{}] = {} is out of vocabulary range [0, {})", i, t, vocab_size);
  }
  for (const auto& [id, bias] : logit_bias) {
    check(id >= 0 && id < vocab_size, "logit_bias", ": token id {} is out of vocabulary range [0, {})", id, vocab_size);
    check(std::isfinite(bias), "logit_bias", "[{}] must be finite, got {}", id, bias);
  }
  for (size_t i = 0; i < allowed_token_ids.size(); ++i) {
    const int t = allowed_token_ids[i];
    check(t >= 0 && t < vocab_size, "allowed_token_ids", "[{}] = {} is out of vocabulary range [0, {})", i, t,
          vocab_size);
  }
  check(bad_words.size() <= static_cast<size_t>(kMaxBadWords), "bad_words", " has {} words; at most {}",
        bad_words.size(), kMaxBadWords);
  for (size_t i = 0; i < bad_words.size(); ++i) {
    check(!bad_words[i].empty(), "bad_words", " cannot contain an empty string (bad_words[{}])", i);
    check(bad_words[i].size() <= kMaxBadWordBytes, "bad_words", "[{}] is {} bytes long; at most {}", i,
          bad_words[i].size(), kMaxBadWordBytes);
  }
  check(bad_words_token_ids.size() <= static_cast<size_t>(kMaxBadWords), "bad_words_token_ids",
        " has {} sequences; at most {}", bad_words_token_ids.size(), kMaxBadWords);
  size_t bad_tokens = 0;
  for (size_t i = 0; i < bad_words_token_ids.size(); ++i) {
    check(!bad_words_token_ids[i].empty(), "bad_words_token_ids", "[{}] is empty", i);
    bad_tokens += bad_words_token_ids[i].size();
    for (const int t : bad_words_token_ids[i])
      check(t >= 0 && t < vocab_size, "bad_words_token_ids", "[{}]: token id {} is out of vocabulary range [0, {})", i,
            t, vocab_size);
  }
  check(bad_tokens <= static_cast<size_t>(kMaxBadWordsTotalTokens), "bad_words_token_ids",
        " has {} tokens; at most {}", bad_tokens, kMaxBadWordsTotalTokens);
  if (structured_outputs) structured_outputs->validate();
}

int StructuredOutputsParams::num_constraints() const {
  return int{json.has_value()} + int{regex.has_value()} + int{choice.has_value()} + int{grammar.has_value()} +
         int{json_object} + int{structural_tag.has_value()};
}

const char* StructuredOutputsParams::kind() const {
  if (json) return "json";
  if (regex) return "regex";
  if (choice) return "choice";
  if (grammar) return "grammar";
  if (json_object) return "json_object";
  if (structural_tag) return "structural_tag";
  return "";
}

void StructuredOutputsParams::validate() const {
  SSM_CHECK(num_constraints() == 1,
            "structured_outputs must set exactly one of json, regex, choice, grammar, json_object and structural_tag "
            "(got {})", num_constraints());
  for (const auto* f : {&json, &regex, &grammar, &structural_tag})
    if (f->has_value()) SSM_CHECK(!(*f)->empty(), "structured_outputs.{} must not be empty", kind());
  if (choice) {
    SSM_CHECK(!choice->empty(), "structured_outputs.choice must list at least one string");
    for (size_t i = 0; i < choice->size(); ++i)
      SSM_CHECK(!(*choice)[i].empty(), "structured_outputs.choice[{}] must not be empty", i);
  }
}

int SamplingParams::effective_top_k(int vocab_size) const {
  if (top_k <= 0) return vocab_size;
  return top_k < vocab_size ? top_k : vocab_size;
}

}  // namespace ssmserve
