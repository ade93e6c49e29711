// Owns SamplingParams: the per-request decoding knobs (vLLM's names, defaults and validation limits).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace ssmserve {

/// Temperatures below this are greedy decoding (vLLM's _SAMPLING_EPS).
inline constexpr double kSamplingEps = 1e-5;
/// Largest `logprobs` / `prompt_logprobs` a request may ask for (vLLM's default max_logprobs).
inline constexpr int kMaxLogprobs = 20;
/// Most bad_words entries, and most token sequences they give after tokenization, per request (vLLM's
/// VLLM_MAX_NUM_BAD_WORDS default).
inline constexpr int kMaxBadWords = 128;
/// Most tokens over all of a request's bad-word sequences (vLLM's VLLM_MAX_BAD_WORDS_TOTAL_TOKENS default).
inline constexpr int kMaxBadWordsTotalTokens = 1024;
/// Longest bad_words entry, in bytes (bounds the tokenizer's work before the token limit applies).
inline constexpr size_t kMaxBadWordBytes = 1024;

/// A request's structured-output constraint (vLLM's `StructuredOutputsParams`, vllm/sampling_params.py): exactly one
/// of json / regex / choice / grammar / json_object / structural_tag. The engine compiles it with xgrammar against the
/// tokenizer's vocabulary and masks, at every sampled position, the tokens that would leave the language
/// (engine/structured_output.h); when the text is complete only the model's EOS ids remain.
struct StructuredOutputsParams {
  std::optional<std::string> json;                  ///< a JSON schema (the schema's JSON text)
  std::optional<std::string> regex;                 ///< a regular expression the whole output must match
  std::optional<std::vector<std::string>> choice;   ///< the output is exactly one of these strings
  std::optional<std::string> grammar;               ///< an EBNF grammar (GBNF / xgrammar syntax, root rule `root`)
  bool json_object = false;                         ///< any JSON object (response_format {"type": "json_object"})
  std::optional<std::string> structural_tag;        ///< an xgrammar structural tag (its JSON text)
  /// JSON constraints: no whitespace between tokens of the JSON text (xgrammar any_whitespace = false).
  bool disable_any_whitespace = false;
  /// JSON schemas: properties the schema does not list are allowed where it does not forbid them (xgrammar
  /// strict_mode = false); by default they are not.
  bool disable_additional_properties = false;

  /// How many of the constraint kinds are set (a valid value has exactly 1).
  int num_constraints() const;
  /// The name of the constraint kind that is set ("json", "regex", "choice", "grammar", "json_object",
  /// "structural_tag"), or "" when none is.
  const char* kind() const;
  /// Throws ssmserve::Error (naming the field) unless exactly one kind is set and it is non-empty (a non-empty
  /// choice list of non-empty strings, a non-empty schema / regex / grammar / tag).
  void validate() const;
  bool operator==(const StructuredOutputsParams&) const = default;
};

/// What SamplingParams::validate throws: an Error whose what() is "SamplingParams.<field><rest>" (e.g.
/// "SamplingParams.max_tokens must be at least 1, got 0"), the field kept apart so that a caller that took the value
/// under another name (the CLI's --max-tokens, a JSON line's "max_tokens", an HTTP request's field) can name that.
class SamplingParamsError : public Error {
 public:
  SamplingParamsError(std::string field, std::string rest);
  /// The SamplingParams field at fault ("max_tokens", "stop_token_ids", ...).
  const std::string& field() const { return field_; }
  /// The message naming `name` instead of "SamplingParams.<field>": name + rest (" must be at least 1, got 0",
  /// "[0] = 50280 is out of vocabulary range [0, 50280)").
  std::string named(std::string_view name) const { return std::string(name) + rest_; }

 private:
  std::string field_, rest_;
};

/// True when a repetition_penalty is a positive normal float32 (1.2e-38 to 3.4e38): the samplers divide and multiply
/// fp32 logits by it, so a smaller one would round to 0 or a subnormal and a larger one to inf.
bool repetition_penalty_fits_float32(double rp);

