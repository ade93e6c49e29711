// Owns bad_words (vLLM's SamplingParams.bad_words): turning the words into the token sequences a request bans (vLLM's
// SamplingParams.update_from_tokenizer) and finding the tokens those sequences ban at the next position (vLLM's
// v1/sample/ops/bad_words.py). The sampler masks them (engine/sampler.h), the device sampler's rows carry them as masks
// (engine/device_sampling.h).
#pragma once
#include <span>
#include <string>
#include <vector>

namespace ssmserve {

class Tokenizer;

/// The token sequences of `words` (vLLM's update_from_tokenizer), in order: each word, its leading whitespace stripped
/// (Python's str.lstrip), is encoded without special tokens (a) as it is and (b) with one leading space; (a) is always
/// kept, (b) only when it differs from (a) in its first token and has as many tokens (a tokenizer that adds the space
/// itself, e.g. SentencePiece, gives (b) == (a); a space that becomes a token of its own would ban a lone space).
/// Sequences equal to an earlier one are dropped (they ban nothing more).
/// vocab_size: the model's vocabulary size (ids must be below it).
/// Returns one non-empty sequence of ids in [0, vocab_size) per kept variant.
/// Throws ssmserve::Error naming bad_words[i] when word i is empty or tokenizes to nothing (only whitespace), when an
/// id is outside the vocabulary, or when the result exceeds kMaxBadWords sequences or kMaxBadWordsTotalTokens tokens
/// (engine/sampling_params.h).
std::vector<std::vector<int>> tokenize_bad_words(std::span<const std::string> words, const Tokenizer& tokenizer,
                                                 int vocab_size);

/// Calls ban(id) once per sequence of `sequences` that applies at the next position (vLLM's
/// _apply_bad_words_single_batch): a sequence [t0, ..., tn] bans tn when output_ids ends with [t0, ..., tn-1]; a
/// one-token sequence always bans its token. Only generated tokens count (vLLM: the output tokens, not the prompt):
/// a prefix longer than output_ids bans nothing. An id may be passed more than once (several sequences ending in it).
/// sequences: non-empty token-id sequences; output_ids: the request's generated tokens so far, oldest first.
/// Cost O(total tokens of sequences).
template <class Ban>
void for_each_banned_token(std::span<const std::vector<int>> sequences, std::span<const int> output_ids, Ban&& ban) {
  for (const std::vector<int>& seq : sequences) {
    if (seq.empty() || seq.size() - 1 > output_ids.size()) continue;
    const size_t prefix = seq.size() - 1, start = output_ids.size() - prefix;
    bool match = true;
    for (size_t i = 0; i < prefix && match; ++i) match = output_ids[start + i] == seq[i];
    if (match) ban(seq.back());
  }
}

/// Sets to -inf the logit of every token `sequences` ban after output_ids (for_each_banned_token), in place.
/// logits: [vocab] fp32. Throws ssmserve::Error when a banned id is outside [0, vocab).
void apply_bad_words(std::span<float> logits, std::span<const std::vector<int>> sequences,
                     std::span<const int> output_ids);

}  // namespace ssmserve
