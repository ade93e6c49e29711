// Owns next-token sampling: penalties, min_tokens masking, greedy / temperature / top-k / top-p / min-p
// sampling with a per-request RNG, and log-probabilities of the raw model distribution (vLLM's Sampler).
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace ssmserve {

/// One (token id, log-probability) pair, with the token's rank in its distribution when known.
struct TokenLogprob {
  int id;
  float logprob;
  /// vLLM's Logprob.rank: 1-based; a top-k entry's is its position (1..k), a sampled or prompt token's 1 + the number
  /// of raw logits strictly above its own. 0 = not known.
  int rank = 0;
};

/// The outcome of sampling one token.
/// `logprob` and `top` come from the UNMODIFIED model distribution (log_softmax of the raw logits, before
/// penalties / temperature / filtering), as vLLM's default logprobs mode ("raw_logprobs").
/// `top` holds the params.logprobs most probable tokens, sorted by logprob descending (ties: lower id
/// first); empty when params.logprobs is unset or 0.
struct SampleResult {
  int token = -1;
  float logprob = 0.0f;
  /// With params.logprobs set: 1 + the number of raw logits strictly above the token's (vLLM's rank of the sampled
  /// token, however far down the distribution a sampled token lies); else 0.
  int rank = 0;
  std::vector<TokenLogprob> top;
};

/// A request's (or sequence's) private random stream. Seeded: the stream is a pure function of the seed
/// (std::mt19937_64 plus a portable bits-to-double mapping, so identical across platforms and standard
/// libraries). Unseeded: seeded from std::random_device. Not thread-safe; one per sequence.
class RequestRng {
 public:
  /// seed: the request's SamplingParams::seed (nullopt = nondeterministic).
  explicit RequestRng(std::optional<uint64_t> seed);

  /// Stream for output sequence `seq_index` of an n > 1 request: seeded requests get distinct,
  /// reproducible streams per index (seq 0 equals RequestRng(seed)); unseeded ones a fresh random stream.
  static RequestRng for_sequence(std::optional<uint64_t> seed, int seq_index);

  /// Uniform double in [0, 1) with 53 random bits.
  double uniform();
  /// Next raw 64-bit value of the stream.
  uint64_t next_u64() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

/// vLLM's engine seed (--seed, LLM(seed=...)) for a request without its own: the seed of the `index`-th such request,
/// splitmix64(splitmix64(engine_seed) + index) (Steele et al., 2014), so unseeded requests differ from each other
/// and from small explicit seeds, and repeat from run to run in the same order. The Python package's _Seeder
/// derives the same values.
uint64_t derived_request_seed(uint64_t engine_seed, uint64_t index);

/// Samples the next token from one sequence's logits, as vLLM v1's Sampler for a single row:
///  0. masks and bias, in vLLM's order: allowed_token_ids (every other id -inf), bad_words_token_ids (the last token
///     of each sequence whose other tokens end output_ids -inf; engine/bad_words.h), then params.logit_bias[id] is
///     added to logit id (vLLM's LogitBiasLogitsProcessor);
///  1. min_tokens: while output_ids.size() < params.min_tokens, the EOS ids (unless ignore_eos) and
///     params.stop_token_ids are set to -inf;
///  2. penalties (vLLM apply_penalties / HF): repetition_penalty over tokens in prompt + output (positive
///     logits divided, others multiplied), then frequency_penalty * count and presence_penalty over output
///     tokens only;
///  3. greedy (params.greedy()): argmax, ties -> lowest id. Otherwise logits / temperature, top-k, top-p
///     (smallest most-probable set with mass >= top_p, at least one token), min-p (drop p < min_p * p_max),
///     in HF's / vLLM v0's order, then one inverse-CDF draw with rng.uniform() (candidates in id order,
///     or in (prob desc, id asc) order when top-k / top-p is active).
/// The result depends only on (logits, params, prompt_ids, output_ids, eos_token_ids, rng state): no
/// batch effects. Consumes exactly one rng.uniform() per non-greedy call and none when greedy.
/// Cost: a few vectorized O(vocab) passes, plus O(vocab log k) for top-k (bounded heap) and, for top-p
/// alone, a sort of only the tokens within a few temperature units of the max (no full-vocab sort).
///
/// logits: [vocab] fp32 raw model output for the next position. prompt_ids / output_ids: the sequence's
/// token history (ids in [0, vocab)). eos_token_ids: the model's EOS ids (for min_tokens masking).
/// scratch: reusable per-caller working buffer, resized to 2 * vocab; contents afterwards unspecified.
/// Throws ssmserve::Error on empty logits, NaN / +inf logits, out-of-range history ids, or when every
/// token is masked (-inf). params must have been validate()d.
SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::span<const int> prompt_ids, std::span<const int> output_ids,
                          std::span<const int> eos_token_ids, RequestRng& rng, std::vector<float>& scratch);

/// sample_token with the request's uniform already drawn (`uniform` = rng.uniform(), ignored when greedy): the
/// host fallback of device sampling, which draws the uniform before the device runs. Same result and errors.
SampleResult sample_token_with_uniform(std::span<const float> logits, const SamplingParams& params,
                                       std::span<const int> prompt_ids, std::span<const int> output_ids,
                                       std::span<const int> eos_token_ids, double uniform, std::vector<float>& scratch);

/// Steps 0-2 of sample_token (allowed_token_ids, bad_words, logit_bias, min_tokens masking, then repetition / frequency
/// / presence penalties) applied in place to logits: [vocab] fp32. Same arguments and errors as sample_token (history
/// ids out of range).
void process_logits(std::span<float> logits, const SamplingParams& params, std::span<const int> prompt_ids,
                    std::span<const int> output_ids, std::span<const int> eos_token_ids);

/// log(sum(exp(logits))) of [vocab] fp32 logits, computed with max subtraction and a double accumulator
/// (a vectorizable float exp, ~2 ulp; agrees with a naive double computation to ~1e-7). -inf entries add 0.
/// Throws ssmserve::Error on empty input, NaN or +inf entries, or when all entries are -inf.
double log_sum_exp(std::span<const float> logits);

/// The k most probable tokens of log_softmax(logits), sorted by logprob descending (ties: lower id first);
/// k is clamped to vocab. Used for generated-token logprobs and prompt_logprobs (vLLM semantics).
/// logits: [vocab] fp32 raw. If logprob_of is non-null, *logprob_of receives the log-probability of token
/// `id` (which must be in [0, vocab)). Cost O(vocab log k).
/// Throws ssmserve::Error on k < 0, bad id, or the log_sum_exp errors.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int k, float* logprob_of = nullptr,
                                       int id = -1);

/// vLLM's rank of a token whose raw logit is x: 1 + the number of logits strictly greater than x (ties share a
/// rank). logits: [vocab] fp32 raw. O(vocab).
int raw_rank(std::span<const float> logits, float x);

}  // namespace ssmserve