/// Per-request sampling and stopping parameters. Field names, meanings and defaults follow vLLM's
/// `vllm.SamplingParams` (which in turn follows the OpenAI completions API); penalties follow vLLM v1's
/// `apply_penalties` and HF's RepetitionPenaltyLogitsProcessor. Plain aggregate: set fields, then call
/// validate() once when the request is admitted.
struct SamplingParams {
  /// Number of output sequences to generate for the prompt (>= 1).
  int n = 1;
  /// Softmax temperature (>= 0). Below kSamplingEps decoding is greedy (argmax).
  double temperature = 1.0;
  /// Nucleus sampling: keep the smallest set of most-probable tokens whose mass is >= top_p. In (0, 1]; 1 = off.
  double top_p = 1.0;
  /// Keep only the top_k most probable tokens. 0 or -1 = off; otherwise >= 1 (values above the vocab are clamped).
  int top_k = 0;
  /// Drop tokens whose probability is < min_p * (probability of the most likely token). In [0, 1]; 0 = off.
  double min_p = 0.0;
  /// Seed of the request's random stream; unset = nondeterministic (std::random_device).
  std::optional<uint64_t> seed;
  /// Subtracted once from the logit of every token that occurs in the output so far. In [-2, 2].
  double presence_penalty = 0.0;
  /// Subtracted from a token's logit once per occurrence in the output so far. In [-2, 2].
  double frequency_penalty = 0.0;
  /// HF-style multiplicative penalty over tokens in prompt + output: positive logits are divided by it,
  /// non-positive ones multiplied. > 0; 1 = off.
  double repetition_penalty = 1.0;
  /// Maximum number of generated tokens (>= 1); reaching it finishes the sequence with reason "length".
  int max_tokens = 16;
  /// EOS, stop_token_ids and stop strings cannot end the sequence before this many tokens are generated
  /// (the sampler masks EOS / stop_token_ids meanwhile). In [0, max_tokens].
  int min_tokens = 0;
  /// Stop strings: generation stops when one appears in the output text (non-empty strings).
  std::vector<std::string> stop;
  /// Token ids that stop generation when sampled (in addition to EOS); each in [0, vocab_size).
  std::vector<int> stop_token_ids;
  /// Keep generating after EOS (EOS then neither stops nor is masked by min_tokens).
  bool ignore_eos = false;
  /// Return this many top log-probabilities per generated token (in [0, kMaxLogprobs]); unset = none.
  std::optional<int> logprobs;
  /// Return this many top log-probabilities per prompt token (in [0, kMaxLogprobs]); unset = none.
  std::optional<int> prompt_logprobs;
  /// Keep the matched stop string (or stop token's text) in the returned text.
  bool include_stop_str_in_output = false;
  /// Drop special tokens (EOS, BOS, ...) when detokenizing the output.
  bool skip_special_tokens = true;
  /// Added to the raw logit of each listed token id before penalties and sampling (OpenAI / vLLM logit_bias;
  /// the server clamps values to [-100, 100]). Ids in [0, vocab_size), finite values.
  std::map<int, float> logit_bias;
  /// When non-empty, only these token ids can be sampled: every other logit is masked to -inf before penalties
  /// and sampling (vLLM's allowed_token_ids; logprobs stay those of the raw distribution). Ids in [0, vocab_size).
  /// Rows with it are sampled on the host.
  std::vector<int> allowed_token_ids;
  /// Words that must not be generated (vLLM's bad_words). Each word (leading whitespace stripped) is tokenized as given
  /// and with a leading space (engine/bad_words.h tokenize_bad_words); a token sequence is banned by setting the logit
  /// of its last token to -inf whenever the generated tokens so far (not the prompt) end with its other tokens, so a
  /// one-token word is always banned. Applied right after allowed_token_ids, before logit_bias, min_tokens and
  /// penalties, as vLLM; logprobs stay those of the raw distribution. Non-empty strings of at most kMaxBadWordBytes
  /// bytes, at most kMaxBadWords of them.
  std::vector<std::string> bad_words;
  /// The token sequences the sampler bans (vLLM's SamplingParams._bad_words_token_ids). Left empty, the engine fills it
  /// from bad_words when it admits the request (LLMEngine::add_request); the server fills it on the request thread so
  /// its errors name the field. Set directly (bad_words empty) it bans token sequences without a tokenizer. Each
  /// non-empty with ids in [0, vocab_size); at most kMaxBadWords sequences and kMaxBadWordsTotalTokens tokens.
  std::vector<std::vector<int>> bad_words_token_ids;
  /// When set, the output follows this constraint (structured outputs; vLLM's SamplingParams.structured_outputs).
  /// Rows with it are sampled on the host; their logprobs are those of the constrained distribution (the grammar's
  /// mask applies before sampling, as in vLLM).
  std::optional<StructuredOutputsParams> structured_outputs;

  /// Checks every field against vLLM's limits (SamplingParams._verify_args plus the engine's
  /// max_logprobs = 20 and the processor's token-id range check).
  /// vocab_size: the model's vocabulary size (> 0), used to range-check stop_token_ids.
  /// Throws SamplingParamsError naming the offending field and value (a bad structured_outputs: the Error of
  /// StructuredOutputsParams::validate).
  void validate(int vocab_size) const;

  /// True when decoding is greedy: temperature < kSamplingEps (vLLM).
  bool greedy() const { return temperature < kSamplingEps; }

  /// top_k as a candidate count for a vocabulary of vocab_size: vocab_size when off (0 / -1), else
  /// min(top_k, vocab_size).
  int effective_top_k(int vocab_size) const;
};

}  // namespace ssmserve
